"""Alerts: rules an operator sets, deduplicated and rate-limited, delivered by webhook and
email off the hot path (see docs/howto/alerts.md)."""

from __future__ import annotations

from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.alerts.links import admin_task_id
from jobbers_celery.alerts.service import Alerts, add_rule_source, set_email_sender
from jobbers_celery.core.alertrules import AlertRule, parse_rule, parse_rules

__all__ = ["AlertEvent", "AlertKind", "AlertRule", "Alerts", "add_rule_source", "admin_task_id",
           "parse_rule", "parse_rules", "set_email_sender"]
