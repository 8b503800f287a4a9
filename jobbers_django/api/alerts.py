"""Alert rules (``alert-rules``): the rules every process's alert service goes by, from the
``jobbers_alerts`` setting and from the admin, read-only (the admin edits them). A webhook
is shown by its host only: a Slack webhook's path is its secret."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import AlertRule, ConfigurationError, parse_rule
from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, documented, error_responses, read_query
from jobbers_django.api.serializers.requests import NoQuerySerializer
from jobbers_django.models import AlertRule as AlertRuleRow

__all__ = ["AlertRuleListView", "rule_data"]

#: Admin rules listed at most (the admin pages through more).
MAX_ADMIN_RULES = 1000


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"


def rule_data(rule: AlertRule, source: str) -> dict[str, Any]:
    """One rule as the endpoint shows it."""
    return {"name": rule.name, "kind": str(rule.kind), "source": source, "task": rule.task,
            "group": rule.group, "schedule": rule.schedule, "threshold": rule.threshold,
            "window": rule.window, "webhooks": [_host(u) for u in rule.webhooks],
            "emails": list(rule.emails), "min_interval": rule.min_interval,
            "enabled": rule.enabled}


_RULE = inline_serializer("AlertRule", {
    "name": serializers.CharField(), "kind": serializers.CharField(),
    "source": serializers.ChoiceField(choices=["settings", "admin"]),
    "task": serializers.CharField(allow_null=True), "group": serializers.CharField(
        allow_null=True), "schedule": serializers.CharField(allow_null=True),
    "threshold": serializers.IntegerField(allow_null=True), "window": serializers.FloatField(),
    "webhooks": serializers.ListField(child=serializers.CharField(),
                                      help_text="each webhook's scheme and host only"),
    "emails": serializers.ListField(child=serializers.CharField()),
    "min_interval": serializers.FloatField(), "enabled": serializers.BooleanField()})


class AlertRuleListView(JobbersAPIView):
    read_model = AlertRuleRow

    @documented(
        operation_id="alert_rules_list",
        summary="Alert rules",
        description="The alert rules of the `jobbers_alerts` setting, then the admin's, by "
        "name; each webhook by its host only.",
        responses={200: inline_serializer("AlertRuleList", {"results": serializers.ListField(
            child=_RULE)}), **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        results = [rule_data(parse_rule(raw, "jobbers_alerts"), "settings")
                   for raw in bridge.get_jobbers().config.alerts]
        for row in AlertRuleRow.objects.order_by("name")[:MAX_ADMIN_RULES]:
            try:
                results.append(rule_data(row.as_rule(), "admin"))
            except ConfigurationError:  # saved before a check existed: not a rule in force
                continue
        return Response({"results": results})
