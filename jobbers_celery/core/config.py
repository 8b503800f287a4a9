"""Library-wide settings, read once from ``app.conf`` (``jobbers_*`` keys). Pure.

Django projects that load Celery settings with ``namespace="CELERY"`` write
``CELERY_JOBBERS_*``; Celery hands them to us as ``jobbers_*``. No environment variables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from jobbers_celery.core.alertrules import parse_rules
from jobbers_celery.core.codec import parse_keys, require_backend
from jobbers_celery.core.destinations import parse_networks
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.redaction import DEFAULT_REDACT_KEYS, redactor
from jobbers_celery.core.search import SCAN_LIMIT, ArgumentIndex

__all__ = ["DEFAULT_SHARDS", "DEFAULT_SINK", "MAX_SHARDS", "JobbersConfig"]

DEFAULT_SINK = "jobbers_celery.sinks.RedisDeadLetterSink"
#: Shards of a new dataset on Redis Cluster (``jobbers_store_shards`` unset): enough to
#: spread over 16 masters, few enough that a fan-out (a liveness refresh, the cleaner's
#: scan, counts) stays short.
DEFAULT_SHARDS = 16
MAX_SHARDS = 256
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: Broker URL schemes whose URL (and transport options) the state store can take over.
_REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel"})
#: The most records ``jobbers_search_scan_limit`` lets a search read.
MAX_SCAN = 1_000_000


@dataclass(frozen=True, slots=True)
class JobbersConfig:
    """Every ``jobbers_*`` setting with its default."""

    #: Where lifecycle state lives; defaults to the broker URL when the broker is Redis.
    redis_url: str = ""
    #: Options of the state store's connection, in kombu's transport-options form
    #: (``master_name`` for Sentinel, ...); default: ``broker_transport_options`` when
    #: ``redis_url`` is taken from the broker.
    redis_transport_options: Mapping[str, Any] = field(default_factory=dict)
    #: TLS options of the state store's connection, in Celery's ``broker_use_ssl`` form;
    #: default: ``broker_use_ssl`` when ``redis_url`` is taken from the broker.
    redis_use_ssl: Mapping[str, Any] | bool | None = None
    #: Namespace of every key; wrapped in a hash tag so scripts run on Redis Cluster.
    key_prefix: str = "jobbers"
    #: Shards the state store's keys spread over (each a hash tag: a Redis Cluster slot),
    #: fixed per dataset at its first use; ``None``: the dataset's own, else, for a new one,
    #: 16 on Redis Cluster and 1 on a single server (1 also for a dataset written before
    #: shards existed). A value that differs from the dataset's is refused at first use
    #: (see ``docs/reference/redis.md``).
    store_shards: int | None = None
    #: Seconds between cleaner passes (scheduled by celery beat).
    cleaner_interval: float = 10.0
    #: Queue the cleaner's beat task goes to (``jobbers_cleaner_queue="jobbers"``, consumed
    #: by ``celery worker -Q celery,jobbers``), so that a backlog on the default queue never
    #: holds its passes back; empty: the default queue, as any task.
    cleaner_queue: str = ""
    #: Seconds after its slot within which a periodic task's run must start (else it is
    #: late) and beat must have published it (else the slot is missed).
    periodic_tolerance: float = 10.0
    #: Seconds between the workers' checks for missed periodic slots (one worker at a time).
    periodic_check_interval: float = 5.0
    #: Runs (and missed slots) kept per periodic schedule, newest first.
    periodic_keep_runs: int = 50
    #: Seconds without a sign of life after which a worker's started tasks are stalled.
    worker_lost_after: float = 60.0
    #: Seconds that terminal records (and their history) are kept.
    retention: float = 7 * 24 * 3600.0
    #: Dotted path of the dead-letter sink factory, called with the ``Jobbers`` instance.
    dead_letter_sink: str = DEFAULT_SINK
    #: Directory under which dead letters wait on local disk while neither the sink nor
    #: Redis takes them (a subdirectory per key prefix and Redis server); empty:
    #: ``~/.local/state/jobbers/dead-letters`` of the user running the process.
    dead_letter_spool: str = ""
    #: Seconds between the in-worker scheduler's polls for due delayed retries.
    scheduler_interval: float = 0.5
    #: Seconds a scheduler may take to publish what it claimed before another may re-publish.
    publish_lease: float = 30.0
    #: Seconds between a worker's reads of the pauses (a pause or resume also tells the
    #: live workers at once, with a control command; this is for those it did not reach).
    pause_poll_interval: float = 2.0
    #: Seconds a task cancelled with ``terminate=True`` gets to stop at a heartbeat before
    #: its worker interrupts it.
    cancel_grace: float = 10.0
    #: Seconds the process that reports the cluster-wide metric gauges keeps that role
    #: without collecting; set it above the metric reader's collection interval.
    metrics_gauge_lease: float = 120.0
    #: Size in bytes of a task's payload (args, kwargs and publish options as JSON) above
    #: which its first publish logs a warning; 0: never warn.
    payload_warn_bytes: int = 256 * 1024
    #: Members of a group (chunks, a chord's header) whose ``submitted`` records its publish
    #: writes in one store call, their messages held until then (see
    #: :mod:`jobbers_celery.lifecycle.bulk`); 0 or 1: one round trip per member, as a single
    #: publish. 200: 50 store calls for 10,000 members, and few messages held at a time (the
    #: garbage collector walks what the publisher holds: at 500 it cost more CPU).
    publish_batch: int = 200
    #: Days the per-minute history (throughput, runtime, queue latency, failures per task
    #: name and queue; see ``docs/howto/history.md``) is kept.
    history_days: float = 7.0
    #: Task names (and, apart, queues) the history keeps a day; later ones count under
    #: ``~other``: names come from messages, so their number is bounded.
    history_max_names: int = 200
    #: Substrings of argument keys and parameter names whose values are shown redacted in
    #: Celery's ``argsrepr``/``kwargsrepr`` (worker logs, task events, Flower) and in
    #: exception messages (case-insensitive; see :mod:`jobbers_celery.core.redaction`).
    redact_keys: tuple[str, ...] = DEFAULT_REDACT_KEYS
    #: Keys that seal task arguments where jobbers keeps them (record, outbox, dead-letter
    #: sinks, spool), each ``"<id>:<base64 of 32 bytes>"``: the first seals, all open (see
    #: :mod:`jobbers_celery.core.codec`, ``docs/howto/encryption.md``); empty: kept in clear.
    #: Never shown in a repr.
    payload_keys: tuple[str, ...] = field(default=(), repr=False)
    #: Argument paths indexed at publish, per task name (``"*"``: every task), so that
    #: ``Jobbers.search`` finds a task by their values: ``{"shop.tasks.import_order":
    #: ["order_id", "0"], "*": ["customer_id"]}`` (syntax and bounds:
    #: :mod:`jobbers_celery.core.search`; a path reading a redacted key is refused).
    indexed_arguments: Mapping[str, Any] = field(default_factory=dict)
    #: Records a search of a path that is not indexed reads at most, newest first.
    search_scan_limit: int = SCAN_LIMIT
    #: Alert rules, a list of dicts (see :mod:`jobbers_celery.core.alertrules`,
    #: ``docs/howto/alerts.md``); jobbers_django adds the admin's. Never shown in a repr
    #: (a webhook URL's path is its secret).
    alerts: tuple[Any, ...] = field(default=(), repr=False)
    #: The base URL of the Django admin (``https://ops.example.com/admin/``) alerts link
    #: their pages under; empty: alerts carry the page's path only.
    admin_url: str = ""
    #: Seconds an alert's webhook POST may take in all (name lookup, connect, TLS, send,
    #: the answer's status line) before it is given up; also how long the admin's test
    #: alert waits for an email (whose send Django's ``EMAIL_TIMEOUT`` bounds).
    alert_timeout: float = 5.0
    #: Networks an alert webhook may reach although they are not public (``["10.20.0.0/16",
    #: "fd00:1::/64"]``; ``["127.0.0.0/8"]`` for a receiver on the worker's host): without
    #: them a webhook whose address is loopback, private, link-local, multicast, reserved
    #: or otherwise not global is refused (see :mod:`jobbers_celery.core.destinations`).
    alert_webhook_allow_networks: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any], broker_url: str | None = None) -> JobbersConfig:
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = f"jobbers_{f.name}"
            if conf.get(key) is not None:
                values[f.name] = conf[key]
        if not values.get("redis_url"):
            if broker_url and broker_url.split("://", 1)[0] in _REDIS_SCHEMES:
                values["redis_url"] = broker_url
                # the broker's connection options go with its URL
                for ours, celerys in (("redis_transport_options", "broker_transport_options"),
                                      ("redis_use_ssl", "broker_use_ssl")):
                    if ours not in values and conf.get(celerys) is not None:
                        values[ours] = conf[celerys]
            else:
                raise ConfigurationError(
                    "jobbers needs Redis: set jobbers_redis_url (CELERY_JOBBERS_REDIS_URL in "
                    "Django) or use a redis://, rediss:// or sentinel:// broker URL"
                )
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if not isinstance(self.redis_url, str) or "://" not in self.redis_url:
            raise ConfigurationError(f"jobbers_redis_url is not a URL: {self.redis_url!r}")
        if not isinstance(self.key_prefix, str) or not _PREFIX_RE.match(self.key_prefix):
            raise ConfigurationError(
                "jobbers_key_prefix must be 1-64 letters, digits or _.- "
                f"(no braces), got {self.key_prefix!r}"
            )
        for name in ("cleaner_interval", "worker_lost_after", "retention",
                     "scheduler_interval", "publish_lease", "cancel_grace",
                     "periodic_tolerance", "periodic_check_interval",
                     "pause_poll_interval",
                     "metrics_gauge_lease", "alert_timeout"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise ConfigurationError(f"jobbers_{name} must be a number > 0, got {value!r}")
        shards = self.store_shards
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                                   or not 1 <= shards <= MAX_SHARDS):
            raise ConfigurationError(
                f"jobbers_store_shards must be a whole number from 1 to {MAX_SHARDS} (or "
                f"None: the dataset's own), got {shards!r}")
        warn = self.payload_warn_bytes
        if isinstance(warn, bool) or not isinstance(warn, int) or warn < 0:
            raise ConfigurationError(
                "jobbers_payload_warn_bytes must be a whole number of bytes >= 0 (0: never "
                f"warn), got {self.payload_warn_bytes!r}"
            )
        days = self.history_days
        if (isinstance(days, bool) or not isinstance(days, int | float)
                or not math.isfinite(days) or not 0 < days <= 90):
            raise ConfigurationError(
                f"jobbers_history_days must be a number of days > 0 and <= 90, got {days!r}")
        most = self.history_max_names
        if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= 10_000:
            raise ConfigurationError(
                "jobbers_history_max_names must be a whole number from 1 to 10000, got "
                f"{most!r}")
        keep = self.periodic_keep_runs
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= 1000:
            raise ConfigurationError(
                f"jobbers_periodic_keep_runs must be a whole number from 1 to 1000, got {keep!r}")
        queue = self.cleaner_queue
        if not isinstance(queue, str) or len(queue) > 200:
            raise ConfigurationError(
                "jobbers_cleaner_queue must be a queue name (empty: the default queue), "
                f"got {queue!r:.80}")
        batch = self.publish_batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ConfigurationError(
                "jobbers_publish_batch must be a whole number of members >= 0 (0: no "
                f"batching), got {batch!r}")
        keys: object = self.redact_keys  # a list from a settings file is fine too
        if (not isinstance(keys, list | tuple)
                or not all(isinstance(k, str) and k for k in keys)):
            raise ConfigurationError(
                f"jobbers_redact_keys must be a list of non-empty strings, got {keys!r}")
        ArgumentIndex.from_setting(self.indexed_arguments, redactor(tuple(keys)))
        scan = self.search_scan_limit
        if isinstance(scan, bool) or not isinstance(scan, int) or not 1 <= scan <= MAX_SCAN:
            raise ConfigurationError(
                f"jobbers_search_scan_limit must be a whole number of records from 1 to "
                f"{MAX_SCAN:,}, got {scan!r}")
        if parse_keys(self.payload_keys):  # names a bad key by position, never quotes it
            require_backend()
        if not isinstance(self.redis_transport_options, Mapping):
            raise ConfigurationError(
                "jobbers_redis_transport_options must be a dict, "
                f"got {self.redis_transport_options!r}"
            )
        if (self.redis_url.startswith("sentinel://")
                and not self.redis_transport_options.get("master_name")):
            raise ConfigurationError(
                "a sentinel:// jobbers_redis_url needs the master's name: set "
                "{'master_name': ...} in jobbers_redis_transport_options (or in "
                "broker_transport_options when the URL is the broker's)"
            )
        if self.redis_use_ssl is not None and not isinstance(self.redis_use_ssl, bool | Mapping):
            raise ConfigurationError(
                f"jobbers_redis_use_ssl must be a dict or a bool, got {self.redis_use_ssl!r}"
            )
        if not isinstance(self.dead_letter_spool, str):
            raise ConfigurationError(
                "jobbers_dead_letter_spool must be a directory path (a string; empty: the "
                f"default), got {self.dead_letter_spool!r}"
            )
        # each rule named in the message that refuses it; a webhook to a non-public
        # address (as written: a name is checked at each send) refused here already
        parse_rules(self.alerts, allow=parse_networks(self.alert_webhook_allow_networks))
        if not isinstance(self.admin_url, str) or (
                self.admin_url and not re.match(r"^https?://[^\s]+$", self.admin_url)):
            raise ConfigurationError(
                "jobbers_admin_url must be the admin's http:// or https:// URL (empty: none), "
                f"got {self.admin_url!r:.80}")
        if not isinstance(self.dead_letter_sink, str) or "." not in self.dead_letter_sink:
            raise ConfigurationError(
                f"jobbers_dead_letter_sink must be a dotted path, got {self.dead_letter_sink!r}"
            )
