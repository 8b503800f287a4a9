"""Reading the DLQ costs what is shown, not what is stored (issue 24): entries whose arguments
hold hostile 100 KB strings list through the API and open in the admin in well under a second
each, and no planted secret shows in either (under a secret key, after a token scheme, in a
URL's user part, quoted with escapes, in bytes' stored form, nested past the shown depth)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.urls import reverse

from jobbers_django.models import DeadLetterEntry
from tests.django.api_helpers import API, login

pytestmark = pytest.mark.django_db

PLANTED = ("pw-planted-41", "tok-planted-42", "ghp_planted43abcdefghijklmno", "cd-planted-44",
           "deep-planted-45", "jwt-planted-46")


def hostile(n: int) -> str:
    """100 KB that a pattern which backtracks would take seconds over."""
    parts = ["a-" * 10_000 + "=", "password=" + "a-" * 5_000, "x:" * 5_000, 'token="' * 1_000, "Bearer a-" * 1_000,
             ("a://" + "b:" * 20 + "@") * 200]
    return ("".join(parts) * 3)[:100_000] + str(n)


def planted_arguments() -> tuple[list[Any], dict[str, Any]]:
    deep: Any = {"secret_key": "deep-planted-45"}
    for _ in range(40):
        deep = {"n": deep}
    args = ["Authorization: Token tok-planted-42", hostile(1)]
    kwargs = {"note": hostile(2), "privateKey": "pw-planted-41",
              "repo": "https://ghp_planted43abcdefghijklmno@github.com/o/r",
              "raw": '{"password": "ab\\"cd-planted-44"}',  # an escaped quote inside it
              "deep": deep, "jwt": "jwt-planted-46"}
    return args, kwargs


def test_an_api_list_and_an_admin_entry_of_hostile_entries_cost_what_they_show(
        djapp, make_entries, staff, client):
    args, kwargs = planted_arguments()
    ids = make_entries(20, args=args, kwargs=kwargs)

    start = time.perf_counter()
    response = login(staff).get(f"{API}/dead-letter-queue?limit=20")
    listed = time.perf_counter() - start
    assert response.status_code == 200
    body = response.content.decode()
    assert len(response.json()["results"]) == 20

    entry = DeadLetterEntry.objects.get(task_id=ids[0])
    client.force_login(staff)
    start = time.perf_counter()
    page = client.get(reverse("admin:jobbers_deadletterentry_change", args=[entry.pk]))
    opened = time.perf_counter() - start
    assert page.status_code == 200
    html = page.content.decode()

    found = [(where, s) for where, text in (("api list", body), ("admin entry", html))
             for s in PLANTED if s in text]
    print(f"API list of 20 hostile entries: {listed:.2f} s; admin entry page: {opened:.2f} s; "
          f"planted secrets in clear: {len(found)} {found}")
    assert found == []
    assert "Token ********" in json.dumps(response.json()["results"][0]["args"])
    assert listed < 5  # 64 s before: each 100 KB string redacted whole, twice
    assert opened < 2  # 6.5 s before
