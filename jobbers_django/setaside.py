"""Set-aside dead letters, for people: the entries the sink refused for a reason of their own
(also in their storable form) or that could not be read back, kept in a bounded Redis list
(``Jobbers.set_aside()``, see docs/howto/dead-letters.md) while the entries behind them were
written. Shown by the admin (:mod:`jobbers_django.admin.aside`), the API
(``GET /dead-letter-queue/set-aside``) and ``manage.py jobbers_dlq set-aside``.

What is shown of an item is when, why, where it came from and the entry's id, name, attempt
and reason, never its arguments (the entry's JSON stays in Redis for a person to repair).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import SetAside, SetAsideReport, StoreUnavailable
from jobbers_django import bridge, conf
from jobbers_django.api.base import JobbersAPIView, documented, error_responses, read_query
from jobbers_django.api.serializers.fields import StrictSerializer, UTCDateTimeField
from jobbers_django.api.serializers.requests import limit_field

__all__ = ["SetAsideQuerySerializer", "SetAsideView", "listing", "shown_item"]


def listing(limit: int) -> SetAsideReport:
    """The newest ``limit`` set-aside items (raises ``StoreUnavailable`` when Redis is
    unreachable)."""
    return bridge.get_jobbers().set_aside(limit)


def shown_item(item: SetAside) -> dict[str, Any]:
    """What people see of an item: everything but the entry's JSON."""
    return {"at": item.at, "task_id": item.task_id, "name": item.name,
            "attempt": item.attempt, "reason": item.reason, "waited_in": item.source,
            "why": item.why}


class SetAsideQuerySerializer(StrictSerializer):
    kind = "query parameter"
    limit = limit_field(conf.DEFAULT_PAGE_SIZE, f"how many, newest first, 1 to {conf.MAX_LIMIT}")


class _ItemSerializer(serializers.Serializer[Any]):
    at = UTCDateTimeField(help_text="when it was set aside")
    task_id = serializers.CharField(allow_null=True, help_text="null: unreadable")
    name = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="failed, stalled or dropped")
    waited_in = serializers.CharField(
        help_text="where it was when set aside: send (written at once), memory, spool or "
        "outbox")
    why = serializers.CharField(help_text="the sink's error (the entry's values taken out)")


class _ListSerializer(serializers.Serializer[Any]):
    kept = serializers.IntegerField(help_text="items the list keeps now (bounded)")
    total = serializers.IntegerField(help_text="items ever set aside, dropped ones included")
    results = _ItemSerializer(many=True)


class SetAsideView(JobbersAPIView):
    @documented(
        operation_id="dead_letter_set_aside_list",
        summary="Dead letters set aside",
        description="Entries the sink refused for a reason of their own (also in their "
        "storable form) or that could not be read back, newest first; the entries behind "
        "them were written. Never their arguments. Needs the read permission.",
        parameters=[SetAsideQuerySerializer],
        responses={200: _ListSerializer, **error_responses(400, 401, 403),
                   503: OpenApiResponse(description="Redis is unreachable")},
    )
    def get(self, request: Request) -> Response:
        query = read_query(SetAsideQuerySerializer, request)
        try:
            report = listing(query["limit"])
        except StoreUnavailable as exc:
            return Response({"detail": f"Redis is unreachable: {exc}"},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(_ListSerializer({
            "kept": report.kept, "total": report.total,
            "results": [shown_item(i) for i in report.entries]}).data)
