"""What the REST API reads: query parameters and request bodies, validated strictly
(unknown fields, blank or repeated values and out-of-range limits are 400s naming the
field; a selection is ``task_ids`` or filters, never both and never neither)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from jobbers_celery import PaceError, ResubmitPace
from jobbers_django import conf
from jobbers_django.api.serializers.fields import (
    RunStatusField,
    StrictCharField,
    StrictSerializer,
    TaskIdCharField,
    UTCDateTimeField,
)
from jobbers_django.dlq.runs import MAX_RATE, MAX_WINDOW, MIN_RATE
from jobbers_django.models import Reason, Status, VersionChoice

__all__ = [
    "DEFAULT_ORDERING",
    "FILTER_FIELDS",
    "ORDERINGS",
    "CancelRequestSerializer",
    "DeadLetterListQuerySerializer",
    "DiscardRequestSerializer",
    "NoQuerySerializer",
    "ResubmitRequestSerializer",
    "ResubmitRunRequestSerializer",
    "RunListQuerySerializer",
    "ScheduledQuerySerializer",
    "WorkflowResubmitRequestSerializer",
    "limit_field",
]

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


def _validate_fingerprint(value: str) -> None:
    if not _FINGERPRINT.match(value):
        raise serializers.ValidationError("a fingerprint is 1 to 64 lowercase hex digits")


def _text(max_length: int = 255, **kwargs: Any) -> serializers.CharField:
    return StrictCharField(required=False, max_length=max_length, **kwargs)


def limit_field(default: int, help_text: str) -> serializers.IntegerField:
    """A ``limit``: 1 to ``JOBBERS_MAX_LIMIT``, ``default`` when not given."""
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
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, "page size, 1 to 1000")
    cursor = serializers.CharField(required=False, max_length=1000,
                                   help_text="opaque position from a previous page's "
                                   "`next` link")
    ordering = serializers.ChoiceField(
        choices=list(ORDERINGS), required=False, default=DEFAULT_ORDERING,
        help_text="sort order; ties break on insertion order")


class ScheduledQuerySerializer(StrictSerializer):
    kind = "query parameter"
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, "how many, soonest run_at first, 1 to 1000")


class NoQuerySerializer(StrictSerializer):
    kind = "query parameter"


class RunListQuerySerializer(StrictSerializer):
    kind = "query parameter"
    status = RunStatusField(required=False, help_text="only runs in this status")
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, "how many, newest first, 1 to 1000")


# ---------------------------------------------------------------------- action bodies
class DiscardRequestSerializer(_Filters):
    """``task_ids`` or filters, never both, never neither."""

    task_ids = serializers.ListField(
        child=TaskIdCharField(), required=False,
        allow_empty=False, max_length=conf.MAX_IDS,
        help_text=f"explicit task ids (1 to {conf.MAX_IDS}); excludes the filters",
        error_messages={"empty": "must not be empty",
                        "max_length": f"at most {conf.MAX_IDS} ids per request"})
    limit = limit_field(conf.DEFAULT_RESUBMIT_LIMIT,
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


class CancelRequestSerializer(StrictSerializer):
    terminate = serializers.BooleanField(
        required=False, default=False,
        help_text="also interrupt a started task on its worker (prefork pool) if it does "
        "not stop at its next heartbeat within jobbers_cancel_grace seconds")


class WorkflowResubmitRequestSerializer(StrictSerializer):
    reset_retry_count = serializers.BooleanField(
        required=False, default=True,
        help_text="start each member's retry count (and automatic stall recoveries) from zero")
