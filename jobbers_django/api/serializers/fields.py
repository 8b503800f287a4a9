"""The fields the REST API's serializers are built from: task ids (any string Celery runs,
bounded), datetimes in UTC, text that is text, stored values shown redacted and cut, and the
strict serializer that refuses what it does not know."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobbers_celery import WorkflowState, iso_time
from jobbers_django.models import RunStatus
from jobbers_django.redaction import display, redact, shown_arguments, text

__all__ = [
    "NOT_UNICODE_MESSAGE",
    "TASK_ID_MAX_LENGTH",
    "TASK_ID_MESSAGE",
    "ArgumentsField",
    "DisplayJSONField",
    "RedactedJSONField",
    "RedactedTextField",
    "RunStatusField",
    "StrictCharField",
    "StrictSerializer",
    "TaskIdCharField",
    "UTCDateTimeField",
    "WorkflowStateField",
    "not_unicode",
    "validate_task_id",
]

#: The longest task id in paths and bodies (the CLIs' bound too). Celery's ids are UUIDs,
#: but a publisher may choose any string (a newline, ``/``, ``%``, empty): every one is
#: accepted and looked up; only one longer than this (no store keeps ids of megabytes; a
#: URL of a few KB still passes every proxy) is a 400.
TASK_ID_MAX_LENGTH = 4096

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


class UTCDateTimeField(serializers.DateTimeField):
    """ISO 8601 in UTC both ways: answers in the one format of the CLI's ``--json`` too
    (``2026-11-27T21:33:05.120Z``, milliseconds always, :func:`jobbers_celery.iso_time`); an
    input without an offset is UTC."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default_timezone", UTC)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return iso_time(value) if isinstance(value, datetime) else super().to_representation(value)


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


class RedactedTextField(serializers.CharField):
    """A message as shown to people: credentials taken out by look (the worker has taken
    out the secret values of the task's arguments already, see ``taskrepr``)."""

    def to_representation(self, value: Any) -> str:
        return text(super().to_representation(value))


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


@extend_schema_field({"type": "string", "pattern": f"^({'|'.join(RunStatus.values)})$"})
class RunStatusField(serializers.ChoiceField):
    """A paced resubmit's status. The schema gives its values as a pattern, not an enum:
    drf-spectacular names enums by field name, and a second ``status`` enum would rename
    the entries' one (with a warning) in every project's schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=RunStatus.choices, **kwargs)


@extend_schema_field({"type": "string",
                      "pattern": f"^({'|'.join(s.value for s in WorkflowState)})$"})
class WorkflowStateField(serializers.ChoiceField):
    """A workflow's state (``running``, or, final: ``completed``, ``failed``, ``cancelled``),
    given as a pattern in the schema for the reason :class:`RunStatusField` is."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=[(s.value, s.value) for s in WorkflowState], **kwargs)


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
