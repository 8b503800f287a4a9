"""Alerts with Django: the admin's rules, email through Django, and what the failure groups
tell (a new group; each stored failure, for the dead-letter-rate rules that name a group).

:func:`register` (``AppConfig.ready``) hands jobbers_celery's alert services of this process
the admin's rules (:class:`AdminRules`, read at most every :data:`CACHE_SECONDS`) and
Django's ``send_mail`` (``EMAIL_*`` settings; ``EMAIL_TIMEOUT`` bounds a send). Rules still
come from the ``jobbers_alerts`` setting as well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connection

from jobbers_celery import (
    AlertEvent,
    AlertKind,
    AlertRule,
    ConfigurationError,
    add_rule_source,
    escaped_logger,
    set_email_sender,
)

if TYPE_CHECKING:
    from jobbers_celery import Alerts, DeadLetter

__all__ = ["CACHE_SECONDS", "AdminRules", "admin_rules", "failure_stored", "group_entries",
           "group_page", "register", "send_email"]

log = escaped_logger("jobbers.django.alerts")

#: Seconds a process keeps the admin's rules before reading them again (a save in this
#: process reads them at once).
CACHE_SECONDS = 10.0
#: Characters of an exception message an alert quotes (the renderer bounds it again).
_MESSAGE_MAX = 500


def group_page(pk: int) -> str:
    """A failure group's admin page, under the admin's root (``jobbers_admin_url``)."""
    return f"jobbers/failuregroup/{int(pk)}/change/"


def group_entries(fingerprint: str) -> str:
    """The dead letters of one failure group, under the admin's root."""
    return f"jobbers/deadletterentry/?fingerprint={fingerprint}"


class AdminRules:
    """The enabled ``AlertRule`` rows as jobbers_celery rules (a row that is not a valid
    rule, saved before a check existed or edited in the database, is left out, logged)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._rules: list[AlertRule] = []

    def invalidate(self) -> None:
        self._read_at = float("-inf")

    def __call__(self) -> list[AlertRule]:
        if time.monotonic() - self._read_at < CACHE_SECONDS:
            return self._rules
        with self._lock:
            if time.monotonic() - self._read_at < CACHE_SECONDS:
                return self._rules
            from jobbers_django.models import AlertRule as AlertRuleRow

            try:
                rows = list(AlertRuleRow.objects.filter(enabled=True)[:1000])
            finally:
                if not connection.in_atomic_block:  # the alert thread holds no connection
                    connection.close()
            rules = []
            for row in rows:
                try:
                    rules.append(row.as_rule())
                except ConfigurationError as exc:
                    log.warning("alert rule %s left out: %s", row.pk, exc)
            self._rules, self._read_at = rules, time.monotonic()
            return rules


admin_rules = AdminRules()


def send_email(subject: str, body: str, recipients: Sequence[str]) -> None:
    """One alert by Django's email (its backend and ``EMAIL_*`` settings)."""
    from django.core.mail import send_mail

    send_mail(subject, body, None, list(recipients), fail_silently=False)


def register() -> None:
    """Give this process's alert services the admin's rules and Django's email."""
    add_rule_source(admin_rules)
    set_email_sender(send_email)


def failure_stored(alerts: Alerts, entry: DeadLetter, fingerprint: str,
                   new_group: int | None) -> None:
    """The sink stored a failure of group ``fingerprint`` (``new_group``: the group's id
    when this failure created it). Never raises: the failure is stored."""
    try:
        alerts.dead_lettered(entry.name, group=fingerprint, link=group_entries(fingerprint))
        if new_group is None:
            return
        what = entry.exception_type or f"({entry.reason})"
        message = (entry.exception_message or "")[:_MESSAGE_MAX]
        alerts.emit(AlertEvent(
            AlertKind.NEW_FAILURE_GROUP, fingerprint, f"New failure group: {entry.name}: {what}",
            f"{what}: {message}\nFirst failure: task {entry.task_id} (attempt {entry.attempt}, "
            f"{entry.reason}) on {entry.worker or 'no worker'}.",
            group_page(new_group), entry.name, fingerprint))
    except Exception:  # an alert never affects the dead letter
        log.warning("could not hand the alerts a stored failure of %s", entry.task_id,
                    exc_info=True)


def rule_saved(**_: Any) -> None:
    """A rule saved or deleted in this process: read the rules again at the next event."""
    admin_rules.invalidate()
