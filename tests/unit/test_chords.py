"""jobbers_celery.lifecycle.chords without a network: which dead letters a discard releases,
what a release tells the result backend, and the chord_unlock poll's verdicts (the real
backends: tests/integration/test_chords.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, states
from celery.app.task import Context
from celery.backends.base import DisabledBackend
from celery.backends.cache import CacheBackend
from celery.backends.redis import RedisBackend
from celery.exceptions import ChordError

from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import TaskState
from jobbers_celery.lifecycle import chords

S = TaskState
CALLBACK = {"task": "t.collect", "args": [], "kwargs": {}, "options": {"task_id": "cb-1"},
            "subtask_type": None, "immutable": False}


def _entry(task_id: str = "m-1", attempt: int = 1, **options: Any) -> DeadLetter:
    return DeadLetter(
        task_id=task_id, name="t.member", version=1, queue="celery", reason="failed",
        args=[1], kwargs={}, exception_type="builtins.ValueError",
        exception_message="not fixed", traceback=None, attempt=attempt, retry_attempt=0,
        worker="w@h", failed_at=datetime(2026, 12, 6, tzinfo=UTC),
        options={"chord": CALLBACK, "group_id": "g-1", "group_index": 1, **options})


def test_hold_clears_the_chord_of_a_member_only() -> None:
    member = Context(id="m-1", chord=CALLBACK, group="g-1")
    assert chords.hold(member)
    assert member.chord is None
    assert getattr(member, chords.HELD)
    alone = Context(id="t-1", chord=None)
    assert not chords.hold(alone)


@pytest.mark.parametrize(("options", "found"), [
    ({"chord": CALLBACK, "group_id": "g", "group_index": 0}, (CALLBACK, "g", 0)),
    ({"chord": CALLBACK, "group_id": "g"}, (CALLBACK, "g", None)),
    ({"group_id": "g", "group_index": 0}, None),  # a group member, no chord
    ({"chord": "not a signature", "group_id": "g"}, None),
    ({"chord": CALLBACK, "group_id": ""}, None),
    ({"chord": CALLBACK, "group_id": "g" * 256}, None),  # bounded: it came in a message
    ({"chord": CALLBACK, "group_id": 7}, None),
    ({"chord": CALLBACK, "group_id": "g", "group_index": True}, None),
    ({"chord": CALLBACK, "group_id": "g", "group_index": "1"}, None),
])
def test_chord_of_reads_only_what_a_message_holds(options: dict[str, Any], found: Any) -> None:
    assert chords.chord_of(options) == found


def test_releasable_only_members_still_dead_at_that_attempt() -> None:
    dead, older, resubmitted, expired = (_entry("dead"), _entry("older", attempt=1),
                                         _entry("again"), _entry("expired"))
    not_chord = _entry("plain")
    not_chord.options.pop("chord")
    now = {"dead": (S.FAILED, 1), "older": (S.FAILED, 2), "again": (S.SUBMITTED, 2),
           "expired": None, "plain": (S.FAILED, 1)}
    got = chords.releasable([dead, older, resubmitted, expired, not_chord, dead], now)
    assert [e.task_id for e in got] == ["dead", "expired"]
    stalled = _entry("stalled")
    assert chords.releasable([stalled], {"stalled": (S.STALLED, 1)}) == [stalled]


class CountingBackend(RedisBackend):
    """Celery's Redis backend class (a native chord counter), without a server: what a
    release tells it."""

    def __init__(self, app: Celery, stored: dict[str, Any]) -> None:
        self.app = app
        self.stored = stored
        self.parts: list[tuple[Context, str, BaseException]] = []

    def get_task_meta(self, task_id: str, cache: bool = True) -> dict[str, Any]:
        return self.stored.get(task_id) or {"status": states.PENDING, "result": None}

    def on_chord_part_return(self, request: Any, state: str, result: Any,
                             **kwargs: Any) -> None:
        self.parts.append((request, state, result))


def test_release_counts_the_part_failed_with_the_stored_exception() -> None:
    app = Celery("chords_release", set_as_current=False)
    stored = ValueError("not fixed")
    backend = CountingBackend(app, {"m-1": {"status": states.FAILURE, "result": stored}})
    app._local.backend = backend  # type: ignore[attr-defined]
    assert chords.release(app, [_entry("m-1")]) == ["m-1"]
    ((request, state, exc),) = backend.parts
    assert (request.id, request.group, request.group_index, request.chord) == (
        "m-1", "g-1", 1, CALLBACK)
    assert state == states.FAILURE
    assert exc is stored


def test_release_of_a_member_that_never_stored_a_result() -> None:
    """A stalled member stored nothing: the part counts a DeadLetterDiscarded."""
    app = Celery("chords_release_stalled", set_as_current=False)
    backend = CountingBackend(app, {})
    app._local.backend = backend  # type: ignore[attr-defined]
    assert chords.release(app, [_entry("m-2")]) == ["m-2"]
    ((_, _, exc),) = backend.parts
    assert isinstance(exc, chords.DeadLetterDiscarded)
    assert isinstance(exc, ChordError)
    assert "m-2" in str(exc)
    assert "builtins.ValueError: not fixed" in str(exc)


def test_a_backend_error_leaves_the_part_held() -> None:
    app = Celery("chords_release_error", set_as_current=False)

    class Broken(CountingBackend):
        def on_chord_part_return(self, request: Any, state: str, result: Any,
                                 **kwargs: Any) -> None:
            raise ConnectionError("result backend away")

    app._local.backend = Broken(app, {})  # type: ignore[attr-defined]
    assert chords.release(app, [_entry("m-3")]) == []


def test_which_backends_poll() -> None:
    app = Celery("chords_polls", set_as_current=False)
    assert not chords.polls(RedisBackend(app=app, url="redis://localhost:1/0"))
    assert not chords.polls(CacheBackend(app=app, backend="memory"))  # it has INCR
    assert chords.polls(DisabledBackend(app=app))


class Result:
    def __init__(self, task_id: str, state: str) -> None:
        self.id, self.state = task_id, state


def test_unlock_verdicts() -> None:
    app = Celery("chords_unlock", backend="cache+memory://", set_as_current=False)
    rows: dict[str, list[str | None]] = {"m-1": [S.FAILED.value, "1"],
                                         "m-2": [S.FAILED.value, "0"]}
    reads: list[list[str]] = []

    def fields(ids: Any, names: Any) -> list[list[str | None]]:
        reads.append(list(ids))
        return [rows.get(i, [None, None]) for i in ids]

    ok, failed = Result("ok", states.SUCCESS), Result("m-1", states.FAILURE)
    assert chords.unlock_verdict(app, CALLBACK, [ok, Result("p", states.PENDING)],
                                 fields) is chords.Unlock.PENDING
    assert chords.unlock_verdict(app, CALLBACK, [ok, ok], fields) is chords.Unlock.CELERY
    assert reads == []  # the records are read only when a member failed
    assert chords.unlock_verdict(app, CALLBACK, [ok, failed], fields) is chords.Unlock.WAIT
    # a member that does not save dead letters fails the chord as in Celery
    assert chords.unlock_verdict(app, CALLBACK, [ok, Result("m-2", states.FAILURE)],
                                 fields) is chords.Unlock.CELERY
    # resubmitted since (its record submitted): Celery's poll (it sees it not ready later)
    rows["m-1"] = [S.SUBMITTED.value, "1"]
    assert chords.unlock_verdict(app, CALLBACK, [ok, failed], fields) is chords.Unlock.CELERY
    # a discard failed the callback: the poll ends
    rows["m-1"] = [S.FAILED.value, "1"]
    app.backend.store_result("cb-1", ChordError("discarded"), states.FAILURE)
    assert chords.unlock_verdict(app, CALLBACK, [ok, failed], fields) is chords.Unlock.DONE
