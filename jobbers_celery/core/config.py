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

from jobbers_celery.core.codec import parse_keys, require_backend
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.redaction import DEFAULT_REDACT_KEYS

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
    #: Seconds a task cancelled with ``terminate=True`` gets to stop at a heartbeat before
    #: its worker interrupts it.
    cancel_grace: float = 10.0
    #: Seconds the process that reports the cluster-wide metric gauges keeps that role
    #: without collecting; set it above the metric reader's collection interval.
    metrics_gauge_lease: float = 120.0
    #: Size in bytes of a task's payload (args, kwargs and publish options as JSON) above
    #: which its first publish logs a warning; 0: never warn.
    payload_warn_bytes: int = 256 * 1024
    #: Substrings of argument keys and parameter names whose values are shown redacted in
    #: Celery's ``argsrepr``/``kwargsrepr`` (worker logs, task events, Flower) and in
    #: exception messages (case-insensitive; see :mod:`jobbers_celery.core.redaction`).
    redact_keys: tuple[str, ...] = DEFAULT_REDACT_KEYS
    #: Keys that seal task arguments where jobbers keeps them (record, outbox, dead-letter
    #: sinks, spool), each ``"<id>:<base64 of 32 bytes>"``: the first seals, all open (see
    #: :mod:`jobbers_celery.core.codec`, ``docs/howto/encryption.md``); empty: kept in clear.
    #: Never shown in a repr.
    payload_keys: tuple[str, ...] = field(default=(), repr=False)

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
                     "metrics_gauge_lease"):
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
        keys: object = self.redact_keys  # a list from a settings file is fine too
        if (not isinstance(keys, list | tuple)
                or not all(isinstance(k, str) and k for k in keys)):
            raise ConfigurationError(
                f"jobbers_redact_keys must be a list of non-empty strings, got {keys!r}")
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
        if not isinstance(self.dead_letter_sink, str) or "." not in self.dead_letter_sink:
            raise ConfigurationError(
                f"jobbers_dead_letter_sink must be a dotted path, got {self.dead_letter_sink!r}"
            )
