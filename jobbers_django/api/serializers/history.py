"""The history endpoint's query and answer (``GET history``): the per-minute series of a
task name, a queue or every task (:meth:`jobbers_celery.Jobbers.series`)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from jobbers_django.api.serializers.fields import StrictSerializer

__all__ = ["HistoryNamesSerializer", "HistoryQuerySerializer", "HistorySerializer",
           "SeriesPointSerializer"]

#: The longest name or queue a query may give (the history keeps 200 bytes of one).
MAX_NAME_CHARS = 800


class HistoryQuerySerializer(StrictSerializer):
    kind = "query parameter"
    name = serializers.CharField(required=False, max_length=MAX_NAME_CHARS,
                                 help_text="a task name (or give queue, or neither: every "
                                 "task)")
    queue = serializers.CharField(required=False, max_length=MAX_NAME_CHARS,
                                  help_text="a queue (routing key)")
    since = serializers.CharField(required=False, max_length=40, help_text=(
        "where the range starts: a span back from now (90m, 24h, 7d) or an ISO 8601 time "
        "with a zone; default 1h"))
    until = serializers.CharField(required=False, max_length=40, help_text=(
        "where it ends: a span back from now or an ISO 8601 time; default now"))
    step = serializers.ChoiceField(choices=[1, 5, 15, 60], required=False, help_text=(
        "minutes per point; default 1 up to 6 h, 5 up to 2 days, else 60"))
    names = serializers.BooleanField(required=False, default=False, help_text=(
        "true: list the task names and queues the history holds since `since` instead"))


class SeriesPointSerializer(serializers.Serializer[Any]):
    at = serializers.CharField(help_text="the bucket's start, ISO 8601 UTC")
    minutes = serializers.IntegerField(help_text="the bucket's length")
    throughput = serializers.IntegerField(help_text="tasks that ended: completed + failed")
    completed = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="ended failed, stalled or dropped")
    retried = serializers.IntegerField(help_text="attempts that ended to run again")
    started = serializers.IntegerField(
        help_text="attempts that ended with a queue latency (their start measured it)")
    failure_rate = serializers.FloatField(allow_null=True,
                                          help_text="failed / throughput; null without any")
    mean_runtime_ms = serializers.FloatField(allow_null=True,
                                             help_text="of the attempts that ended")
    mean_latency_ms = serializers.FloatField(
        allow_null=True, help_text="time those attempts waited in their queue")


class HistorySerializer(serializers.Serializer[Any]):
    name = serializers.CharField(allow_null=True)
    queue = serializers.CharField(allow_null=True)
    since = serializers.CharField(help_text="the first bucket's start (ISO 8601 UTC)")
    until = serializers.CharField(help_text="the last bucket's end")
    step_minutes = serializers.IntegerField()
    points = SeriesPointSerializer(many=True, help_text="oldest first, empty buckets too")


class HistoryNamesSerializer(serializers.Serializer[Any]):
    names = serializers.ListField(child=serializers.CharField())
    queues = serializers.ListField(child=serializers.CharField())
