"""What the task-list, task-search, failure-group and count endpoints read and answer
(strict query parameters: unknown, blank or repeated ones, and values out of bounds, are
400s naming the parameter)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from jobbers_celery import TaskState
from jobbers_django import conf
from jobbers_django.api.serializers.fields import (
    StrictCharField,
    StrictSerializer,
    UTCDateTimeField,
)
from jobbers_django.api.serializers.requests import limit_field
from jobbers_django.api.serializers.responses import TaskRecordSerializer

__all__ = [
    "GROUP_ORDERINGS",
    "CountsSerializer",
    "FailureGroupListQuerySerializer",
    "FailureGroupPageSerializer",
    "TaskListQuerySerializer",
    "TaskListSerializer",
    "TaskSearchQuerySerializer",
    "TaskSearchSerializer",
]

_STATE_CHOICES = [(s.value, s.value) for s in TaskState]
#: ``ordering`` values of the failure groups (each backed by an index of the table).
GROUP_ORDERINGS = ("-last_seen", "-failures")
#: Characters of an argument value a search takes (longer: no indexed value could match).
_VALUE_MAX = 256


def _text(help_text: str, max_length: int = 255) -> serializers.CharField:
    return StrictCharField(required=False, max_length=max_length, help_text=help_text)


# ---------------------------------------------------------------------- queries
class TaskListQuerySerializer(StrictSerializer):
    kind = "query parameter"
    state = serializers.ChoiceField(choices=_STATE_CHOICES, required=False,
                                    help_text="only tasks in this state")
    name = _text("only tasks of this name, e.g. shop.tasks.import_order")
    queue = _text("only tasks routed to this queue")
    worker = _text("only tasks last run by this worker (its hostname, w1@host)")
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, "how many, newest first, 1 to 1000")


class TaskSearchQuerySerializer(StrictSerializer):
    kind = "query parameter"
    arg = StrictCharField(max_length=200, help_text="the argument's path: a keyword name "
                          "(order_id), a position (0), then keys or list indexes "
                          "(customer.id, lines.0.sku)")
    value = StrictCharField(max_length=_VALUE_MAX, help_text="the value it holds (exact; "
                            "42, 42.0 and \"42\" are one value; case kept)")
    name = _text("only tasks of this name")
    limit = limit_field(100, "how many, newest first, 1 to 1000")


class FailureGroupListQuerySerializer(StrictSerializer):
    kind = "query parameter"
    task_name = _text("exact task name")
    exception_type = _text("qualified exception type, e.g. builtins.ValueError")
    dead = serializers.BooleanField(required=False, help_text="true: only groups with dead "
                                    "entries now; false: only groups without")
    ordering = serializers.ChoiceField(choices=list(GROUP_ORDERINGS), required=False,
                                       default=GROUP_ORDERINGS[0],
                                       help_text="newest last failure, or most failures, "
                                       "first")
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, "how many, 1 to 1000")


# ---------------------------------------------------------------------- answers
class TaskListSerializer(serializers.Serializer[Any]):
    results = TaskRecordSerializer(many=True, help_text="newest submission first")


class TaskSearchSerializer(serializers.Serializer[Any]):
    argument = serializers.CharField(help_text="the path searched")
    value = serializers.CharField(help_text="the value searched, in its normal form")
    name = serializers.CharField(allow_null=True)
    indexed = serializers.ListField(
        child=serializers.CharField(),
        help_text="the task names whose publishes index this path (\"*\": every task) "
        "when the index answered; empty: the bounded search answered")
    examined = serializers.IntegerField(help_text="the bounded search: records read")
    of = serializers.IntegerField(help_text="the bounded search: records of the name (or "
                                  "of every task) in all")
    more = serializers.BooleanField(help_text="more tasks match than `limit`")
    how = serializers.CharField(help_text="which way the tasks were found, for people")
    results = TaskRecordSerializer(many=True, help_text="newest submission first")


class FailureGroupSerializer(serializers.Serializer[Any]):
    fingerprint = serializers.CharField()
    task_name = serializers.CharField()
    exception_type = serializers.CharField()
    message = serializers.CharField(help_text="the normalised message the fingerprint was "
                                    "made from (ids and numbers taken out)")
    frame = serializers.CharField(help_text="the innermost frame of application code")
    failures = serializers.IntegerField(help_text="failures with this fingerprint, ever")
    dead = serializers.IntegerField(help_text="entries still dead whose last failure has it")
    first_seen = UTCDateTimeField()
    last_seen = UTCDateTimeField()


class FailureGroupPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(help_text="groups matching, up to the cap")
    count_capped = serializers.BooleanField(help_text="more groups match than `count`")
    results = FailureGroupSerializer(many=True)


class CountsSerializer(serializers.Serializer[Any]):
    tasks = serializers.DictField(child=serializers.IntegerField(),
                                  help_text="tasks per state now (every state named)")
    total = serializers.IntegerField(help_text="tasks recorded now, in all")
    dead_letters = serializers.IntegerField(help_text="dead-letter entries still dead (the "
                                            "failure groups' sum)")
    failure_groups = serializers.IntegerField(help_text="failure groups with dead entries")
