"""What the REST API answers: datetimes as ISO 8601 in UTC (``Z``); arguments, checkpoints,
progress and publish options with secret-looking keys redacted
(:mod:`jobbers_django.redaction`), and a dead-letter entry's long values cut
(``JOBBERS_DISPLAY_MAX_CHARS``, listed in its ``truncated``); the stored values stay whole,
so a resubmission still uses the real ones."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from rest_framework import serializers

from jobbers_celery import TaskState
from jobbers_django.api.serializers.fields import (
    ArgumentsField,
    DisplayJSONField,
    RedactedJSONField,
    RedactedTextField,
    RunStatusField,
    UTCDateTimeField,
    WorkflowStateField,
)
from jobbers_django.models import DeadLetterEntry, DeadLetterFailure, ResubmitRun, Status
from jobbers_django.redaction import text

__all__ = [
    "CancelResultSerializer",
    "DeadLetterEntrySerializer",
    "DeadLetterPageSerializer",
    "DiscardResultSerializer",
    "FailureHistorySerializer",
    "FailureSerializer",
    "ResubmitResultSerializer",
    "ResubmitRunListSerializer",
    "ResubmitRunSerializer",
    "ScheduledTasksSerializer",
    "TaskDetailSerializer",
    "WorkflowCancelResultSerializer",
    "WorkflowMemberSerializer",
    "WorkflowResubmitResultSerializer",
    "WorkflowSerializer",
    "WorkflowTransitionSerializer",
]


class _UTCModelSerializer(serializers.ModelSerializer[Any]):
    serializer_field_mapping: ClassVar[dict[type[models.Field[Any, Any]], type[Any]]] = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DateTimeField: UTCDateTimeField,
    }


class DeadLetterEntrySerializer(_UTCModelSerializer):
    """A dead-letter entry (its last failure; the traceback is in its history)."""

    args = ArgumentsField("args", help_text="positional arguments (secrets redacted: by the "
                          "task's parameter names and by look; long values cut: see "
                          "`truncated`)")
    kwargs = ArgumentsField("kwargs", help_text="keyword arguments (secrets redacted: by "
                            "key and by look; long values cut: see `truncated`)")
    checkpoint = DisplayJSONField(allow_null=True)
    options = DisplayJSONField(help_text="publish options (queue, routing, headers), "
                               "secret-looking keys redacted, long values cut")
    truncated = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="which of args, kwargs, checkpoint and options were cut for display (their "
        "JSON is longer than JOBBERS_DISPLAY_MAX_CHARS): shortened, keeping their shape, with "
        "a `[cut for display: ...]` marker; a resubmission uses the full values")

    class Meta:
        model = DeadLetterEntry
        fields = ("task_id", "task_name", "task_version", "queue", "status", "reason",
                  "exception_type", "exception_message", "failure_count", "first_failed_at",
                  "last_failed_at", "attempt", "retry_attempt", "worker", "fingerprint",
                  "resubmit_count", "resubmitted_at", "discarded_at", "args", "kwargs",
                  "checkpoint", "options", "truncated")
        read_only_fields = fields

    def to_representation(self, instance: Any) -> Any:
        self.cut_fields: list[str] = []  # filled by the DisplayJSONFields
        data = super().to_representation(instance)
        data["truncated"] = self.cut_fields
        if data.get("exception_message"):
            data["exception_message"] = text(data["exception_message"], instance.task_name,
                                             instance.args, instance.kwargs)
        return data


class DeadLetterPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(
        help_text="entries matching the filters, counted up to 10,000")
    count_capped = serializers.BooleanField(
        help_text="true when there are more than `count` entries (the count stopped)")
    next = serializers.URLField(allow_null=True,
                                help_text="the next page, null on the last one")
    results = DeadLetterEntrySerializer(many=True)


class FailureSerializer(_UTCModelSerializer):
    class Meta:
        model = DeadLetterFailure
        fields = ("attempt", "retry_attempt", "reason", "exception_type",
                  "exception_message", "traceback", "worker", "failed_at", "fingerprint")
        read_only_fields = fields

    def to_representation(self, instance: Any) -> Any:
        # the entry (in the context) lends its arguments' secret values; without it,
        # credentials are taken out by look only
        entry = self.context.get("entry")
        data = super().to_representation(instance)
        for name in ("exception_message", "traceback"):
            if data.get(name):
                data[name] = (text(data[name], entry.task_name, entry.args, entry.kwargs)
                              if entry is not None else text(data[name]))
        return data


class FailureHistorySerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    task_name = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    failures = FailureSerializer(many=True, help_text="every failed attempt, oldest first")


class SkippedSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    why = serializers.CharField()


class _ActionResultSerializer(serializers.Serializer[Any]):
    dry_run = serializers.BooleanField()
    matched = serializers.IntegerField(
        help_text="dead entries selected (at most `limit`); with dry_run, how many would "
        "be acted on")
    more = serializers.BooleanField(help_text="more entries match beyond `limit`")
    skipped = SkippedSerializer(many=True, help_text="requested ids not acted on, and why")
    sample = DeadLetterEntrySerializer(many=True,
                                       help_text="up to 10 of the matched entries")
    audit_id = serializers.IntegerField(allow_null=True,
                                        help_text="the audit entry (null with dry_run)")


class ResubmitResultSerializer(_ActionResultSerializer):
    resubmitted = serializers.ListField(child=serializers.CharField(),
                                        help_text="ids marked resubmitted")
    published = serializers.ListField(
        child=serializers.CharField(), allow_null=True,
        help_text="ids whose message went to the broker (a task that is running or "
        "pending in jobbers again is not published twice)")


class DiscardResultSerializer(_ActionResultSerializer):
    discarded = serializers.ListField(child=serializers.CharField(),
                                      help_text="ids marked discarded")


class ErrorInfoSerializer(serializers.Serializer[Any]):
    type = serializers.CharField()
    message = RedactedTextField()


_STATE_CHOICES = [(s.value, s.value) for s in TaskState]


class TaskRecordSerializer(serializers.Serializer[Any]):
    """A ``jobbers_celery.TaskRecord``."""

    task_id = serializers.CharField()
    name = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    queue = serializers.CharField(allow_null=True)
    state = serializers.ChoiceField(choices=_STATE_CHOICES)
    attempt = serializers.IntegerField()
    retry_attempt = serializers.IntegerField()
    submitted_at = UTCDateTimeField(allow_null=True)
    started_at = UTCDateTimeField(allow_null=True)
    retried_at = UTCDateTimeField(allow_null=True)
    completed_at = UTCDateTimeField(allow_null=True)
    heartbeat_at = UTCDateTimeField(allow_null=True)
    run_at = UTCDateTimeField(allow_null=True)
    worker = serializers.CharField(allow_null=True)
    error = ErrorInfoSerializer(allow_null=True)
    progress = RedactedJSONField(allow_null=True)
    checkpoint = RedactedJSONField(allow_null=True)


class TransitionSerializer(serializers.Serializer[Any]):
    """A ``jobbers_celery.Transition`` (its task id is the enclosing one)."""

    # plain strings: the states are enumerated once, as TaskRecord's ``state``
    from_state = serializers.CharField(help_text="a task state (see `state`)")
    to_state = serializers.CharField(help_text="a task state (see `state`)")
    at = UTCDateTimeField()
    attempt = serializers.IntegerField()
    worker = serializers.CharField(allow_null=True)
    reason = RedactedTextField(allow_null=True)


class ScheduledTasksSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(help_text="tasks scheduled now, in all")
    results = TaskRecordSerializer(many=True, help_text="soonest run_at first")


class UniqueLockSerializer(serializers.Serializer[Any]):
    key = serializers.CharField(help_text="SHA-256 of the task name and its key values "
                                "(hex; the values themselves are never stored)")
    until = serializers.ChoiceField(choices=[("start", "start"), ("end", "end"),
                                             ("window", "window")])
    expires_ms = serializers.IntegerField(help_text="the lock's expiry in Redis (the window, "
                                          "or a backstop)")
    holder = serializers.CharField(allow_null=True,
                                   help_text="the task id holding the lock now; null: free")
    held_by_this_task = serializers.BooleanField()


class TaskDetailSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    record = TaskRecordSerializer(allow_null=True,
                                  help_text="null once the record has expired")
    transitions = TransitionSerializer(many=True, help_text="oldest first")
    dead_letter = DeadLetterEntrySerializer(source="entry", allow_null=True,
                                            help_text="the task's dead-letter entry, if any")
    unique = UniqueLockSerializer(allow_null=True, required=False,
                                  help_text="a unique task's lock and who holds it; null: "
                                  "not a unique task")


class CancelResultSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    cancelled = serializers.BooleanField(
        help_text="true: cancelled, or cancellation requested from a started task")
    outcome = serializers.ChoiceField(
        choices=[("cancelled", "cancelled"), ("requested", "requested"),
                 ("refused", "refused")],
        help_text="cancelled now (submitted, scheduled); requested (started: it stops at "
        "its next heartbeat); refused (already finished)")
    state = serializers.ChoiceField(choices=_STATE_CHOICES, allow_null=True,
                                    help_text="the task's state after the request")
    terminate = serializers.BooleanField()


_ROLES = [("root", "root"), ("member", "member"), ("header", "header"),
          ("callback", "callback")]


class WorkflowMemberSerializer(serializers.Serializer[Any]):
    """A member of a workflow: its place in the canvas and its record."""

    task_id = serializers.CharField()
    role = serializers.ChoiceField(
        choices=_ROLES, help_text="root: the canvas's first task; header: a chord's group "
        "member; callback: a chord's body; member: any other (a chain's link, a group's "
        "member)")
    parent_id = serializers.CharField(allow_null=True,
                                      help_text="the task that published this one")
    group_id = serializers.CharField(allow_null=True,
                                     help_text="the group (or chord header) it belongs to")
    blocking = serializers.BooleanField(help_text="this member holds the workflow up")
    elapsed_seconds = serializers.FloatField(
        allow_null=True, help_text="from its first start to its end (to now while it has "
        "not ended); null before it started")
    record = TaskRecordSerializer(help_text="its record, as `GET tasks/{task_id}` shows it")


class WorkflowTransitionSerializer(serializers.Serializer[Any]):
    """A step of the workflow's own history."""

    at = UTCDateTimeField()
    state = WorkflowStateField(help_text="the workflow's state from then on")
    reason = RedactedTextField()
    task_id = serializers.CharField(allow_null=True,
                                    help_text="the member that caused it, if one did")


class WorkflowSerializer(serializers.Serializer[Any]):
    """A canvas (chain, group, chord) as one unit."""

    task_id = serializers.CharField(help_text="the id asked for (a member's, the root's or "
                                    "a group's)")
    root_id = serializers.CharField()
    state = WorkflowStateField(help_text="running; or, final: completed (its last task, a "
                               "chord's callback included, completed), failed (a member "
                               "failed for good), cancelled")
    progress = serializers.CharField(help_text="`k of n completed`")
    total = serializers.IntegerField(help_text="members, read or not")
    completed = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="failed, stalled or dropped")
    running = serializers.IntegerField(help_text="started")
    pending = serializers.IntegerField(help_text="submitted or scheduled, not started")
    cancelled = serializers.IntegerField()
    started_at = UTCDateTimeField(allow_null=True)
    ended_at = UTCDateTimeField(allow_null=True)
    elapsed_seconds = serializers.FloatField(allow_null=True,
                                             help_text="from its start to its end, or now")
    blocking = serializers.ListField(
        child=serializers.CharField(), help_text="the members that hold it up (a failed "
        "header member blocks its chord's callback)")
    truncated = serializers.BooleanField(
        help_text="more than 1,000 members: the first 1,000 by submission time are listed "
        "(`history` and `blocking` are theirs); `state`, `total` and the counts cover all")
    members = WorkflowMemberSerializer(many=True, help_text="by submission time")
    history = WorkflowTransitionSerializer(many=True, help_text="oldest first")


class WorkflowCancelResultSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    root_id = serializers.CharField()
    cancelled = serializers.ListField(
        child=serializers.CharField(), help_text="members cancelled, or asked to stop (a "
        "started one stops at its next heartbeat); empty: nothing was left to cancel (409)")
    state = WorkflowStateField(help_text="the workflow's state after the request")
    terminate = serializers.BooleanField()


class WorkflowResubmitResultSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    root_id = serializers.CharField()
    resubmitted = serializers.ListField(
        child=serializers.CharField(), help_text="failed members sent back to the broker "
        "(same ids); empty: none was failed (409)")
    state = WorkflowStateField(help_text="the workflow's state after the request")
    reset_retry_count = serializers.BooleanField()


class ResubmitRunSerializer(_UTCModelSerializer):
    """A paced resubmit and its progress (counters recounted at every step)."""

    rule = serializers.CharField(read_only=True, help_text="the stop rule, in words")
    status = RunStatusField(read_only=True, help_text="queued, running, paused; or, "
                            "final: halted (by the stop rule, see halt_reason), cancelled, "
                            "done")

    class Meta:
        model = ResubmitRun
        fields = ("id", "status", "rate", "halt_after", "of_last", "rule", "version",
                  "reset_retry_count", "task_ids", "filters", "limit", "total", "published",
                  "completed", "failed_again", "skipped", "remaining", "halt_reason",
                  "username", "source", "created_at", "started_at", "finished_at",
                  "last_step_at")
        read_only_fields = fields


class ResubmitRunListSerializer(serializers.Serializer[Any]):
    results = ResubmitRunSerializer(many=True, help_text="newest first")
