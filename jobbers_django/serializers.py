"""What the REST API reads and answers (docs/howto/rest-api.md).

Requests are validated strictly: unknown fields and query parameters, blank or repeated
values, task ids over ``TASK_ID_MAX_LENGTH`` characters and out-of-range limits are 400s
that name the field (an id is any string Celery runs: any character is accepted). Answers
show datetimes as ISO 8601 in UTC (``Z``) and arguments, checkpoints, progress and publish
options with secret-looking keys redacted (:mod:`jobbers_django.redaction`), and a dead-letter
entry's long values cut (``JOBBERS_DISPLAY_MAX_CHARS``, listed in its ``truncated``); the
stored values stay whole, so a resubmission still uses the real ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC
from typing import Any, ClassVar

from django.core.validators import ProhibitNullCharactersValidator
from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobbers_celery import PaceError, ResubmitPace, TaskState
from jobbers_django import conf
from jobbers_django.models import (
    DeadLetterEntry,
    DeadLetterFailure,
    Reason,
    ResubmitRun,
    RunStatus,
    Status,
    VersionChoice,
)
from jobbers_django.redaction import display, redact, shown_arguments, text
from jobbers_django.runs import MAX_RATE, MAX_WINDOW, MIN_RATE

__all__ = [
    "FILTER_FIELDS",
    "NOT_UNICODE_MESSAGE",
    "ORDERINGS",
    "TASK_ID_MAX_LENGTH",
    "TASK_ID_MESSAGE",
    "not_unicode",
    "validate_task_id",
]

#: The longest task id in paths and bodies (the CLIs' bound too). Celery's ids are UUIDs,
#: but a publisher may choose any string (a newline, ``/``, ``%``, empty): every one is
#: accepted and looked up; only one longer than this (no store keeps ids of megabytes; a
#: URL of a few KB still passes every proxy) is a 400.
TASK_ID_MAX_LENGTH = 4096

#: Filters of an action (resubmit, discard); the list also takes ``status``.
FILTER_FIELDS = ("queue", "task_name", "task_version", "exception_type", "fingerprint",
                 "reason", "failed_after", "failed_before")

#: ``ordering`` values of the list: (model field, descending). Ties break on the row id.
ORDERINGS: dict[str, tuple[str, bool]] = {
    "-last_failed_at": ("last_failed_at", True),
    "last_failed_at": ("last_failed_at", False),
    "-first_failed_at": ("first_failed_at", True),
    "first_failed_at": ("first_failed_at", False),
    "-failure_count": ("failure_count", True),
    "failure_count": ("failure_count", False),
    "task_name": ("task_name", False),
    "-task_name": ("task_name", True),
}
DEFAULT_ORDERING = "-last_failed_at"

_FINGERPRINT = re.compile(r"^[0-9a-f]{1,64}$")


TASK_ID_MESSAGE = f"a task id is at most {TASK_ID_MAX_LENGTH} characters (any characters)"
NOT_UNICODE_MESSAGE = "a task id is text: a lone surrogate (not UTF-8) names no task"
_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_task_id(value: str) -> None:
    if not isinstance(value, str) or len(value) > TASK_ID_MAX_LENGTH:
        raise serializers.ValidationError(TASK_ID_MESSAGE)
    if not_unicode(value):
        raise serializers.ValidationError(NOT_UNICODE_MESSAGE)


def not_unicode(task_id: str) -> bool:
    """A lone surrogate (a JSON ``"\\ud800"``, a shell's byte that is not UTF-8): no store
    holds such an id (Redis and PostgreSQL take UTF-8 only), so it names no task."""
    return _SURROGATE.search(task_id) is not None


def _validate_fingerprint(value: str) -> None:
    if not _FINGERPRINT.match(value):
        raise serializers.ValidationError("a fingerprint is 1 to 64 lowercase hex digits")


# ---------------------------------------------------------------------- fields
class UTCDateTimeField(serializers.DateTimeField):
    """ISO 8601 in UTC both ways: answers end in ``Z``; an input without an offset is UTC."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default_timezone", UTC)
        super().__init__(**kwargs)


class RedactedJSONField(serializers.JSONField):
    """A stored JSON value as shown to people: secret-looking keys redacted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return redact(value)


class DisplayJSONField(RedactedJSONField):
    """Redacted, and cut when longer than ``JOBBERS_DISPLAY_MAX_CHARS`` characters of JSON
    (a parent with a ``cut_fields`` list gets the field's name added to it)."""

    def to_representation(self, value: Any) -> Any:
        shown, cut = display(value)
        cut_fields = getattr(self.parent, "cut_fields", None)
        if cut and isinstance(cut_fields, list):
            cut_fields.append(self.field_name)
        return shown


class ArgumentsField(serializers.JSONField):
    """An entry's ``args`` or ``kwargs`` as shown (``source="*"``: the entry): redacted by
    key, credential and, for positional ones, the task's parameter names; then cut."""

    def __init__(self, part: str, **kwargs: Any) -> None:
        self.part = part
        kwargs.update(source="*", read_only=True)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        shown_args, shown_kwargs, args_cut, kwargs_cut = shown_arguments(
            value.task_name, value.args, value.kwargs)
        shown, cut = ((shown_args, args_cut) if self.part == "args"
                      else (shown_kwargs, kwargs_cut))
        cut_fields = getattr(self.parent, "cut_fields", None)
        if cut and isinstance(cut_fields, list):
            cut_fields.append(self.field_name)
        return shown


class StrictCharField(serializers.CharField):
    """Text that is text: a number or a boolean is refused, not turned into a string, and
    surrounding whitespace is kept (so an id with a newline is malformed, not trimmed)."""

    default_error_messages: ClassVar[dict[str, Any]] = {"not_a_string": "must be a string"}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)  # exact values, never quietly changed
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return str(super().to_internal_value(data))


class TaskIdCharField(StrictCharField):
    """A task id in a body: any string Celery runs, the empty one and a NUL included (the
    dead letters are looked up by its storable form, :mod:`jobbers_django.fields`); only
    one over :data:`TASK_ID_MAX_LENGTH` characters or not UTF-8 is refused."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_blank", True)
        super().__init__(validators=[validate_task_id], **kwargs)
        self.validators = [v for v in self.validators
                           if not isinstance(v, ProhibitNullCharactersValidator)]


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses what it does not know (a typo must not widen a selection) and blank values."""

    #: what the messages call an entry: a body's "field" or a URL's "query parameter"
    kind = "field"

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError({"body": [
                f"expected a JSON object, got {type(data).__name__}"]})
        unknown = sorted(set(data) - {n for n, f in self.fields.items() if not f.read_only})
        if unknown:
            allowed = ", ".join(n for n, f in self.fields.items() if not f.read_only)
            raise serializers.ValidationError(
                {name: [f"unknown {self.kind} {name!r}; allowed: {allowed or 'none'}"]
                 for name in unknown})
        return super().to_internal_value(data)


def _text(max_length: int = 255, **kwargs: Any) -> serializers.CharField:
    return StrictCharField(required=False, max_length=max_length, **kwargs)


def _limit(default: int, help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False, default=default, min_value=1, max_value=conf.MAX_LIMIT,
        help_text=help_text,
        error_messages={"min_value": f"must be between 1 and {conf.MAX_LIMIT}",
                        "max_value": f"must be between 1 and {conf.MAX_LIMIT}",
                        "invalid": "must be an integer between 1 and "
                                   f"{conf.MAX_LIMIT}",
                        "max_string_length": "must be an integer between 1 and "
                                             f"{conf.MAX_LIMIT}"})


class _Filters(StrictSerializer):
    """Filters shared by the list and the actions; every one an exact match or a bound."""

    queue = _text(help_text="exact queue name")
    task_name = _text(help_text="exact task name, e.g. proj.tasks.import_catalog")
    task_version = serializers.IntegerField(required=False, help_text="exact task version")
    exception_type = _text(help_text="qualified exception type, e.g. builtins.ValueError")
    fingerprint = _text(max_length=64, validators=[_validate_fingerprint],
                        help_text="failure group fingerprint (hex)")
    reason = serializers.ChoiceField(choices=Reason.choices, required=False,
                                     help_text="why the task was dead-lettered")
    failed_after = UTCDateTimeField(
        required=False, help_text="last failure at or after this instant (ISO 8601; "
        "without an offset it is UTC)")
    failed_before = UTCDateTimeField(
        required=False, help_text="last failure strictly before this instant (ISO 8601; "
        "without an offset it is UTC)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        after, before = attrs.get("failed_after"), attrs.get("failed_before")
        if after is not None and before is not None and after >= before:
            raise serializers.ValidationError(
                {"failed_before": ["must be later than failed_after"]})
        return attrs


# ---------------------------------------------------------------------- queries
class DeadLetterListQuerySerializer(_Filters):
    kind = "query parameter"
    status = serializers.ChoiceField(choices=Status.choices, required=False,
                                     help_text="entry status (default: every status)")
    limit = _limit(conf.DEFAULT_PAGE_SIZE, "page size, 1 to 1000")
    cursor = serializers.CharField(required=False, max_length=1000,
                                   help_text="opaque position from a previous page's "
                                   "`next` link")
    ordering = serializers.ChoiceField(
        choices=list(ORDERINGS), required=False, default=DEFAULT_ORDERING,
        help_text="sort order; ties break on insertion order")


class ScheduledQuerySerializer(StrictSerializer):
    kind = "query parameter"
    limit = _limit(conf.DEFAULT_PAGE_SIZE, "how many, soonest run_at first, 1 to 1000")


class NoQuerySerializer(StrictSerializer):
    kind = "query parameter"


# ---------------------------------------------------------------------- action bodies
class DiscardRequestSerializer(_Filters):
    """``task_ids`` or filters, never both, never neither."""

    task_ids = serializers.ListField(
        child=TaskIdCharField(), required=False,
        allow_empty=False, max_length=conf.MAX_IDS,
        help_text=f"explicit task ids (1 to {conf.MAX_IDS}); excludes the filters",
        error_messages={"empty": "must not be empty",
                        "max_length": f"at most {conf.MAX_IDS} ids per request"})
    limit = _limit(conf.DEFAULT_RESUBMIT_LIMIT,
                   "with filters only: act on at most this many entries, newest first")
    dry_run = serializers.BooleanField(
        required=False, default=False,
        help_text="answer what would be done (count and sample) and change nothing")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        names = ", ".join(FILTER_FIELDS)
        filters = {k: attrs[k] for k in FILTER_FIELDS if k in attrs}
        if "task_ids" in attrs and filters:
            raise serializers.ValidationError({"task_ids": [
                f"give task_ids or filters ({', '.join(filters)}), not both"]})
        if "task_ids" not in attrs and not filters:
            message = (f"give task_ids or at least one filter ({names}); an empty "
                       "selection never means everything")
            raise serializers.ValidationError({"task_ids": [message]})
        if "task_ids" in attrs and "limit" in self.initial_data:
            raise serializers.ValidationError({"limit": [
                "applies to filters only; task_ids select exactly the ids given"]})
        attrs["filters"] = filters
        return attrs


def _pace_bound(name: str, low: int, high: str) -> dict[str, Any]:
    message = f"must be an integer between {low} and {high}"
    return {"min_value": message, "max_value": message, "invalid": message,
            "max_string_length": message}


class ResubmitRequestSerializer(DiscardRequestSerializer):
    """Resubmit now; or, with ``rate`` (and optionally the stop rule "halt when more than
    ``halt_after`` of the last ``of_last`` failed again"), paced in the background."""

    reset_retry_count = serializers.BooleanField(
        required=False, default=True,
        help_text="start the retry count (and automatic stall recoveries) from zero")
    version = serializers.ChoiceField(
        choices=VersionChoice.choices, required=False, default=VersionChoice.ENTRY,
        help_text="`entry` (default): publish each task as the version recorded with its "
        "failure, so a worker running another version drops it again rather than call "
        "changed code with old arguments; `current`: as the version its task has in the "
        "API's Celery app now (400 if a selected task is not registered there)")

    #: whether ``rate`` must be given (the runs endpoint) or makes the resubmit paced
    rate_required = False

    rate = serializers.FloatField(
        required=False, min_value=MIN_RATE, max_value=MAX_RATE,
        help_text=f"tasks per second, at least {MIN_RATE:g} and at most {MAX_RATE:g} (a run "
        f"publishes at most {ResubmitPace.max_run_entries:,} entries within "
        f"{ResubmitPace.max_run_seconds:,.0f} s): "
        "resubmit in the "
        "background at this pace (answers 202 with the run) instead of all at once",
        error_messages={"min_value": ResubmitPace.rate_message,
                        "max_value": ResubmitPace.rate_message,
                        "invalid": "must be a number of tasks per second"})
    halt_after = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_WINDOW,
        help_text="the stop rule: halt when more than this many of the last `of_last` "
        "resubmitted tasks failed again (0 to of_last)",
        error_messages=_pace_bound("halt_after", 0, "of_last"))
    of_last = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_WINDOW,
        help_text=f"the stop rule's window: the last this many settled tasks (1 to "
        f"{MAX_WINDOW})", error_messages=_pace_bound("of_last", 1, str(MAX_WINDOW)))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        rate = attrs.get("rate")
        if rate is None and self.rate_required:
            raise serializers.ValidationError({"rate": ["this field is required"]})
        if rate is None and ("halt_after" in attrs or "of_last" in attrs):
            raise serializers.ValidationError({"rate": [
                "a stop rule (halt_after, of_last) needs a rate"]})
        if rate is not None:
            # FloatField reads true as 1.0: the pace's own check sees what was sent
            sent = self.initial_data.get("rate")
            try:  # the pace's rule, the one every front end applies
                ResubmitPace(sent if isinstance(sent, bool) else rate,
                             attrs.get("halt_after"), attrs.get("of_last"))
            except PaceError as exc:
                raise serializers.ValidationError({exc.field: [exc.message]}) from None
        return attrs


class ResubmitRunRequestSerializer(ResubmitRequestSerializer):
    rate_required = True


@extend_schema_field({"type": "string", "pattern": f"^({'|'.join(RunStatus.values)})$"})
class RunStatusField(serializers.ChoiceField):
    """A paced resubmit's status. The schema gives its values as a pattern, not an enum:
    drf-spectacular names enums by field name, and a second ``status`` enum would rename
    the entries' one (with a warning) in every project's schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=RunStatus.choices, **kwargs)


class RunListQuerySerializer(StrictSerializer):
    kind = "query parameter"
    status = RunStatusField(required=False, help_text="only runs in this status")
    limit = _limit(conf.DEFAULT_PAGE_SIZE, "how many, newest first, 1 to 1000")


class CancelRequestSerializer(StrictSerializer):
    terminate = serializers.BooleanField(
        required=False, default=False,
        help_text="also interrupt a started task on its worker (prefork pool) if it does "
        "not stop at its next heartbeat within jobbers_cancel_grace seconds")


# ---------------------------------------------------------------------- answers
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


class RedactedTextField(serializers.CharField):
    """A message as shown to people: credentials taken out by look (the worker has taken
    out the secret values of the task's arguments already, see ``taskrepr``)."""

    def to_representation(self, value: Any) -> str:
        return text(super().to_representation(value))


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


class TaskDetailSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    record = TaskRecordSerializer(allow_null=True,
                                  help_text="null once the record has expired")
    transitions = TransitionSerializer(many=True, help_text="oldest first")
    dead_letter = DeadLetterEntrySerializer(source="entry", allow_null=True,
                                            help_text="the task's dead-letter entry, if any")


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
