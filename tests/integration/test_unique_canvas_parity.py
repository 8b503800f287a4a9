"""A unique task's duplicate in a canvas, side by side with plain Celery (real prefork
workers, one per variant, tests/integration/unique_canvas_proj.py): the same canvas where
one task is, in the plain project, revoked before it ran (``app.control.revoke`` of its id,
the worker up, then the canvas published) and, in the jobbers project, a duplicate of a
copy that holds its key (not sent, stored REVOKED at the publish, or by the worker that
publishes a chord's callback).

What the caller sees is the same: a group's ``get()`` raises ``TaskRevokedError`` (its
place holds one with ``propagate=False``), a chord whose header member is revoked fails its
callback with ``ChordError: Dependency <id> raised TaskRevokedError(...)``, a chord whose
callback is revoked has that callback REVOKED, and so has a chain whose later link is
revoked (the worker publishing it). Only the reason differs (``revoked`` /
the holder named).

Chains differ on purpose: Celery does not carry a revoke along a chain (its worker stores
the revoked link alone; the later links stay PENDING, whatever they are, a group's and a
chord's too), whereas a duplicate first link is never sent and neither is the rest, so
jobbers stores every task of the rest REVOKED (what ``Backend._fail_chain`` does for a
failed link, group members and a chord's header included): the caller's ``get()`` raises
``TaskRevokedError`` instead of waiting for ever. The chain cases assert both sides.
"""

from __future__ import annotations

import gc
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery, chord, group
from celery import states as celery_states
from celery.canvas import Signature
from celery.exceptions import ChordError, TaskRevokedError

from jobbers_celery import Jobbers
from tests.conftest import RedisServer, Worker, start_worker, wait_for
from tests.integration import unique_canvas_proj as proj

pytestmark = [pytest.mark.redis, pytest.mark.worker]

MODULE = "tests.integration.unique_canvas_proj"
#: Each variant's database on the session's server (broker, results, jobbers' store).
DB = {"plain": 8, "jobbers": 9}
TIMEOUT = 30


@dataclass
class Side:
    variant: str
    app: Celery
    worker: Worker

    def task(self, name: str) -> Any:
        return self.app.tasks[f"uqc.{name}"]

    def revoked(self, name: str, key: str) -> tuple[Signature[Any], str]:
        """A signature of task ``name`` (``member`` or ``callback``) for ``key`` that will
        not run: revoked by Celery before it is published (plain), or a duplicate of a copy
        holding ``key`` (jobbers). Returns it and the text its reason holds."""
        task_id = str(uuid.uuid4())
        task = self.task(name)
        sig = task.s(key) if name == "member" else task.s(key=key)
        if self.variant == "plain":
            replies = self.app.control.revoke(task_id, reply=True, timeout=5,
                                              destination=[self.worker.name])
            assert replies, "the worker did not answer the revoke"
            return sig.set(task_id=task_id), "revoked"
        args: Any = (key,) if name == "member" else ([],)
        kwargs = {} if name == "member" else {"key": key}
        holder = task.apply_async(args, kwargs, queue=proj.IDLE)  # holds key, never runs
        return sig.set(task_id=task_id), holder.id

    def drained(self) -> None:
        """Once this returns, the worker has received every message published before (one
        queue, in order): a task published now has returned."""
        assert self.task("total").delay([1]).get(timeout=TIMEOUT) == 1


def keys(n: int) -> list[str]:
    return [f"k{i}-{uuid.uuid4().hex[:10]}" for i in range(n)]


@pytest.fixture(scope="module")
def sides(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Side]]:
    import redis

    log_dir = tmp_path_factory.mktemp("uqc")
    built: dict[str, Side] = {}
    try:
        for variant, db in DB.items():
            url = redis_server.url(db)
            with redis.Redis.from_url(url) as client:
                client.flushdb()
            app = proj.build(variant, url)
            worker = start_worker(app, MODULE, log_dir, concurrency=2,
                                  env={"UNIQUE_CANVAS_VARIANT": variant,
                                       "UNIQUE_CANVAS_URL": url})
            built[variant] = Side(variant, app, worker)
        yield built
    finally:
        gc.collect()  # the results' handles unsubscribe while the backend's Redis is up
        for side in built.values():
            side.worker.kill()
            close(side.app)
        built.clear()
        gc.collect()  # a socket left open warns here, not in a later test


def close(app: Celery) -> None:
    """The client app's connections (a socket left open fails a later test's collect)."""
    jobbers = Jobbers.find(app)
    if jobbers is not None:
        jobbers.store.client.close()
    backend: Any = app.backend
    # a result still waited on (the backend holds it) unsubscribes when it is collected, and
    # that would connect again: it has nothing to unsubscribe once the pubsub is closed
    backend.result_consumer.stop()
    backend.result_consumer.subscribed_to.clear()
    backend.client.connection_pool.disconnect()
    app.close()


Scenario = Callable[[Side], dict[str, Any]]


def both(sides: dict[str, Side], scenario: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    return scenario(sides["plain"]), scenario(sides["jobbers"])


def error_of(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - its type is what is compared
        return type(exc).__name__
    return "no error"


def group_member(side: Side) -> dict[str, Any]:
    a, b, held = keys(3)
    member = side.task("member")
    revoked, reason = side.revoked("member", held)
    result: Any = group(member.s(a), revoked, member.s(b)).apply_async()
    values = result.get(propagate=False, timeout=TIMEOUT)
    assert [values[0], values[2]] == [a, b]
    assert reason in str(values[1])
    return {
        "values": ["value", type(values[1]).__name__, "value"],
        "get": error_of(lambda: result.get(timeout=TIMEOUT)),
        "states": [r.state for r in result.results],
    }


def chord_header_member(side: Side) -> dict[str, Any]:
    a, b, held = keys(3)
    member = side.task("member")
    revoked, reason = side.revoked("member", held)
    callback: Any = chord([member.s(a), revoked, member.s(b)],
                          side.task("total").s()).apply_async()
    error = callback.get(propagate=False, timeout=TIMEOUT)  # the callback's own outcome
    assert re.match(rf"Dependency {revoked.id} raised TaskRevokedError\(.*{reason}", str(error))
    header = callback.parent
    return {
        "callback": type(error).__name__,
        "callback state": callback.state,
        "get": error_of(lambda: callback.get(timeout=TIMEOUT)),  # the header's error first
        "header states": [r.state for r in header.results],
        "others": [r.get(timeout=TIMEOUT) == k
                   for r, k in ((header.results[0], a), (header.results[2], b))],
    }


def chord_callback(side: Side) -> dict[str, Any]:
    a, b, held = keys(3)
    member = side.task("member")
    revoked, reason = side.revoked("callback", held)
    callback: Any = chord([member.s(a), member.s(b)], revoked).apply_async()
    assert callback.id == revoked.id
    with pytest.raises(TaskRevokedError, match=reason):
        callback.get(timeout=TIMEOUT)
    return {
        "callback state": callback.state,
        "header": [r.get(timeout=TIMEOUT) for r in callback.parent.results] == [a, b],
    }


def chain_later_link(side: Side) -> dict[str, Any]:
    """A worker publishes the chain's next link when the first returned (its last: with
    ``chain=[]``)."""
    a, held = keys(2)
    revoked, reason = side.revoked("callback", held)
    last: Any = (side.task("member").s(a) | revoked).apply_async()
    with pytest.raises(TaskRevokedError, match=reason):
        last.get(timeout=TIMEOUT)
    # the worker publishes the next link before it stores the first's result
    first = last.parent.get(timeout=TIMEOUT) == a
    return {"states": [last.parent.state, last.state], "first": first}


@pytest.mark.parametrize("scenario", [group_member, chord_header_member, chord_callback,
                                      chain_later_link], ids=lambda f: f.__name__)
def test_the_caller_sees_what_a_member_revoked_before_it_ran_shows(
        sides: dict[str, Side], scenario: Scenario) -> None:
    plain, jobbers = both(sides, scenario)
    assert jobbers == plain
    assert any(celery_states.REVOKED in str(v) for v in plain.values())


def chain_of(side: Side, shape: str) -> tuple[Any, Signature[Any], str]:
    (held,) = keys(1)
    total = side.task("total")
    first, reason = side.revoked("member", held)
    rest: Any = {
        "links": total.s() | total.s(),
        "group": group(total.s(), total.s()),
        "chord": chord([total.s(), total.s()], total.s()),
    }[shape]
    return (first | rest).apply_async(), first, reason


def waited_on(result: Any) -> list[Any]:
    """The results a chain's caller may wait on: its last (a group's members) and the
    parents up to its first link's."""
    out: list[Any] = []
    while result is not None:
        out.extend(getattr(result, "results", None) or [result])
        result = result.parent
    return out


@pytest.mark.parametrize("shape", ["links", "group", "chord"])
def test_a_chain_whose_first_link_is_revoked_waits_in_celery_and_ends_in_jobbers(
        sides: dict[str, Side], shape: str) -> None:
    plain_last, plain_first, _ = chain_of(sides["plain"], shape)
    sides["plain"].drained()  # its worker received the revoked link and dropped it
    assert sides["plain"].app.AsyncResult(plain_first.id).state == celery_states.REVOKED
    later = [r for r in waited_on(plain_last) if r.id != plain_first.id]
    assert later
    assert all(r.state == celery_states.PENDING for r in later)  # for ever

    last, first, holder = chain_of(sides["jobbers"], shape)
    with pytest.raises(TaskRevokedError, match=holder):
        last.get(timeout=TIMEOUT)
    ended = waited_on(last)
    assert first.id in [r.id for r in ended]
    assert all(r.state == celery_states.REVOKED for r in ended)
    if shape == "chord":  # its callback's result (the chain's) and its header's members
        assert last.parent.results


def test_a_chord_whose_header_member_is_a_chain_with_a_duplicate_first_link_fails(
        sides: dict[str, Side]) -> None:
    """Celery's revoked first link leaves the chain's last link, and so the chord, waiting;
    a duplicate first link REVOKES that last link, which counts its part."""
    side = sides["jobbers"]
    a, held = keys(2)
    member, total = side.task("member"), side.task("total")
    first, holder = side.revoked("member", held)
    callback: Any = chord([member.s(a), first | total.s()], total.s()).apply_async()
    error = callback.get(propagate=False, timeout=TIMEOUT)
    assert isinstance(error, ChordError)
    assert holder in str(error)
    wait_for(lambda: callback.state == celery_states.FAILURE, timeout=TIMEOUT)
