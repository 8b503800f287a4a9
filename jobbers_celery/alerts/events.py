"""What an alert is about: the one value every source hands to ``jobbers.alerts.emit``.

A source (the dead-letter sink's new failure group, the cleaner's stall report, the beat
watch's missed run...) knows *what* happened; the rules (:mod:`jobbers_celery.alerts.rules`)
decide who is told, how often. ``key`` names the thing the alert is about within its kind
(a failure group's fingerprint, a task name, a schedule's name): alerts of one
(rule, kind, key) are deduplicated and rate-limited together, so it must stay the same
for the same thing and never hold a timestamp or a count.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobbers_celery.core.alertrules import AlertKind

__all__ = ["AlertEvent", "AlertKind"]


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One thing worth telling someone.

    ``kind``: an :class:`AlertKind` (a plain string is taken too, for a kind of one's own).
    ``key``: what the event is about within its kind (dedupe and rate limit go by it).
    ``title`` and ``text``: what the person reads; untrusted (they quote task names and
    exception messages), bounded, escaped and redacted before delivery, never here.
    ``link``: the admin path or URL of the page that shows it (a path is joined to
    ``jobbers_admin_url``). ``task_name`` / ``group``: what a rule's match goes by, when
    the event concerns one task name or failure group. ``ongoing``: a condition that
    lasts (the cleaner overdue): while it keeps being reported within the rule's
    ``min_interval``, it is told once (each report extends the dedupe mark).
    """

    kind: str
    key: str
    title: str
    text: str
    link: str | None = None
    task_name: str | None = None
    group: str | None = None
    ongoing: bool = False
