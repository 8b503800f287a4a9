"""History: throughput, failures, mean runtime and mean queue latency per minute (or 5 min,
15 min, an hour) of one task name, one queue, or every task, read from jobbers (Redis)
through :mod:`jobbers_django.bridge`; the same points ``celery jobbers history --json``
prints. A range jobbers refuses (before ``since``, further back than
``jobbers_history_days``, more than 1,500 points) is a 400 naming the parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import SeriesRangeError, parse_span
from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, bad, documented, error_responses, read_query
from jobbers_django.api.serializers.history import (
    HistoryNamesSerializer,
    HistoryQuerySerializer,
    HistorySerializer,
)
from jobbers_django.models import DeadLetterEntry
from jobbers_django.permissions import CanRead

__all__ = ["HistoryView", "when"]


def when(value: str, field: str, now: datetime) -> datetime:
    """A span back from ``now`` (``24h``) or an ISO 8601 time with a zone; else a 400."""
    if value[:1].isdigit() and not any(c in value for c in "-:T"):
        try:
            return now - timedelta(milliseconds=parse_span(value))
        except SeriesRangeError as exc:
            raise bad(field, str(exc)) from None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise bad(field, "a span back from now (90m, 24h, 7d) or an ISO 8601 time") from None
    if at.tzinfo is None:
        raise bad(field, "an ISO 8601 time needs its zone (Z or +00:00)")
    return at.astimezone(UTC)


class HistoryView(JobbersAPIView):
    # the read rule for the live task records (the history counts them)
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry

    @documented(
        operation_id="history_retrieve",
        summary="Throughput, failures, runtime and queue latency over time",
        description="The per-minute history of a task name (`name`), a queue (`queue`) or "
        "every task (neither), downsampled to `step` minutes, kept jobbers_history_days "
        "(default 7). Every bucket of the range is listed, empty ones too. With "
        "`names=true`: the task names and queues it holds. 400 for a range it refuses.",
        parameters=[HistoryQuerySerializer],
        responses={200: HistorySerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(HistoryQuerySerializer, request)
        now = bridge.get_jobbers().now()
        since = when(query.get("since", "1h"), "since", now)
        if query["names"]:
            days = max((now - since).total_seconds(), 60) / 86400
            names, queues = bridge.series_names(days)
            return Response(HistoryNamesSerializer({"names": names, "queues": queues}).data)
        if "name" in query and "queue" in query:
            raise bad("queue", "give name or queue, not both")
        until = when(query["until"], "until", now) if "until" in query else now
        try:
            read = bridge.series(name=query.get("name"), queue=query.get("queue"),
                                 since=since, until=until, step=query.get("step"))
        except SeriesRangeError as exc:
            raise bad("since", str(exc)) from None
        return Response(HistorySerializer(read.as_dict()).data)
