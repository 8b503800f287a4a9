"""The alert service on the Jobbers root: ``emit`` hands an event over and returns at once.

Sources call :meth:`Alerts.emit` from a task's hot path, the cleaner's pass or a signal
handler: it never raises and never blocks. A bounded queue and one daemon thread per
process (started at the first event, again in a forked child) do the rest: match the rules
(the ``jobbers_alerts`` setting and the sources jobbers_django registers), dedupe and rate
limit across processes (a Redis mark per rule, kind and key for ``min_interval``), render
(:mod:`~jobbers_celery.alerts.render`) and deliver (webhook, email). A full queue drops the
event (counted, logged once); a receiver that fails is logged once until it answers again,
and the mark is cleared so that the next event tries again. Nothing reaches the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from functools import partial
from typing import TYPE_CHECKING

from jobbers_celery.alerts import links
from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.alerts.render import KEY_MAX, Rendered, email_body, render, slack_body
from jobbers_celery.alerts.webhook import WebhookError, destination_refusal, post, where
from jobbers_celery.core.alertrules import MATCH_MAX, AlertRule, parse_rules
from jobbers_celery.core.destinations import parse_networks
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.redaction import redactor
from jobbers_celery.telemetry import metrics

if TYPE_CHECKING:
    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.store.parts import AlertStore

__all__ = ["QUEUE_SIZE", "TEST_THREADS", "Alerts", "EmailSender", "RuleSource", "add_rule_source",
           "flush_all", "set_email_sender"]

log = escaped_logger("jobbers.alerts")

#: Events waiting for the delivery thread; more are dropped (counted, logged once).
QUEUE_SIZE = 1000
#: Receivers a test alert (:meth:`Alerts.send_tests`) tries at once; the others wait for a
#: thread, within the same deadline.
TEST_THREADS = 16
#: Seconds a test alert waits past ``jobbers_alert_timeout`` (each post ends within the
#: timeout by itself: the margin covers starting the threads).
_TEST_MARGIN = 0.5
#: ``(subject, body, recipients)``: jobbers_django registers Django's ``send_mail``.
EmailSender = Callable[[str, str, Sequence[str]], None]
#: Rules from elsewhere than the setting (jobbers_django: the admin's), read per event:
#: a source caches what it reads.
RuleSource = Callable[[], Iterable[AlertRule]]

_Item = tuple[str, AlertEvent, float]
_instances: weakref.WeakSet[Alerts] = weakref.WeakSet()
#: Registered for every instance of the process (jobbers_django's ``AppConfig.ready``,
#: which may run before or after ``install(app)``): see :func:`add_rule_source`.
_SOURCES: list[RuleSource] = []
_EMAIL: list[EmailSender] = []


def add_rule_source(source: RuleSource) -> None:
    """Rules read from ``source`` by every alert service of this process, besides the
    setting's (jobbers_django registers the admin's)."""
    if source not in _SOURCES:
        _SOURCES.append(source)


def set_email_sender(send: EmailSender | None) -> None:
    """How every alert service of this process sends a rule's ``emails`` (jobbers_django
    registers Django's ``send_mail``); ``None``: none."""
    _EMAIL[:] = [send] if send is not None else []


def _after_fork() -> None:  # a child has no delivery thread, and maybe a locked queue
    for alerts in list(_instances):
        alerts._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def flush_all(timeout: float = 2.0) -> bool:
    """Give every alert service of this process up to ``timeout`` seconds in all to deliver
    what it holds (a worker's process exits: its daemon thread would die with it); whether
    all of it was handled."""
    deadline = time.monotonic() + timeout
    done = True
    for alerts in list(_instances):
        done &= alerts.flush(max(0.0, deadline - time.monotonic()))
    return done


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Alerts:
    """One process's alert service of one Jobbers instance (see the module).

    ``stats`` counts what happened: ``emitted``, ``dropped`` (queue full), ``matched``,
    ``suppressed`` (dedupe / rate limit), ``sent``, ``failed`` (a delivery); ``dropped``,
    ``suppressed``, ``sent`` and ``failed`` also go to the ``alerts`` metric (by ``kind``
    and ``outcome``).
    """

    def __init__(self, store: AlertStore | None = None, config: JobbersConfig | None = None,
                 *, queue_size: int = QUEUE_SIZE) -> None:
        self._store = store
        self._admin_url = config.admin_url if config is not None else ""
        self._timeout = config.alert_timeout if config is not None else 5.0
        self._redactor = redactor(tuple(config.redact_keys) if config is not None else None)
        self._allow = (parse_networks(config.alert_webhook_allow_networks)
                       if config is not None else ())
        self._rules = parse_rules(config.alerts) if config is not None else ()
        self._sources: list[RuleSource] = []
        self._email: EmailSender | None = None
        self._queue_size = queue_size
        self.stats: Counter[str] = Counter()
        self._failing: set[str] = set()
        self._local_marks: dict[str, float] = {}
        self._start_lock = threading.Lock()
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._queue: queue.Queue[_Item] = queue.Queue(self._queue_size)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._full_logged = False

    # ------------------------------------------------------------------ configuration
    def add_rule_source(self, source: RuleSource) -> None:
        """Rules read from ``source`` too, by this instance only (the module's
        :func:`add_rule_source` registers one for every instance)."""
        self._sources.append(source)

    def set_email_sender(self, send: EmailSender | None) -> None:
        """How this instance sends a rule's ``emails`` (else the process's, see
        :func:`set_email_sender`)."""
        self._email = send

    @property
    def admin_url(self) -> str:
        return self._admin_url

    def rules(self) -> list[AlertRule]:
        """The rules now: the setting's, then each source's (a source that fails is left
        out, logged)."""
        found = list(self._rules)
        for source in (*self._sources, *_SOURCES):
            try:
                found += list(source())
            except Exception as exc:  # noqa: BLE001 - a rule source never stops the others
                self._log_once(f"source {source!r}", "could not read alert rules from %s: %s",
                               source, exc)
            else:
                self._recovered(f"source {source!r}")
        return found

    # ------------------------------------------------------------------ sources
    def emit(self, event: AlertEvent) -> None:
        """Hand ``event`` over for delivery; never raises, never blocks."""
        self._put(("event", event, time.time()))

    def dead_lettered(self, task_name: str, group: str | None = None,
                      link: str | None = None) -> None:
        """Count one dead letter of ``task_name`` (in failure group ``group``, whose page
        is ``link``) for the dead-letter-rate rules; never raises, never blocks. The root
        counts every dead letter by task name; a sink that groups failures (jobbers_django)
        counts it again with its group, for the rules that name a group."""
        self._put(("dead", AlertEvent(AlertKind.DEAD_LETTER_RATE, group or task_name, "", "",
                                      link, task_name, group), time.time()))

    def _put(self, item: _Item) -> None:
        try:
            if not self._rules and not self._sources and not _SOURCES:
                return  # nothing could match: not even a thread
            self.stats["emitted"] += 1
            self._ensure_thread()
            self._queue.put_nowait(item)
        except queue.Full:
            self._tally("dropped", item[1].kind)
            if not self._full_logged:
                self._full_logged = True
                log.warning("alerts: %d events wait for delivery; dropping new ones (a slow "
                            "receiver?)", self._queue_size)
        except Exception:  # noqa: BLE001 - an alert never affects its caller
            self._tally("dropped", item[1].kind)

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="jobbers-alerts",
                                                daemon=True)
                self._thread.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event handed over so far is handled; whether it was in time
        (tests and short scripts; a worker never needs it)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def refusal(self, url: str) -> str | None:
        """Why a post to ``url`` would be refused now (its host looked up within
        ``jobbers_alert_timeout``: a non-public address outside
        ``jobbers_alert_webhook_allow_networks``); ``None``: it would not be (the admin's
        form; each send checks again)."""
        return destination_refusal(url, self._allow, self._timeout)

    def send_test(self, rule: AlertRule) -> list[str]:
        """:meth:`send_tests` of one rule: what failed, one line each."""
        return self.send_tests([rule])[rule.name]

    def send_tests(self, rules: Sequence[AlertRule]) -> dict[str, list[str]]:
        """Send a test alert through every receiver of ``rules`` now (the admin's "Send a
        test alert"), bypassing dedupe; per rule name, what failed, one line each.

        Bounded, whatever the rules: the receivers are tried at once (up to
        :data:`TEST_THREADS` threads) and the caller waits ``jobbers_alert_timeout`` (plus
        half a second) in all. A webhook post ends within the timeout by itself (one
        deadline for the whole post); an email its backend still sends then is reported as
        still going, and its outcome logged when it ends."""
        jobs: list[tuple[str, str, Callable[[], object]]] = []
        for rule in rules:
            event = AlertEvent(rule.kind, "test", f"Test alert of rule {rule.name}",
                               f"A test of the jobbers alert rule {rule.name} ({rule.kind}).",
                               links.LIVE)
            alert = render(event, rule.name, self._redactor, self._admin_url)
            body = slack_body(alert) if rule.webhooks else {}
            jobs += [(rule.name, f"webhook {where(url)}",
                      partial(post, url, body, self._timeout, self._allow))
                     for url in rule.webhooks]
            if rule.emails:
                jobs.append((rule.name, "email", partial(self._test_email, alert, rule.emails)))
        failures: dict[str, list[str]] = {rule.name: [] for rule in rules}
        if not jobs:
            return failures
        budget = self._timeout + _TEST_MARGIN
        lock = threading.Lock()
        outcomes: dict[int, str | None] = {}
        waited: list[bool] = [True]

        def run(n: int, name: str, target: str, call: Callable[[], object]) -> None:
            try:
                call()
                text = None
            except Exception as exc:  # noqa: BLE001 - reported to the operator
                text = (str(exc) if isinstance(exc, WebhookError)
                        else f"{target}: {type(exc).__name__}: {str(exc)[:200]}")
            with lock:
                if waited[0]:
                    outcomes[n] = text
                    return
            if text is None:
                log.info("alerts: the test alert of rule %s went through %s (after the "
                         "admin stopped waiting)", name, target)
            else:
                log.warning("alerts: the test alert of rule %s failed (after the admin "
                            "stopped waiting): %s", name, text[:300])

        pool = ThreadPoolExecutor(max_workers=min(len(jobs), TEST_THREADS),
                                  thread_name_prefix="jobbers-alert-test")
        futures = [pool.submit(run, n, *job) for n, job in enumerate(jobs)]
        wait(futures, timeout=budget)
        with lock:
            waited[0] = False
            seen = dict(outcomes)
        pool.shutdown(wait=False, cancel_futures=True)
        for n, (name, target, _) in enumerate(jobs):
            if n in seen:
                if seen[n] is not None:
                    failures[name].append(str(seen[n]))
            elif futures[n].cancelled():
                failures[name].append(f"{target}: not tried: the test's {budget:g} s ran out "
                                      f"({TEST_THREADS} receivers are tried at once)")
            else:
                failures[name].append(f"{target}: no outcome within {budget:g} s (it goes on "
                                      "in the background; its outcome is logged)")
        return failures

    def _test_email(self, alert: Rendered, emails: Sequence[str]) -> None:
        send = self._email or (_EMAIL[0] if _EMAIL else None)
        if send is None:
            raise LookupError("no email sender is set")
        send(*email_body(alert), emails)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        q = self._queue
        while True:
            what, event, at = q.get()
            try:
                if what == "dead":
                    self._count(event, at)
                else:
                    self._handle(event, at)
            except Exception:
                log.exception("alerts: could not handle a %s event", what)
            finally:
                q.task_done()

    def _handle(self, event: AlertEvent, at: float) -> None:
        for rule in self.rules():
            if rule.matches(str(event.kind), event.key, event.task_name, event.group):
                try:  # one rule's fault never keeps the alert from the rules after it
                    self._send(rule, event, at)
                except Exception:  # noqa: BLE001
                    self._log_once(f"rule {rule.name}", "alerts: rule %s could not be sent",
                                   rule.name)

    def _count(self, seen: AlertEvent, at: float) -> None:
        """One dead letter against each dead-letter-rate rule it counts for."""
        name, group = seen.task_name or "", seen.group
        for rule in self.rules():
            if not rule.enabled or rule.kind is not AlertKind.DEAD_LETTER_RATE:
                continue
            if rule.group is not None:
                if group != rule.group:
                    continue
                scope, what = group, f"failure group {group}"
            elif group is not None:
                continue  # counted once already, by task name
            elif rule.task is not None:
                if not fnmatchcase(name[:MATCH_MAX], rule.task):
                    continue
                scope, what = name, name
            else:
                scope, what = "*", "all tasks"
            window_ms = int(rule.window * 1000)
            bucket = int(at * 1000) // window_ms
            count = self._counted(_digest(rule.name, scope[:KEY_MAX], str(bucket)),
                                  2 * window_ms)
            if count is None or count < (rule.threshold or 1):
                continue
            link = seen.link if rule.group is not None else (
                links.dead_letters_of(name) if rule.task is not None else links.LIVE)
            self._send(rule, AlertEvent(
                AlertKind.DEAD_LETTER_RATE, scope,
                f"{count} dead letters of {what} within {rule.window:g} s",
                f"Rule {rule.name}: {rule.threshold} or more dead letters within "
                f"{rule.window:g} s (latest: {name}).", link, name, group), at)

    def _counted(self, digest: str, ttl_ms: int) -> int | None:
        if self._store is None:
            return None
        try:
            count = self._store.alert_count(digest, ttl_ms)
        except Exception as exc:  # noqa: BLE001
            self._log_once("store", "alerts: the store is unreachable (%s); dead-letter "
                           "rates are not counted meanwhile", exc)
            return None
        self._recovered("store")
        return count

    def _mark(self, digest: str, ttl_ms: int, ongoing: bool) -> bool:
        """Whether this process sends the alert ``digest`` (no other did within ``ttl_ms``);
        an ongoing condition extends the mark it finds. Without the store: per process."""
        try:
            if self._store is None:
                raise LookupError("no store")
            if self._store.alert_mark(digest, ttl_ms):
                return True
            if ongoing:
                self._store.alert_extend(digest, ttl_ms)
            return False
        except Exception as exc:  # noqa: BLE001 - dedupe per process meanwhile
            if self._store is not None:
                self._log_once("store", "alerts: the store is unreachable (%s); alerts are "
                               "deduplicated per process meanwhile", exc)
            now = time.monotonic()
            if len(self._local_marks) > 10_000:
                self._local_marks = {k: v for k, v in self._local_marks.items() if v > now}
            if self._local_marks.get(digest, 0.0) > now:
                if ongoing:
                    self._local_marks[digest] = now + ttl_ms / 1000
                return False
            self._local_marks[digest] = now + ttl_ms / 1000
            return True

    def _unmark(self, digest: str) -> None:
        self._local_marks.pop(digest, None)
        if self._store is not None:
            with contextlib.suppress(Exception):  # the mark expires by itself
                self._store.alert_unmark(digest)

    def _send(self, rule: AlertRule, event: AlertEvent, at: float) -> None:
        self.stats["matched"] += 1
        digest = _digest(rule.name, str(event.kind), event.key[:KEY_MAX])
        if not self._mark(digest, int(rule.min_interval * 1000), event.ongoing):
            self._tally("suppressed", event.kind)
            return
        alert = render(event, rule.name, self._redactor, self._admin_url,
                       datetime.fromtimestamp(at, UTC))
        delivered = False
        body = slack_body(alert) if rule.webhooks else {}
        for url in rule.webhooks:
            delivered |= self._deliver(f"webhook {where(url)}", partial(
                post, url, body, self._timeout, self._allow), event.kind)
        if rule.emails:
            delivered |= self._send_email(rule, alert, event.kind)
        if not delivered:
            self._unmark(digest)  # nobody was told: the next event tries again

    def _send_email(self, rule: AlertRule, alert: Rendered, kind: str) -> bool:
        send = self._email or (_EMAIL[0] if _EMAIL else None)
        if send is None:
            self._log_once("email", "alert rule %s has emails but no email sender is set "
                           "(jobbers_django sets Django's send_mail)", rule.name)
            return False
        subject, body = email_body(alert)
        return self._deliver("email", lambda: send(subject, body, rule.emails), kind)

    def _tally(self, outcome: str, kind: str) -> None:
        """Count an outcome: in ``stats`` and the ``alerts`` metric (by kind and outcome)."""
        self.stats[outcome] += 1
        metrics.alert(str(kind), outcome)

    def _deliver(self, target: str, call: Callable[[], object], kind: str) -> bool:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a receiver never affects anything else
            self._tally("failed", kind)
            text = str(exc) if isinstance(exc, WebhookError) else f"{type(exc).__name__}: {exc}"
            self._log_once(target, "alerts: %s failed: %s (logged once until it works "
                           "again)", target, text[:300])
            return False
        self._tally("sent", kind)
        self._recovered(target)
        return True

    def _log_once(self, target: str, message: str, *args: object) -> None:
        if target not in self._failing:
            self._failing.add(target)
            log.warning(message, *args)

    def _recovered(self, target: str) -> None:
        if target in self._failing:
            self._failing.discard(target)
            log.info("alerts: %s works again", target)
