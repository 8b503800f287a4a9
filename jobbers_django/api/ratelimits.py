"""Rate limits keyed by arguments (``rate_limit_by``; ``docs/howto/rate-limits.md``): each
task name's declared rate, the override in force and how many of its tasks wait on it; and
setting or clearing an override, which every worker applies from its next start.

Reading uses the read rule of the live task records; setting
``JOBBERS_RATE_LIMIT_PERMISSION``. A bad rate, or setting a name that is not a task with
``rate_limit_by`` here, is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import MAX_RATE_NAME, MAX_RATE_TEXT
from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, bad, documented, error_responses, read_query
from jobbers_django.api.serializers.fields import StrictSerializer
from jobbers_django.api.serializers.requests import NoQuerySerializer
from jobbers_django.models import DeadLetterEntry
from jobbers_django.permissions import CanRead, CanSetRateLimits

__all__ = ["RateLimitSetView", "RateLimitsView"]


class RateLimitSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    declared = serializers.CharField(allow_null=True,
                                     help_text="the task's rate_limit_by (null: none here)")
    override = serializers.CharField(allow_null=True, help_text="an operator's, or off")
    effective = serializers.CharField(allow_null=True, help_text="in force; null: unlimited "
                                      "(or declared null: an override is not applied)")
    key = serializers.CharField(help_text="what the key is made of (never a value)")
    held = serializers.IntegerField(help_text="tasks waiting on the limit now")


class RateLimitRequestSerializer(StrictSerializer):
    task = serializers.CharField(max_length=MAX_RATE_NAME, trim_whitespace=False,
                                 help_text="the task name")
    rate = serializers.CharField(allow_null=True, max_length=MAX_RATE_TEXT,
                                 help_text="10/s, 5/m, 100/h, 1000/d, or off; null clears "
                                 "the override")


def _rows(name: str | None = None) -> list[dict[str, Any]]:
    return [i.as_dict() for i in bridge.get_jobbers().rate_limits()
            if name is None or i.name == name]


class RateLimitsView(JobbersAPIView):
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry  # the live task records' read rule

    @documented(operation_id="rate_limits_list", summary="Rate limits per key",
                description="Each task name that declares `rate_limit_by` here or has an "
                "override: its declared rate, the override, the rate in force, what its key "
                "is made of, and how many of its tasks wait on it now (`scheduled`, reason "
                "`rate limit ... reached`).",
                responses={200: RateLimitSerializer(many=True),
                           **error_responses(400, 401, 403)})
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        return Response(_rows())


class RateLimitSetView(JobbersAPIView):
    permission_classes = (CanSetRateLimits,)

    @documented(operation_id="rate_limit_set", summary="Override a rate limit",
                description="Sets (`rate`: `10/s`, `off`) or clears (`rate`: null) a task "
                "name's override, read by every worker's next start (no restart); setting "
                "one for a name that is not a task with `rate_limit_by` here is a 400. "
                "Answers the name's row.", request=RateLimitRequestSerializer,
                responses={200: RateLimitSerializer(many=True),
                           **error_responses(400, 401, 403)})
    def post(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        body = RateLimitRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        jobbers = bridge.get_jobbers()
        try:
            jobbers.check_rate_limit_override(data["task"], data["rate"])
        except ValueError as exc:
            raise bad("task", str(exc)) from None
        try:
            jobbers.set_rate_limit(data["task"], data["rate"])
        except ValueError as exc:
            raise bad("rate", str(exc)) from None
        return Response(_rows(data["task"]))
