"""Every page and endpoint renders every id Celery runs: a newline, ``/``, ``..``, ``%``,
``?``, ``#``, ``<script>``, spaces, non-ASCII, control characters, 1,000 characters, the
empty id. The admin's links carry any id in a readable, reversible form
(:mod:`jobbers_django.converters`); the REST API takes the percent-encoded id on its contract
paths; ``manage.py jobbers_dlq`` finds such an entry and prints it escaped. Never a 500."""

from __future__ import annotations

import dataclasses
import html
import io
import json
from typing import Any
from urllib.parse import quote, unquote

import pytest
from django.core.management import CommandError, call_command
from django.urls import resolve, reverse
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import TaskState, printable, storable_id
from jobbers_django import runs
from jobbers_django.api.serializers.fields import TASK_ID_MAX_LENGTH
from jobbers_django.converters import decode_task_id, encode_task_id
from jobbers_django.fields import TaskIdField, TaskIdsField
from jobbers_django.models import DeadLetterEntry, ResubmitRunItem
from jobbers_django.services import Selection
from jobbers_django.sink import write_entry
from tests.django.api_helpers import API, assert_bad, login, post
from tests.django.conftest import dead_letter
from tests.integration.store_helpers import put_in_state

S = TaskState
#: Ids a publisher may choose, each with a Redis record and a dead letter.
HOSTILE = {
    "newline": "line\nbreak",
    "slash": "a/b",
    "dotdot": "..",
    "dot": ".",
    "percent": "100%25%",
    "query": "?x=1#frag",
    "script": "<script>alert(1)</script>",
    "spaces": " two words ",
    "unicode": "日本語-✓-é",
    "escape": "\x1b]0;pwned\x07\x1b[2J",
    "bidi": "\u202eevil",
    "cancel-suffix": "a/cancel",
    "run-route": "resubmit-runs/1",
    "tilde": "~2F~",
    "empty": "",
    "nul": "a\x00b",  # PostgreSQL holds it escaped (jobbers_celery.storable_id)
    "long": "x" * 1000,  # and this one cut, with a hash
}

#: Any code point: controls, surrogates, private use, unassigned.
ANY_ID = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
NAME = "djproj.\x1b]0;pwned\x07flaky\r\x1b[2J"


def api_path(task_id: str) -> str:
    """How a client puts an id in a path (docs/howto/rest-api.md): percent-encoded, ``/``
    included; an id of dots only as ``%2E`` (else a client folds the dot-segment)."""
    encoded = quote(task_id, safe="", errors="surrogatepass")
    return encoded.replace(".", "%2E") if set(task_id) == {"."} else encoded


# ---------------------------------------------------------------------- URL forms
@given(ANY_ID)
def test_any_id_reverses_and_resolves_back_in_the_admin(task_id: str) -> None:
    for name in ("admin:jobbers_task", "admin:jobbers_cancel"):
        url = reverse(name, args=[task_id])
        # nothing a browser, proxy or server decodes or folds: unreserved ASCII, no
        # empty or dot segment
        assert url == quote(url, safe="/:@+~")
        assert all(segment not in ("", ".", "..") for segment in url.strip("/").split("/"))
        assert resolve(unquote(url)).kwargs == {"task_id": task_id}


@given(ANY_ID)
def test_any_percent_encoded_id_resolves_on_the_api_paths(task_id: str) -> None:
    # the server decodes the path (%2F included) before routing
    detail = resolve(unquote(f"{API}/tasks/{api_path(task_id)}", errors="surrogatepass"))
    history = resolve(unquote(f"{API}/dead-letter-queue/{api_path(task_id)}/history",
                              errors="surrogatepass"))
    cancel = resolve(unquote(f"{API}/tasks/{api_path(task_id)}/cancel",
                             errors="surrogatepass"))
    assert history.url_name == "dead-letter-history"
    assert history.kwargs == cancel.kwargs == {"task_id": task_id}
    assert cancel.url_name == "task-cancel"
    if not task_id.endswith("/cancel"):  # else the method decides (see the test below)
        assert (detail.url_name, detail.kwargs) == ("task-detail", {"task_id": task_id})


@given(ANY_ID)
def test_the_columns_compare_any_id_in_its_storable_form(task_id: str) -> None:
    prepared = TaskIdField(max_length=255).get_prep_value(task_id)
    assert prepared == storable_id(task_id) == storable_id(prepared)  # idempotent
    assert len(prepared) <= 255
    assert "\x00" not in prepared
    assert TaskIdsField().get_prep_value([task_id]) == [prepared]


@pytest.mark.parametrize(("task_id", "form"), [
    ("5f0c1b2a-9d3e-4c1b-8a7f-0e6d5c4b3a21", "5f0c1b2a-9d3e-4c1b-8a7f-0e6d5c4b3a21"),
    ("celery@host:12.3+x", "celery@host:12.3+x"),
    ("a/b", "a~2Fb"), ("", "~"), ("..", "~2E~2E"), ("~", "~7E"), ("a\nb", "a~0Ab"),
    ("é", "~C3~A9"),
])
def test_common_ids_stay_readable(task_id: str, form: str) -> None:
    assert encode_task_id(task_id) == form
    assert decode_task_id(form) == task_id


@pytest.mark.parametrize("bad", ["~2f", "~G0", "a~2", "~FF", "a b", "a/b"])
def test_a_form_no_id_has_is_no_task_page_and_no_500(bad: str, client: Any,
                                                     staff: Any) -> None:
    with pytest.raises(ValueError, match=r"not a task id's URL form|invalid continuation|"
                       r"invalid start byte"):
        decode_task_id(bad)
    path = f"/admin/jobbers/deadletterentry/live/task/{bad}/"
    assert resolve(path).url_name != "jobbers_task"  # the admin's own catch-all, if any
    client.force_login(staff)
    assert client.get(quote(path), follow=True).status_code in (200, 404)


# ---------------------------------------------------------------------- pages
@pytest.fixture
def hostile(jobbers: Any, db: None) -> dict[str, str]:
    """A Redis record (scheduled, so cancellable) and a dead letter for every id; every
    name holds terminal escapes."""
    for task_id in HOSTILE.values():
        put_in_state(jobbers.store, task_id, S.SCHEDULED, name=NAME, queue=NAME)
        entry = dead_letter(name=NAME, queue=NAME,
                            exception_message="boom\x1b[2J\rforged\nline")
        write_entry(dataclasses.replace(entry, task_id=task_id))  # the empty one too
    return HOSTILE


def test_the_admin_renders_every_page_of_a_hostile_id(hostile: Any, client: Any,
                                                      operator: Any, jobbers: Any) -> None:
    client.force_login(operator)
    live = client.get(reverse("admin:jobbers_live"))
    assert live.status_code == 200
    for task_id in hostile.values():
        admin_pages(client, jobbers, task_id, live.content.decode())


def admin_pages(client: Any, jobbers: Any, task_id: str, live: str) -> None:
    task_url = reverse("admin:jobbers_task", args=[task_id])
    assert f'href="{task_url}"' in live
    page = client.get(task_url)
    assert page.status_code == 200
    assert page.context["task_id"] == task_id
    assert f"<title>Task {html.escape(printable(task_id))} |" in page.content.decode()
    assert page.context["lifecycle"]["record"].task_id == task_id
    cancel_url = reverse("admin:jobbers_cancel", args=[task_id])
    assert f'href="{cancel_url}"' in page.content.decode()
    entry = DeadLetterEntry.objects.get(task_id=task_id)  # by the task's own id
    assert page.context["entry"] == entry
    detail = client.get(reverse("admin:jobbers_deadletterentry_change", args=[entry.pk]))
    assert detail.status_code == 200
    assert html.escape(storable_id(task_id)) in detail.content.decode()
    confirm = client.get(cancel_url)
    assert confirm.status_code == 200
    assert f"Cancel task <code>{html.escape(printable(task_id))}</code>" in confirm.content.decode()
    for shown in (live, page.content.decode(), confirm.content.decode()):
        # ids, names, workers shown escaped, as in the CLI: no ESC, no bidi override
        assert not {"\x1b", "\u202e", "\x07", "\r"} & set(shown)
    done = client.post(cancel_url, {"terminate": "0"})
    assert done.status_code == 302
    assert jobbers.get(task_id).state is S.CANCELLED


def test_the_paced_run_page_links_every_hostile_id(hostile: Any, client: Any,
                                                   operator: Any) -> None:
    run = runs.start(Selection(task_ids=tuple(HOSTILE.values())), runs.Pace(3, None, None),
                     user=operator)
    ResubmitRunItem.objects.filter(run=run).update(published_at=timezone.now())
    client.force_login(operator)
    page = client.get(reverse("admin:jobbers_resubmitrun_change", args=[run.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    # a run takes the entries it can publish: not those stored altered (NUL, 1,000 chars)
    for task_id in HOSTILE.values():
        link = f'href="{reverse("admin:jobbers_task", args=[task_id])}"'
        assert (link in text) == (storable_id(task_id) == task_id)
    for name in ("deadletterentry", "failuregroup", "deadletteraudit", "resubmitrun"):
        assert client.get(reverse(f"admin:jobbers_{name}_changelist")).status_code == 200
    pks = [str(pk) for pk in DeadLetterEntry.objects.values_list("pk", flat=True)]
    confirm = client.post(reverse("admin:jobbers_deadletterentry_changelist"),
                          {"action": "resubmit_selected", "_selected_action": pks})
    assert confirm.status_code == 200
    for task_id in HOSTILE.values():
        assert f"<code>{html.escape(storable_id(task_id))}</code>" in confirm.content.decode()


# ---------------------------------------------------------------------- REST API
def test_the_api_finds_every_hostile_id(hostile: Any, operator: Any, jobbers: Any) -> None:
    client = login(operator)
    for task_id in hostile.values():
        api_reads_and_cancel(client, jobbers, task_id)


def api_reads_and_cancel(client: Any, jobbers: Any, task_id: str) -> None:
    detail = client.get(f"{API}/tasks/{api_path(task_id)}")
    assert detail.status_code == 200, detail.content
    assert detail.json()["task_id"] == task_id
    assert detail.json()["record"]["name"] == NAME
    history = client.get(f"{API}/dead-letter-queue/{api_path(task_id)}/history")
    assert history.status_code == 200, history.content
    assert history.json()["task_id"] == storable_id(task_id)  # as stored
    assert detail.json()["dead_letter"]["task_id"] == storable_id(task_id)
    cancelled = post(client, f"tasks/{api_path(task_id)}/cancel", {})
    assert cancelled.status_code == 200, cancelled.content
    assert (cancelled.json()["task_id"], cancelled.json()["outcome"]) == (task_id, "cancelled")
    assert jobbers.get(task_id).state is S.CANCELLED


def test_an_id_ending_in_cancel_is_read_with_get_and_cancelled_with_post(
        hostile: Any, operator: Any, jobbers: Any) -> None:
    put_in_state(jobbers.store, "a", S.SCHEDULED)
    client = login(operator)
    # GET tasks/a/cancel is the task "a/cancel" (the server decoded %2F)
    assert client.get(f"{API}/tasks/a/cancel").json()["task_id"] == "a/cancel"
    assert post(client, "tasks/a/cancel", {}).json()["task_id"] == "a"
    assert jobbers.get("a").state is S.CANCELLED
    assert jobbers.get("a/cancel").state is S.SCHEDULED


def test_only_an_id_over_the_bound_is_a_400(operator: Any, db: None) -> None:
    client = login(operator)
    assert client.get(f"{API}/tasks/{'x' * TASK_ID_MAX_LENGTH}").status_code == 404
    assert_bad(client.get(f"{API}/tasks/{'x' * (TASK_ID_MAX_LENGTH + 1)}"), "task_id")
    assert_bad(post(client, "dead-letter-queue/resubmit",
                    {"task_ids": ["x" * (TASK_ID_MAX_LENGTH + 1)]}), "task_ids")
    listed = post(client, "dead-letter-queue/resubmit",
                  {"task_ids": list(HOSTILE.values()), "dry_run": True})
    assert listed.status_code == 200, listed.content
    # a lone surrogate (JSON allows "\\ud800") is no UTF-8: no store holds it
    assert_bad(post(client, "dead-letter-queue/discard", {"task_ids": ["a\ud800"]}),
               "task_ids")
    with pytest.raises(CommandError, match="not UTF-8") as refused:
        run_command("show", "a\udcff")  # the shell's byte 0xff
    assert refused.value.returncode == 2


# ---------------------------------------------------------------------- manage.py
def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("jobbers_dlq", *args, stdout=out)
    return out.getvalue()


def terminal_safe(text: str) -> bool:
    return all(c == "\n" or c.isprintable() for c in text)


def test_the_dlq_command_shows_every_hostile_id_escaped(hostile: Any) -> None:
    for task_id in HOSTILE.values():
        dlq_show(task_id)


def dlq_show(task_id: str) -> None:
    shown = run_command("show", task_id)
    assert terminal_safe(shown), shown
    assert "\\x1b]0;pwned\\x07" in shown  # the name, escaped
    shown_json = json.loads(run_command("show", task_id, "--json"))
    assert shown_json["entry"]["task_id"] == storable_id(task_id)
    lines = shown.splitlines()
    assert lines[0].split(None, 2)[:2] == ["task", "id"]


def test_the_dlq_list_is_one_escaped_line_per_entry(hostile: Any) -> None:
    table = run_command("list", "--queue", NAME)
    assert terminal_safe(table), table
    assert len(table.splitlines()) == 1 + len(HOSTILE) + 1  # header, rows, the count
    assert "boom\\x1b[2J\\rforged\\nline" in table


def test_a_record_holding_what_no_page_renders_is_shown_escaped(jobbers: Any, db: None,
                                                                client: Any,
                                                                operator: Any) -> None:
    """An exception message or a progress value built from a publisher's arguments may hold a
    lone surrogate or NaN: the task page and the API answered 500."""
    task_id = "odd-values"
    put_in_state(jobbers.store, task_id, S.FAILED)
    key = jobbers.store.keys_of(task_id).task(task_id)
    jobbers.store.client.hset(key, mapping={
        "err": json.dumps({"type": "ValueError", "message": "bad \ud800 and \x00 here"}),
        "progress": json.dumps({"item": "p\ud800", "ratio": float("nan")}),
    })
    client.force_login(operator)
    for url in (reverse("admin:jobbers_live"), reverse("admin:jobbers_task", args=[task_id]),
                reverse("admin:jobbers_cancel", args=[task_id])):
        assert client.get(url).status_code == 200, url
    answer = client.get(f"{API}/tasks/{task_id}")
    assert answer.status_code == 200
    record = answer.json()["record"]
    assert record["error"]["message"] == "bad \\ud800 and \\u0000 here"
    assert record["progress"] == {"item": "p\\ud800", "ratio": "NaN"}
