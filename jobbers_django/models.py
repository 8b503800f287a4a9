"""The dead-letter queue in the database.

``DeadLetterEntry``: one row per task that ended in the DLQ, describing its last failure.
``DeadLetterFailure``: one row per failed attempt (unique per task id and attempt).
``FailureGroup``: failures that share a fingerprint, with counts kept up to date by the sink
and the services, so the groups page never aggregates the entries table.
``DeadLetterAudit``: append-only record of every resubmit, discard and cancel.
``ResubmitRun`` and ``ResubmitRunItem``: a paced resubmit (``jobbers_django.runs``) and the
entries it selected, one row each, claimed once (``published_at``) whatever races.

Indexes follow the list views: every filter of the admin changelist and of the API comes
with ``last_failed_at`` and ``id`` after it (the list order), so "filter, newest first, page
of 50" reads 50 index entries whatever the table size.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from jobbers_celery import (
    FINAL_RUN_STATUSES,
    AlertKind,
    ConfigurationError,
    human_time,
    parse_rule,
)
from jobbers_celery import AlertRule as CeleryAlertRule
from jobbers_django.fields import TaskIdField, TaskIdsField


class Reason(models.TextChoices):
    FAILED = "failed", "failed"
    STALLED = "stalled", "stalled"
    DROPPED = "dropped", "dropped"


class Status(models.TextChoices):
    DEAD = "dead", "dead"
    RESUBMITTED = "resubmitted", "resubmitted"
    DISCARDED = "discarded", "discarded"


class DeadLetterEntry(models.Model):
    task_id = TaskIdField(max_length=255, unique=True)
    task_name = models.CharField(max_length=255)
    task_version = models.IntegerField(null=True, blank=True)
    queue = models.CharField(max_length=255, blank=True, default="")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    #: what it takes to publish the task again (routing, headers, callbacks, limits)
    options = models.JSONField(default=dict, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    reason = models.CharField(max_length=16, choices=Reason.choices)
    exception_type = models.CharField(max_length=255, blank=True, default="")
    exception_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    failure_count = models.PositiveIntegerField(default=0)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    worker = models.CharField(max_length=255, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)
    retry_attempt = models.PositiveIntegerField(default=0)
    fingerprint = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DEAD)
    resubmit_count = models.PositiveIntegerField(default=0)
    resubmitted_at = models.DateTimeField(null=True, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    #: set with status=resubmitted in the same transaction, cleared once published: a row
    #: still pending after a crash is published again by ``services.publish_pending``
    publish_pending = models.BooleanField(default=False)

    class Meta:
        verbose_name = "dead-letter entry"
        verbose_name_plural = "dead-letter entries"
        ordering = ("-last_failed_at", "-id")
        default_permissions = ("view",)
        permissions = (
            ("resubmit_deadletter", "Can resubmit or discard dead-letter entries"),
            ("cancel_task", "Can cancel tasks"),
        )
        indexes = (
            models.Index(fields=["-last_failed_at", "-id"], name="jobbers_dle_recent"),
            models.Index(fields=["task_name", "-last_failed_at", "-id"],
                         name="jobbers_dle_name"),
            models.Index(fields=["task_name", "task_version", "-last_failed_at", "-id"],
                         name="jobbers_dle_name_ver"),
            models.Index(fields=["queue", "-last_failed_at", "-id"], name="jobbers_dle_queue"),
            models.Index(fields=["status", "-last_failed_at", "-id"], name="jobbers_dle_status"),
            # triage and resubmit-by-filter: the dead entries of one task, newest first
            models.Index(fields=["status", "task_name", "-last_failed_at", "-id"],
                         name="jobbers_dle_status_name"),
            models.Index(fields=["reason", "-last_failed_at", "-id"], name="jobbers_dle_reason"),
            models.Index(fields=["exception_type", "-last_failed_at", "-id"],
                         name="jobbers_dle_exc"),
            models.Index(fields=["fingerprint", "-last_failed_at", "-id"], name="jobbers_dle_fp"),
            models.Index(fields=["resubmitted_at"], name="jobbers_dle_pending",
                         condition=Q(publish_pending=True)),
        )

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}]"


class DeadLetterFailure(models.Model):
    entry = models.ForeignKey(DeadLetterEntry, on_delete=models.CASCADE,
                              related_name="failures")
    task_id = TaskIdField(max_length=255)
    attempt = models.PositiveIntegerField()
    retry_attempt = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=16, choices=Reason.choices)
    exception_type = models.CharField(max_length=255, blank=True, default="")
    exception_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    failed_at = models.DateTimeField()
    fingerprint = models.CharField(max_length=64)

    class Meta:
        verbose_name = "failure"
        ordering = ("failed_at", "attempt")
        default_permissions = ("view",)
        constraints = (
            models.UniqueConstraint(fields=["task_id", "attempt"],
                                    name="jobbers_failure_task_attempt"),
        )
        indexes = (
            # the groups page's charts: the failures of the groups on the page, last 24 h
            models.Index(fields=["fingerprint", "failed_at"], name="jobbers_failure_fp_at"),
        )

    def __str__(self) -> str:
        return f"{self.task_id} attempt {self.attempt}"


class FailureGroup(models.Model):
    fingerprint = models.CharField(max_length=64, unique=True)
    task_name = models.CharField(max_length=255)
    exception_type = models.CharField(max_length=255, blank=True, default="")
    #: the normalised message the fingerprint was made from (ids and numbers taken out)
    message = models.TextField(blank=True, default="")
    #: the innermost frame of application code, ``path/to/module.py:function``
    frame = models.CharField(max_length=500, blank=True, default="")
    failures = models.PositiveIntegerField(default=0)
    #: entries whose last failure has this fingerprint and that are still dead
    dead = models.IntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        verbose_name = "failure group"
        ordering = ("-last_seen", "-id")
        default_permissions = ("view",)
        indexes = (
            models.Index(fields=["-last_seen", "-id"], name="jobbers_group_recent"),
            models.Index(fields=["-failures"], name="jobbers_group_count"),
            models.Index(fields=["task_name", "-last_seen"], name="jobbers_group_name"),
        )

    def __str__(self) -> str:
        return f"{self.task_name}: {self.exception_type} ({self.failures})"


class Source(models.TextChoices):
    ADMIN = "admin", "admin"
    API = "api", "API"
    CODE = "code", "code"


class Action(models.TextChoices):
    RESUBMIT = "resubmit", "resubmit"
    DISCARD = "discard", "discard"
    CANCEL = "cancel", "cancel"
    RUN_START = "run_start", "paced resubmit started"
    RUN_PAUSE = "run_pause", "paced resubmit paused"
    RUN_RESUME = "run_resume", "paced resubmit resumed"
    RUN_CANCEL = "run_cancel", "paced resubmit cancelled"
    RUN_HALT = "run_halt", "paced resubmit halted"
    RUN_DONE = "run_done", "paced resubmit done"


class VersionChoice(models.TextChoices):
    """``jobbers_celery.ResubmitVersion``, as the audit stores it."""

    ENTRY = "entry", "the entry's version"
    CURRENT = "current", "the current version"


class AppendOnlyQuerySet(models.QuerySet["DeadLetterAudit"]):
    def update(self, **kwargs: Any) -> int:
        raise TypeError("the jobbers audit is append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise TypeError("the jobbers audit is append-only")


class DeadLetterAudit(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    #: kept as text: the audit outlives the user account
    username = models.CharField(max_length=150, blank=True, default="")
    source = models.CharField(max_length=8, choices=Source.choices)
    action = models.CharField(max_length=16, choices=Action.choices)
    task_ids = TaskIdsField(null=True, blank=True)
    filters = models.JSONField(null=True, blank=True)
    reset_retry_count = models.BooleanField(null=True, blank=True)
    #: a resubmit's version choice: ``entry`` (each entry's own) or ``current``
    version = models.CharField(max_length=8, choices=VersionChoice.choices, blank=True,
                               default="")
    #: with ``current``: the version each task name was published as
    versions = models.JSONField(null=True, blank=True)
    limit = models.PositiveIntegerField(null=True, blank=True)
    matched = models.PositiveIntegerField(default=0)
    acted = models.PositiveIntegerField(default=0)
    #: the ids acted on (resubmitted, discarded or cancelled)
    acted_ids = TaskIdsField(default=list, blank=True)
    #: the paced resubmit a ``run_*`` action is about
    run = models.ForeignKey("ResubmitRun", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    #: why a run halted, how it ended
    detail = models.TextField(blank=True, default="")

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        ordering = ("-at", "-id")
        default_permissions = ("view",)

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError("the jobbers audit is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise TypeError("the jobbers audit is append-only")

    def __str__(self) -> str:
        # the one time format, as every date on the admin's pages
        return f"{self.action} by {self.username or '?'} via {self.source} at {human_time(self.at)}"


class RunStatus(models.TextChoices):
    """``jobbers_celery.RunStatus`` as a model's choices (the same values; a test checks)."""

    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    PAUSED = "paused", "paused"
    HALTED = "halted", "halted"
    CANCELLED = "cancelled", "cancelled"
    DONE = "done", "done"


#: Statuses a run never leaves (``jobbers_celery``'s, the one list for both sinks).
FINAL_STATUSES = tuple(s for s in RunStatus if s.value in FINAL_RUN_STATUSES)


class ItemOutcome(models.TextChoices):
    """A run item's fate; a settled one is the settle rule's ``jobbers_celery.RunOutcome``
    as the database keeps it (``dlq/run_step.ITEM_OUTCOMES`` pairs them)."""

    PENDING = "", "pending"
    #: not published: the entry was no longer dead (resubmitted or discarded meanwhile)
    SKIPPED = "skipped", "skipped"
    #: published, refused by jobbers (the task is pending, running or finished already)
    REFUSED = "refused", "refused"
    COMPLETED = "completed", "completed"
    FAILED_AGAIN = "failed_again", "failed again"
    #: ended otherwise: its record expired before it was read
    OTHER = "other", "ended otherwise"


class ResubmitRun(models.Model):
    """A paced resubmit: its selection, pace and stop rule, status and counters.

    The counters are recounted from the items at every step (never incremented), so they
    stay exact whatever ran twice. ``chain`` names the step chain allowed to drive the run:
    a resume starts a new one, and a step of an older chain stops."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    username = models.CharField(max_length=150, blank=True, default="")
    source = models.CharField(max_length=8, choices=Source.choices)
    task_ids = TaskIdsField(null=True, blank=True)
    filters = models.JSONField(null=True, blank=True)
    limit = models.PositiveIntegerField(null=True, blank=True)
    reset_retry_count = models.BooleanField(default=True)
    version = models.CharField(max_length=8, choices=VersionChoice.choices,
                               default=VersionChoice.ENTRY)
    #: tasks per second
    rate = models.FloatField()
    #: the stop rule: halt when more than ``halt_after`` of the last ``of_last`` settled
    #: tasks failed again (both null: no stop rule)
    halt_after = models.PositiveIntegerField(null=True, blank=True)
    of_last = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=RunStatus.choices,
                              default=RunStatus.QUEUED)
    halt_reason = models.TextField(blank=True, default="")
    total = models.PositiveIntegerField(default=0)
    published = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed_again = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    remaining = models.PositiveIntegerField(default=0)
    #: the pace counts from here: ``published_base`` items were published before
    paced_since = models.DateTimeField(null=True, blank=True)
    published_base = models.PositiveIntegerField(default=0)
    chain = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        verbose_name = "paced resubmit"
        ordering = ("-created_at", "-id")
        default_permissions = ("view",)
        indexes = (models.Index(fields=["status"], name="jobbers_run_status"),)

    def __str__(self) -> str:
        return f"paced resubmit {self.pk} ({self.status})"

    @property
    def rule(self) -> str:
        if self.halt_after is None or self.of_last is None:
            return "no stop rule"
        return f"halt when more than {self.halt_after} of the last {self.of_last} failed again"


class ResubmitRunItem(models.Model):
    """One selected entry of a run. ``published_at`` is set once, in the transaction that
    claims the item and marks its entry resubmitted: the item is never published twice."""

    run = models.ForeignKey(ResubmitRun, on_delete=models.CASCADE, related_name="items")
    entry = models.ForeignKey(DeadLetterEntry, on_delete=models.CASCADE, related_name="+")
    task_id = TaskIdField(max_length=255)
    #: publish order (the selection's, newest failure first)
    position = models.PositiveIntegerField()
    published_at = models.DateTimeField(null=True, blank=True)
    #: the entry's failure count when published: more later means it failed again
    failures_before = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=16, choices=ItemOutcome.choices, blank=True,
                               default=ItemOutcome.PENDING)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "paced resubmit item"
        ordering = ("run", "position")
        default_permissions = ("view",)
        constraints = (
            models.UniqueConstraint(fields=["run", "entry"], name="jobbers_run_item_once"),
        )
        indexes = (
            models.Index(fields=["run", "outcome", "position"], name="jobbers_run_item_todo"),
            models.Index(fields=["run", "settled_at"], name="jobbers_run_item_settled"),
        )

    def __str__(self) -> str:
        return f"{self.task_id} in run {self.run_id}"


def alert_kinds() -> list[tuple[str, str]]:
    """Every ``AlertKind``, as the admin offers them."""
    return [(k.value, k.value.replace("_", " ")) for k in AlertKind]


class AlertRule(models.Model):
    """An alert rule set in the admin (``jobbers_celery.AlertRule``'s fields): which events
    (a kind, narrowed to a task name glob, a failure group or a schedule glob), where they
    go (webhook URLs, email addresses: one a line) and at most how often. Read by every
    process's alert service, besides the ``jobbers_alerts`` setting's (see
    ``jobbers_django.alerting``)."""

    name = models.CharField(max_length=100, unique=True,
                            help_text="Letters, digits and _.:- (identifies the rule: its "
                                      "alerts are deduplicated under it).")
    #: choices from a function: a kind added to jobbers_celery needs no migration
    kind = models.CharField(max_length=32, choices=alert_kinds)
    task = models.CharField(max_length=255, blank=True, default="",
                            help_text="Only tasks whose name matches this glob (billing.*).")
    group = models.CharField(max_length=64, blank=True, default="",
                             help_text="Only this failure group (its fingerprint).")
    schedule = models.CharField(max_length=255, blank=True, default="",
                                help_text="Periodic alerts: only schedules matching this glob.")
    threshold = models.PositiveIntegerField(
        null=True, blank=True, help_text="Dead-letter rate: dead letters per window.")
    window = models.PositiveIntegerField(default=300, help_text="Dead-letter rate: seconds.")
    webhooks = models.TextField(blank=True, default="",
                                help_text="Webhook URLs (Slack-compatible), one a line.")
    emails = models.TextField(blank=True, default="", help_text="Email addresses, one a line.")
    min_interval = models.PositiveIntegerField(
        default=600, help_text="Seconds: at most one alert per rule and thing this often.")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "alert rule"
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def as_dict(self) -> dict[str, Any]:
        """The rule in the setting's form (``jobbers_alerts``)."""
        return {"name": self.name, "kind": self.kind, "task": self.task or None,
                "group": self.group or None, "schedule": self.schedule or None,
                "threshold": self.threshold, "window": self.window,
                "webhooks": [u.strip() for u in self.webhooks.splitlines() if u.strip()],
                "emails": [a.strip() for a in self.emails.replace(",", "\n").splitlines()
                           if a.strip()],
                "min_interval": self.min_interval, "enabled": self.enabled}

    def as_rule(self) -> CeleryAlertRule:
        """The rule jobbers_celery matches (``ConfigurationError`` if it is not one)."""
        return parse_rule(self.as_dict(), "alert rule")

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        try:
            self.as_rule()
        except ConfigurationError as exc:
            raise ValidationError(str(exc)) from None
