"""Finding tasks from the API and the admin: GET tasks (by state, name, queue), GET
task-search (an indexed path, ``djproj.import_order``'s ``order_id``, and the bounded search
of any other), GET failure-groups and GET counts, each behind the read rule with 400s naming
the parameter; the admin's find page (by id: sent on to the task's page; by argument) and
the find box on the jobbers pages. End to end, a real worker runs ``import_order`` with
``order_id=91800``: the API, the admin page and ``celery jobbers find`` find it after it
completed, and its card number is never shown."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from jobbers_celery import TaskState
from jobbers_django.models import FailureGroup
from tests.conftest import ROOT, subprocess_env
from tests.django.api_helpers import API, assert_bad, ids_of, login
from tests.integration.lifecycle_helpers import wait_state

S = TaskState
CARD = "4111111111111111"
FIND = "admin:jobbers_find"


def _publish(djapp: Any, order_id: object, **kwargs: Any) -> str:
    """An ``import_order`` task waiting on a queue no worker reads (its record holds its
    arguments)."""
    result = djapp.import_order.apply_async((order_id,), kwargs, queue="search-nobody")
    return str(result.id)


# ---------------------------------------------------------------------- the API
def test_tasks_by_state_name_and_queue(djapp, staff):
    mine = [_publish(djapp, n) for n in range(3)]
    other = djapp.flaky_import.apply_async(("k",), queue="search-other").id
    client = login(staff)
    listed = ids_of(client.get(f"{API}/tasks?name=djproj.import_order&state=submitted"))
    # newest first; two published in the same millisecond may come either way
    assert set(listed[:3]) == set(mine)
    rows = client.get(f"{API}/tasks?name=djproj.import_order&state=submitted").json()
    stamps = [r["submitted_at"] for r in rows["results"][:3]]
    assert stamps == sorted(stamps, reverse=True)
    assert other not in listed
    assert ids_of(client.get(f"{API}/tasks?queue=search-other")) == [other]
    assert len(ids_of(client.get(f"{API}/tasks?limit=2"))) == 2
    row = client.get(f"{API}/tasks?limit=1").json()["results"][0]
    assert {"task_id", "name", "state", "queue", "submitted_at"} <= set(row)
    for query, field in (("state=bogus", "state"), ("limit=0", "limit"), ("limit=x", "limit"),
                         ("nope=1", "nope"), ("name=a&name=b", "name"), ("queue=", "queue")):
        assert_bad(client.get(f"{API}/tasks?{query}"), field)


def test_task_search_through_the_index_and_by_the_bounded_search(djapp, staff):
    order = int(uuid.uuid4().int % 10**9)
    found = _publish(djapp, order, card_number=CARD, note=f"n-{order}")
    _publish(djapp, order + 1)
    client = login(staff)
    response = client.get(f"{API}/task-search?arg=order_id&value={order}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert ids_of(response) == [found]
    assert body["indexed"] == ["djproj.import_order"]
    assert body["how"] == "indexed argument (for djproj.import_order)"
    assert CARD not in response.content.decode()
    # not indexed: the newest records that hold their arguments are read
    scanned = client.get(f"{API}/task-search?arg=note&value=n-{order}"
                         "&name=djproj.import_order").json()
    assert [r["task_id"] for r in scanned["results"]] == [found]
    assert scanned["indexed"] == []
    assert 2 <= scanned["examined"] <= scanned["of"]
    assert scanned["how"].startswith("searched the arguments of the last ")


@pytest.mark.parametrize(("query", "field"), [
    ("value=1", "arg"), ("arg=order_id", "value"), ("arg=a%20b&value=1", "arg"),
    ("arg=card_number&value=1", "arg"), ("arg=order_id&value=%20", "value"),
    ("arg=order_id&value=1&limit=0", "limit"), ("arg=order_id&value=1&nope=1", "nope"),
    ("arg=order_id&value=" + "x" * 257, "value"),
])
def test_task_search_refuses_bad_input_naming_the_parameter(djapp, staff, query, field):
    assert_bad(login(staff).get(f"{API}/task-search?{query}"), field)


def test_failure_groups_and_counts(make_entries, staff, djapp):
    make_entries(3)
    make_entries(1, name="djproj.big_import", exception_type="builtins.KeyError",
                 exception_message="no such row")
    client = login(staff)
    body = client.get(f"{API}/failure-groups").json()
    assert body["count"] == FailureGroup.objects.count() >= 2
    assert body["count_capped"] is False
    names = [g["task_name"] for g in body["results"]]
    assert names[0] == "djproj.big_import"  # newest last failure first
    row = body["results"][0]
    assert {"fingerprint", "exception_type", "message", "failures", "dead", "first_seen",
            "last_seen"} <= set(row)
    only = client.get(f"{API}/failure-groups?task_name=djproj.big_import").json()
    assert [g["exception_type"] for g in only["results"]] == ["builtins.KeyError"]
    most = client.get(f"{API}/failure-groups?ordering=-failures&dead=true").json()
    assert most["results"][0]["task_name"] == "djproj.flaky_import"
    for query, field in (("ordering=name", "ordering"), ("dead=maybe", "dead"),
                         ("limit=1001", "limit"), ("x=1", "x")):
        assert_bad(client.get(f"{API}/failure-groups?{query}"), field)
    _publish(djapp, 7)
    counts = client.get(f"{API}/counts").json()
    assert set(counts["tasks"]) == {s.value for s in TaskState}
    assert counts["tasks"]["submitted"] >= 1
    assert counts["total"] == sum(counts["tasks"].values())
    assert counts["dead_letters"] == 4
    assert counts["failure_groups"] == FailureGroup.objects.filter(dead__gt=0).count()
    assert_bad(client.get(f"{API}/counts?x=1"), "x")


@pytest.mark.parametrize("path", ["tasks", "task-search?arg=order_id&value=1",
                                  "failure-groups", "counts"])
def test_every_new_endpoint_needs_the_read_rule(db, djapp, staff, outsider, path):
    anonymous = Client().get(f"{API}/{path}")
    assert anonymous.status_code == 401
    assert login(outsider).get(f"{API}/{path}").status_code == 403
    assert login(staff).get(f"{API}/{path}").status_code == 200


# ---------------------------------------------------------------------- the admin
def test_the_find_page_by_id_and_by_argument(djapp, staff, client):
    client.force_login(staff)
    task_id = _publish(djapp, 55, card_number=CARD)
    sent = client.get(reverse(FIND), {"id": f" {task_id} "})
    assert sent.status_code == 302
    assert sent["Location"] == reverse("admin:jobbers_task", args=[task_id])
    assert client.get(reverse(FIND), {"id": ""}).status_code == 400
    assert client.get(reverse(FIND), {"id": "x" * 1025}).status_code == 400
    page = client.get(reverse(FIND), {"arg": "order_id", "value": "55"})
    assert page.status_code == 200
    text = page.content.decode()
    assert task_id in text
    assert "indexed argument (for djproj.import_order)" in text
    assert CARD not in text
    refused = client.get(reverse(FIND), {"arg": "card_number", "value": CARD})
    assert refused.status_code == 400
    assert "redacted key" in refused.content.decode()
    assert client.get(reverse(FIND)).status_code == 200  # the empty form


def test_the_find_box_is_on_every_jobbers_page_and_needs_the_read_rule(db, djapp, staff,
                                                                       outsider, client):
    client.force_login(staff)
    for name in ("admin:jobbers_live", "admin:app_list", "admin:jobbers_find",
                 "admin:jobbers_deadletterentry_changelist",
                 "admin:jobbers_failuregroup_changelist"):
        args = ["jobbers"] if name == "admin:app_list" else []
        page = client.get(reverse(name, args=args)).content.decode()
        assert 'id="jobbers-find-id"' in page, name
        assert '<label for="jobbers-find-id">' in page, name
    client.force_login(outsider)
    assert client.get(reverse(FIND), {"id": "x"}).status_code in (302, 403)


# ---------------------------------------------------------------------- end to end
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_order_91800_is_found_by_the_api_the_admin_and_the_cli(djapp, jobbers, dj_worker,
                                                              staff):
    done = djapp.import_order.apply_async(kwargs={"order_id": 91800, "card_number": CARD})
    wait_state(jobbers, done.id, S.COMPLETED)
    assert "msg" not in jobbers.store.get_raw(done.id)  # no arguments left to read
    client = login(staff)
    api = client.get(f"{API}/task-search?arg=order_id&value=91800")
    assert done.id in ids_of(api)
    page = client.get(reverse(FIND), {"arg": "order_id", "value": "91800"}).content.decode()
    assert done.id in page
    env = subprocess_env({"DJANGO_SETTINGS_MODULE": "tests.django.settings",
                          "JOBBERS_TEST_DB_NAME": connection.settings_dict["NAME"],
                          "COLUMNS": "250"})
    cli = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.django.celery_app",
                          "jobbers", "find", "--arg", "order_id=91800"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180, check=False)
    assert cli.returncode == 0, cli.stderr
    assert done.id in cli.stdout
    for shown in (api.content.decode(), page, cli.stdout + cli.stderr):
        assert CARD not in shown
