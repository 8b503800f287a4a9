"""Alert rules: what an operator wants to be told, and whom to tell. Pure.

A rule names one kind of event (:class:`AlertKind`), optionally narrowed to a task name
(a glob), a failure group (its fingerprint) or a schedule (a glob on a periodic task's
name); where it goes (webhook URLs, email addresses); and how often at most
(``min_interval``: one alert per rule, kind and thing within it, the rate limit and the
dedupe window at once). A dead-letter-rate rule also has a ``threshold`` of dead letters
per ``window`` seconds.

Rules come from the Celery setting ``jobbers_alerts`` (a list of dicts, checked here with
messages that name the rule and field) and, with jobbers_django, from the admin; both are
this one value type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from jobbers_celery.core.destinations import SETTING, Network, host_refusal
from jobbers_celery.core.errors import ConfigurationError

__all__ = ["MATCH_MAX", "AlertKind", "AlertRule", "parse_rule", "parse_rules"]

#: Characters of a task name, group or key a rule's pattern is matched against (they come
#: from messages: bounded before the glob runs).
MATCH_MAX = 512
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
_EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,255}$")
_FIELDS = frozenset({"name", "kind", "task", "group", "schedule", "threshold", "window",
                     "webhooks", "emails", "min_interval", "enabled"})


class AlertKind(StrEnum):
    """What happened. The values are the ones rules name in settings and in the admin."""

    NEW_FAILURE_GROUP = "new_failure_group"
    DEAD_LETTER_RATE = "dead_letter_rate"
    STALL = "stall"
    CLEANER_OVERDUE = "cleaner_overdue"
    PERIODIC_MISSED = "periodic_missed"
    PERIODIC_LATE = "periodic_late"
    PERIODIC_OVERLAP = "periodic_overlap"
    STORE_EMPTIED = "store_emptied"
    QUEUE_PAUSED = "queue_paused"


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One rule (see the module). ``name`` identifies it: its alerts are deduplicated
    under it, so renaming a rule starts its rate limit over."""

    name: str
    kind: AlertKind
    task: str | None = None
    group: str | None = None
    schedule: str | None = None
    threshold: int | None = None
    window: float = 300.0
    webhooks: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    min_interval: float = 600.0
    enabled: bool = True

    def matches(self, kind: str, key: str, task_name: str | None,
                group: str | None) -> bool:
        """Whether an event of ``kind`` about ``key`` (of ``task_name``, in ``group``) is
        this rule's. A narrowing the event cannot answer (no task name) does not match."""
        if not self.enabled or kind != self.kind:
            return False
        if self.task is not None and (
                task_name is None or not fnmatchcase(task_name[:MATCH_MAX], self.task)):
            return False
        if self.group is not None and group != self.group:
            return False
        return self.schedule is None or fnmatchcase(key[:MATCH_MAX], self.schedule)


def _text(where: str, value: object, limit: int = 255) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigurationError(f"{where} must be a string of at most {limit} characters, "
                                 f"got {value!r:.80}")
    return value


def _number(where: str, value: object, minimum: float) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < minimum):
        raise ConfigurationError(f"{where} must be a number of seconds >= {minimum:g}, "
                                 f"got {value!r:.80}")
    return float(value)


def _strings(where: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigurationError(f"{where} must be a list of strings, got {value!r:.80}")
    return tuple(value)


def parse_rule(raw: Mapping[str, Any], where: str = "alert rule",
               allow: Sequence[Network] | None = None) -> AlertRule:
    """One rule from its dict form; :class:`ConfigurationError` naming ``where`` and the
    field if it is not one. With ``allow`` (the networks internal receivers may be in), a
    webhook whose host is a non-public address or a ``localhost`` name is refused too
    (what the host says by itself: a name is checked once resolved, at each send)."""
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a dict, got {raw!r:.80}")
    unknown = sorted(str(k) for k in raw if k not in _FIELDS)
    if unknown:
        raise ConfigurationError(f"{where} has unknown field(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(sorted(_FIELDS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(f"{where}.name must be 1-100 letters, digits or _.:- "
                                 f"(it identifies the rule), got {name!r:.80}")
    where = f"{where} {name!r}"
    try:
        kind = AlertKind(str(raw.get("kind")))
    except ValueError:
        raise ConfigurationError(
            f"{where}.kind must be one of {', '.join(k.value for k in AlertKind)}, "
            f"got {raw.get('kind')!r:.80}") from None
    webhooks = _strings(f"{where}.webhooks", raw.get("webhooks"))
    for url in webhooks:
        if not re.match(r"^https?://[^\s/]+\S*$", url) or len(url) > 2000 \
                or not _host_and_port(url):
            # the URL itself is never quoted: a Slack webhook's path is its secret
            raise ConfigurationError(f"{where}.webhooks: each must be an http:// or https:// "
                                     "URL of at most 2000 characters")
        if allow is not None:
            why = host_refusal(urlsplit(url).hostname or "", allow)
            if why is not None:  # the host only: the path may be a secret
                raise ConfigurationError(
                    f"{where}.webhooks: {why} is not a public destination; alerts go to "
                    f"public addresses only unless {SETTING} names its network")
    emails = _strings(f"{where}.emails", raw.get("emails"))
    for address in emails:
        if not _EMAIL_RE.match(address):
            raise ConfigurationError(f"{where}.emails: {address!r:.80} is not an address")
    if not webhooks and not emails:
        raise ConfigurationError(f"{where} needs somewhere to send: webhooks and/or emails")
    threshold = raw.get("threshold")
    if kind is AlertKind.DEAD_LETTER_RATE:
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ConfigurationError(f"{where}.threshold must be a whole number >= 1 of dead "
                                     f"letters per window, got {threshold!r:.80}")
    elif threshold is not None:
        raise ConfigurationError(f"{where}.threshold is for dead_letter_rate rules only")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigurationError(f"{where}.enabled must be True or False, got {enabled!r:.80}")
    return AlertRule(
        name=name, kind=kind, task=_text(f"{where}.task", raw.get("task")),
        group=_text(f"{where}.group", raw.get("group"), 64),
        schedule=_text(f"{where}.schedule", raw.get("schedule")), threshold=threshold,
        window=_number(f"{where}.window", raw.get("window", 300.0), 1.0),
        webhooks=webhooks, emails=emails,
        min_interval=_number(f"{where}.min_interval", raw.get("min_interval", 600.0), 1.0),
        enabled=enabled)


def parse_rules(raw: object, setting: str = "jobbers_alerts",
                allow: Sequence[Network] | None = None) -> tuple[AlertRule, ...]:
    """The rules of ``setting`` (a list of dicts), each checked (destinations too, given
    ``allow``: see :func:`parse_rule`); names must be unique."""
    if raw is None:
        return ()
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise ConfigurationError(f"{setting} must be a list of dicts, got {raw!r:.80}")
    rules = tuple(parse_rule(r, f"{setting}[{n}]", allow) for n, r in enumerate(raw))
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise ConfigurationError(f"{setting}: two rules are named {rule.name!r}")
        seen.add(rule.name)
    return rules


def _host_and_port(url: str) -> bool:
    """A host, and a port in range if one is given (``urlsplit(url).port`` raises for
    ``:99999``: refused here, not at every delivery)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range
    except ValueError:
        return False
    return bool(parts.hostname)
