"""Fair shares park at publish the keyed tasks the worker or the scheduler publishes: a
chain's next link, a retry, a delayed first run (``countdown``) that came due; and a
``send_task`` by name of a task the publisher has registered (``fair_send_task``). On the
in-memory kit and Celery's embedded worker (``memory://`` broker): a parked task sends no
message (counted at ``before_task_publish``), and is published once, when released, with
what it carried (the chain's remaining links, its retry count)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain, chord
from celery.signals import before_task_publish

from jobbers_celery import Jobbers, JobbersTask, TaskState
from jobbers_celery.core.fairshare import FairKey, key_digest
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from jobbers_celery.worker.taskpublish import fair_send_task
from tests.conftest import wait_for

S = TaskState
RELEASED = "released: its key has room (fair share)"
app = Celery("fair_paths", broker="memory://", backend="cache+memory://")
app.conf.broker_transport_options = {"polling_interval": 0.01}
app.conf.jobbers_scheduler_interval = 0.05

#: task id -> messages sent to the broker for it
SENT: dict[str, int] = {}
_gates: dict[str, threading.Event] = {}


def _count(headers: dict[str, Any] | None = None, **_: Any) -> None:
    task_id = (headers or {}).get("id")
    if task_id:
        SENT[task_id] = SENT.get(task_id, 0) + 1


before_task_publish.connect(_count, weak=False, dispatch_uid="test_fair_publish_paths")


@app.task(base=JobbersTask, bind=True, name="fp.step", shared=False, max_concurrent=1,
          concurrency_key="tenant")
def step(self: JobbersTask, x: int, tenant: str) -> int:
    return x + 1


@app.task(base=JobbersTask, bind=True, name="fp.hold", shared=False, max_concurrent=1,
          concurrency_key="tenant")
def hold(self: JobbersTask, tenant: str) -> str:
    """Runs until the test opens ``tenant``'s gate (bounded)."""
    _gates.setdefault(tenant, threading.Event()).wait(20)
    return tenant


@app.task(base=JobbersTask, bind=True, name="fp.flaky", shared=False, max_concurrent=1,
          concurrency_key="tenant")
def flaky(self: JobbersTask, tenant: str, gate: str | None = None) -> int:
    """Retries once at once (no delay), then returns its retry count; first waits for the
    test to open ``gate`` (bounded), if one is named."""
    if gate is not None:
        _gates.setdefault(gate, threading.Event()).wait(20)
    if not self.request.retries:
        raise self.retry(countdown=0)
    return int(self.request.retries)


@app.task(base=JobbersTask, bind=True, name="fp.total", shared=False)
def total(self: JobbersTask, values: list[int]) -> int:
    return sum(values)


@pytest.fixture(scope="module")
def jobbers() -> Iterator[Jobbers]:
    jobbers = in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    try:
        with embedded_worker(app, shutdown_timeout=30, pool="threads", concurrency=4):
            yield jobbers
    finally:
        for gate in _gates.values():
            gate.set()


def _moves(jobbers: Jobbers, task_id: str) -> list[tuple[str, str]]:
    return [(t.to_state.value, t.reason or "") for t in jobbers.history(task_id)]


def _parked(tenant: str) -> str:
    return FairKey(key_digest(tenant), 1).parked_reason


def _done(jobbers: Jobbers, task_id: str) -> bool:
    record = jobbers.get(task_id)
    return record is not None and record.state is S.COMPLETED


def test_a_chains_next_link_is_parked_at_its_publish_and_released_with_the_chain(
        jobbers: Jobbers) -> None:
    """The worker publishes link 2 while link 1 still runs (before its completion is
    recorded): its key (cap 1) has no room, so it is parked, no message; link 1's end
    releases it, and it carries the rest of the chain: link 3 runs after it."""
    res = chain(step.s(0, "chain"), step.s(tenant="chain"), step.s(tenant="chain")
                ).apply_async()
    assert res.get(timeout=15) == 3
    second = res.parent.id
    wait_for(lambda: _done(jobbers, second), timeout=10, message="link 2 completed")
    moves = _moves(jobbers, second)
    assert moves[:4] == [("submitted", "published"), ("scheduled", _parked("chain")),
                         ("submitted", RELEASED), ("started", "")]
    assert SENT[second] == 1  # once, when released: never to be parked at its start
    assert SENT[res.id] == 1


def _parked_at_start(jobbers: Jobbers, task_id: str) -> int:
    """Parks by a start step (it records its worker; a publish's park records none)."""
    return sum(1 for t in jobbers.history(task_id)
               if t.to_state is S.SCHEDULED and t.worker and "parked" in (t.reason or ""))


def test_chains_in_a_chord_header_are_parked_at_each_links_publish(jobbers: Jobbers) -> None:
    """A chord whose header is chains of a keyed task: each link past its key's room is
    parked at its publish (the last ones too, which carry the group and the chord), none
    at its start; released, each brings its group and chord along: the callback gets
    every result."""
    header = [chain(step.s(10 * i, "chord"), step.s(tenant="chord"), step.s(tenant="chord"))
              for i in range(3)]
    res = chord(header)(total.s())
    assert res.get(timeout=20) == 0 + 10 + 20 + 3 * 3
    links = []
    for last in res.parent.results:
        node = last
        while node is not None:
            links.append(node.id)
            node = node.parent
    assert len(links) == 9
    wait_for(lambda: all(_done(jobbers, i) for i in links), timeout=10,
             message="every link recorded completed")
    assert [_parked_at_start(jobbers, i) for i in links] == [0] * 9
    parked = [i for i in links if ("scheduled", _parked("chord")) in _moves(jobbers, i)]
    assert len(parked) >= 9 - 3  # past the key's one place, at their publish
    assert all(SENT[i] == 1 for i in links)


def test_a_retry_is_parked_at_its_publish_behind_its_keys_parked_task_and_keeps_its_count(
        jobbers: Jobbers) -> None:
    """``flaky`` retries at once while another task of its key (the same name and tenant)
    waits parked: its retry is parked behind it (no message), released after it, and runs
    with ``retries`` 1. ``other`` holds the key's place once released (until the test
    opens its gate): else, with this thread held off the CPU between ``first``'s end of
    attempt and its retry's publish, ``other`` could run to its end meanwhile and leave the
    retry a free key (seen once, at 6 xdist workers on 2 cores)."""
    gate = _gates.setdefault("retry-other", threading.Event())
    go = _gates.setdefault("retry-first", threading.Event())  # and first waits for other's
    first = flaky.delay("retry", gate="retry-first")  # publish: else, this thread held up
    other = flaky.delay("retry", gate="retry-other")  # meanwhile, its retry went first
    assert _moves(jobbers, other.id) == [("submitted", "published"),
                                         ("scheduled", _parked("retry"))]  # key full
    go.set()
    wait_for(lambda: ("scheduled", _parked("retry")) in _moves(jobbers, first.id)[2:],
             timeout=15, message="first's retry parked behind other")
    gate.set()
    assert first.get(timeout=15) == 1
    assert other.get(timeout=15) == 1
    wait_for(lambda: _done(jobbers, first.id), timeout=10, message="the retry completed")
    moves = _moves(jobbers, first.id)
    states = [m[0] for m in moves]
    assert states == ["submitted", "started", "unsubmitted", "submitted", "scheduled",
                      "submitted", "started", "completed"], moves
    assert moves[4] == ("scheduled", _parked("retry"))
    assert moves[5] == ("submitted", RELEASED)
    record = jobbers.get(first.id)
    assert record is not None
    assert record.retry_attempt == 1
    assert SENT[first.id] == 2  # its first publish and its released retry: no more
    started = {i: [t.at for t in jobbers.history(i) if t.to_state is S.STARTED]
               for i in (first.id, other.id)}
    assert started[other.id][0] < started[first.id][1]  # released first in, first out


def test_a_countdown_that_comes_due_while_its_key_is_full_is_parked_not_sent(
        jobbers: Jobbers) -> None:
    gate = _gates.setdefault("due", threading.Event())
    running = hold.delay("due")
    wait_for(lambda: (r := jobbers.get(running.id)) is not None and r.state is S.STARTED,
             timeout=10, message="hold started")
    later = hold.apply_async(("due",), countdown=0.1)
    wait_for(lambda: ("scheduled", _parked("due")) in _moves(jobbers, later.id), timeout=10,
             message="the due task parked by the scheduler")
    moves = _moves(jobbers, later.id)
    assert [m[0] for m in moves] == ["submitted", "scheduled", "submitted", "scheduled"]
    assert moves[2] == ("submitted", "run_at reached")
    assert later.id not in SENT  # nothing went to the broker
    gate.set()
    assert later.get(timeout=15) == "due"
    assert SENT[later.id] == 1
    assert _moves(jobbers, later.id)[4] == ("submitted", RELEASED)


def test_send_task_by_name_of_a_registered_keyed_task_is_its_apply_async(
        jobbers: Jobbers) -> None:
    gate = _gates.setdefault("byname", threading.Event())
    running = hold.delay("byname")
    wait_for(lambda: (r := jobbers.get(running.id)) is not None and r.state is S.STARTED,
             timeout=10, message="hold started")
    sent = app.send_task("fp.hold", kwargs={"tenant": "byname"})  # as a user types it
    assert _moves(jobbers, sent.id) == [("submitted", "published"),
                                         ("scheduled", _parked("byname"))]
    assert sent.id not in SENT
    gate.set()
    assert sent.get(timeout=15) == "byname"
    assert SENT[sent.id] == 1
    # not such a publish: Celery's send_task goes on (None)
    assert fair_send_task(app, ("fp.unknown",), {}) is None
    assert fair_send_task(app, ("fp.step",), {"task_type": step}) is None  # apply_async's own


# ---------------------------------------------------------------------- the scheduler alone
quiet = Celery("fair_paths_scheduler", broker="memory://")  # no worker: steps by hand
#: its messages wait in a queue of their own: an embedded worker of another test in this
#: process (the memory transport is the process's) never takes them
quiet.conf.task_default_queue = "fps-quiet-unconsumed"


@quiet.task(base=JobbersTask, name="fps.one", shared=False, max_concurrent=1,
            concurrency_key="tenant")
def one(tenant: str) -> None:
    """A keyed task no worker runs here."""


def _due(store: InMemoryStore, task_id: str) -> None:
    wait_for(lambda: task_id in store.due()[0], timeout=5, message=f"{task_id} due")


def test_one_scheduler_at_a_time_decides_the_keyed_due_tasks() -> None:
    """The scheduler holding the fair-due lease parks a due task whose key is full (no
    message); another scheduler leaves such a task out of its claim (else, having read it
    due, it would publish it unparked, or park it a second time); the release publishes
    it once."""
    store = InMemoryStore()
    jobbers = in_memory(quiet, store, InMemoryDeadLetterSink())
    first, second = jobbers.scheduler("w1@h"), jobbers.scheduler("w2@h")
    first.fair_shares = second.fair_shares = True
    ahead = one.delay("t")  # on its way: the key's one place
    assert SENT[ahead.id] == 1
    later = one.apply_async(("t",), countdown=0.05)
    _due(store, later.id)
    assert first.run_once() == (0, None)  # the lease's taker: parked, nothing sent
    moves = _moves(jobbers, later.id)
    assert moves == [("submitted", "published"), ("scheduled", "delayed first run (countdown)"),
                     ("submitted", "run_at reached"), ("scheduled", _parked("t"))]
    assert later.id not in SENT
    last = one.apply_async(("t",), countdown=0.05)
    _due(store, last.id)
    assert second._fair_due([later.id, last.id], {}) == ([later.id], 0)  # not its lease
    assert second._fair_due([later.id], {}) == ([later.id], 0)  # not due: the claim's
    assert second.run_once()[0] == 0
    assert _moves(jobbers, later.id) == moves  # decided once
    assert len(_moves(jobbers, last.id)) == 2
    assert last.id not in SENT
    first.run_once()
    assert _moves(jobbers, last.id)[-1] == ("scheduled", _parked("t"))
    key = FairKey(key_digest("t"), 1)
    assert store.start(ahead.id, name="fps.one", worker="w@h", wid="w@h:1:a",
                       heartbeat_ms=None, cap=1, lease_cap_ms=60_000, defer_ms=1000,
                       fields={}, fair=key).state is S.STARTED
    record = store.get(ahead.id)
    assert record is not None
    assert store.complete(ahead.id, record.attempt, name="fps.one", worker="w@h",
                          wid="w@h:1:a", fields={}, delete=(), write_result=None).applied
    assert first.run_once()[0] == 1  # released first in, first out: published once
    assert SENT[later.id] == 1
    assert _moves(jobbers, later.id)[-1] == ("submitted", RELEASED)
    assert last.id not in SENT
