"""Helpers shared by the REST API tests (``test_api.py``, ``test_api_actions.py``): a logged-in
client, JSON posts, the ids of a page, what an action would change, a 400 naming a field."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from jobbers_django.models import DeadLetterAudit, DeadLetterEntry

API = "/jobbers"


def login(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def post(client: Client, path: str, body: Any, **extra: Any) -> Any:
    return client.post(f"{API}/{path}", json.dumps(body), content_type="application/json",
                       **extra)


def ids_of(response: Any) -> list[str]:
    return [row["task_id"] for row in response.json()["results"]]


def snapshot() -> tuple[Any, ...]:
    """What an action would change (entry statuses and counters, the audit)."""
    rows = tuple(DeadLetterEntry.objects.order_by("task_id").values_list(
        "task_id", "status", "resubmit_count", "publish_pending"))
    return rows, DeadLetterAudit.objects.count()


def assert_bad(response: Any, field: str) -> None:
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["errors"], body
    assert field in body["detail"], body
