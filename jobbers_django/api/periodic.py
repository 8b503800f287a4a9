"""``GET periodic-tasks``: each beat schedule jobbers watches, with its missed, late and
overlapping runs and its recent runs (``docs/howto/periodic.md``), as ``celery jobbers
periodic --json`` prints them. Read under the read rule of the entries (live records)."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, documented, error_responses, read_query
from jobbers_django.api.serializers.fields import StrictSerializer

__all__ = ["PeriodicQuerySerializer", "PeriodicTasksView"]

#: Recent runs a schedule lists at most (``jobbers_periodic_keep_runs`` bounds it too).
MAX_RUNS = 100


class PeriodicQuerySerializer(StrictSerializer):
    kind = "query parameter"
    runs = serializers.IntegerField(
        required=False, default=10, min_value=0, max_value=MAX_RUNS,
        help_text=f"recent runs of each schedule, newest first, 0 to {MAX_RUNS}",
        error_messages={"min_value": f"must be between 0 and {MAX_RUNS}",
                        "max_value": f"must be between 0 and {MAX_RUNS}",
                        "invalid": f"must be an integer between 0 and {MAX_RUNS}"})


class PeriodicRunSerializer(serializers.Serializer[dict[str, object]]):
    id = serializers.CharField(help_text="the run's task id; missed:<slot ms> for a missed slot")
    state = serializers.CharField(help_text="published, started, a Celery end state or missed")
    slot_at = serializers.CharField(allow_null=True)
    published_at = serializers.CharField(allow_null=True)
    started_at = serializers.CharField(allow_null=True)
    ended_at = serializers.CharField(allow_null=True)
    late = serializers.BooleanField()
    overlapping = serializers.BooleanField()


class PeriodicScheduleSerializer(serializers.Serializer[dict[str, object]]):
    name = serializers.CharField()
    task = serializers.CharField()
    schedule = serializers.CharField(help_text="Celery's description of the schedule")
    source = serializers.CharField(  # type: ignore[assignment]  # DRF pops declared fields
        help_text="beat (learned from a running beat) or config")
    period_seconds = serializers.FloatField(help_text="0: unknown, or a one-off")
    next_at = serializers.CharField(allow_null=True)
    seen_at = serializers.CharField(allow_null=True)
    last_published_at = serializers.CharField(allow_null=True)
    last_started_at = serializers.CharField(allow_null=True)
    last_ended_at = serializers.CharField(allow_null=True)
    last_state = serializers.CharField(allow_null=True)
    missed = serializers.IntegerField()
    late = serializers.IntegerField()
    overlapping = serializers.IntegerField()
    runs_total = serializers.IntegerField()
    removed_at = serializers.CharField(allow_null=True,
                                       help_text="when beat stopped listing it")
    runs = PeriodicRunSerializer(many=True)


class PeriodicTasksSerializer(serializers.Serializer[dict[str, object]]):
    count = serializers.IntegerField()
    results = PeriodicScheduleSerializer(many=True)


class PeriodicTasksView(JobbersAPIView):
    @documented(
        operation_id="periodic_tasks_list",
        summary="Beat schedules watched, with missed, late and overlapping runs",
        description="By name; times ISO 8601 UTC; counts since jobbers first learned "
        "the schedule.",
        parameters=[PeriodicQuerySerializer],
        responses={200: PeriodicTasksSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(PeriodicQuerySerializer, request)
        schedules = bridge.get_jobbers().periodic_tasks(runs=query["runs"])
        return Response(PeriodicTasksSerializer(
            {"count": len(schedules), "results": [s.as_dict() for s in schedules]}).data)
