"""What fair shares hold back (``Jobbers.fair_held``, see ``docs/howto/fair-shares.md``):
per task name and key (the first 8 hex digits of the value's SHA-256, never the value), the
tasks parked, on their way to start and running, and the cap per key. Reading uses the read
rule of the live task records (``JOBBERS_READ_PERMISSION``)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import FairHeld
from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, documented, error_responses, read_query
from jobbers_django.api.serializers.requests import NoQuerySerializer
from jobbers_django.models import DeadLetterEntry
from jobbers_django.permissions import CanRead

__all__ = ["FairSharesView", "fair_data"]


def fair_data(h: FairHeld) -> dict[str, Any]:
    return {"name": h.name, "key": h.key, "digest": h.digest, "cap": h.cap,
            "parked": h.parked, "on_the_way": h.released, "running": h.running}


class FairHeldSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="the task name")
    key = serializers.CharField(help_text="the key's first 8 hex digits (as history says)")
    digest = serializers.CharField(help_text="the SHA-256 of the key value's canonical JSON")
    cap = serializers.IntegerField(help_text="max_concurrent per key")
    parked = serializers.IntegerField(help_text="waiting for room: no message at the broker")
    on_the_way = serializers.IntegerField(help_text="sent to the broker, not started yet")
    running = serializers.IntegerField()


class FairSharesView(JobbersAPIView):
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry

    @documented(operation_id="fair_shares_list", summary="Held back by fair shares",
                description="Per task name and concurrency key with tasks parked past the "
                "key's cap, most parked first (at most 100).",
                responses={200: FairHeldSerializer(many=True),
                           **error_responses(400, 401, 403)})
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        return Response([fair_data(h) for h in bridge.get_jobbers().fair_held()])
