"""The scenarios of test_celery_parity.py: each runs once on a side (a variant of
tests/integration/parity_proj.py, its client app and its worker) and returns what the caller
saw and, on the jobbers side, what the records say. The test module runs each on both
sides at once and compares.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import redis
from celery import Celery, chain, chord, group
from celery.exceptions import TimeoutError as CeleryTimeout

from jobbers_celery import JobbersTask, TaskState, get_jobbers
from tests.conftest import Worker, wait_for
from tests.integration import parity_proj

S = TaskState
#: How long a caller waits for a result that must come.
GET = 15.0

# --------------------------------------------------------------------------- outcomes
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
KEY = re.compile(r"parity:(?:plain|jobbers):\w+:[0-9a-f]{10}")


JOB = re.compile(r"Job: \d+")


def masked(text: str) -> str:
    """``text`` with task ids, trace keys and pool job numbers masked (each side has its
    own)."""
    return JOB.sub("Job: <n>", KEY.sub("<key>", UUID.sub("<id>", text)))


@dataclass
class Record:
    """What the jobbers record says of one task."""

    task_id: str
    state: str | None
    attempt: int
    error: str | None  # "Type: message" of the last failure
    path: list[str]  # "from -> to: reason", oldest first

    def moved(self, frm: str, to: str) -> list[str]:
        """The reasons of the record's moves ``frm -> to``."""
        return [p.split(": ", 1)[1] for p in self.path
                if p.split(": ", 1)[0] == f"{frm} -> {to}"]

    @property
    def last(self) -> str:
        return self.path[-1] if self.path else ""


@dataclass
class Outcome:
    """What one side of a scenario showed its caller (and, for jobbers, its records)."""

    result: str = ""  # "value 5", "raises ValueError: boom", "no result"
    state: str = ""  # AsyncResult.state at the end
    runs: int = 0  # executions of the body
    seen: dict[str, Any] = field(default_factory=dict)  # what else the caller compares
    records: dict[str, Record] = field(default_factory=dict)  # jobbers only: label -> record
    apart: dict[str, Any] = field(default_factory=dict)  # where the sides differ on purpose
    took: float = 0.0  # seconds the scenario took on this side (reported, not compared)

    def caller(self) -> dict[str, Any]:
        return {"result": self.result, "state": self.state, "runs": self.runs, **self.seen}


def settle(result: Any, timeout: float = GET) -> str:
    """The caller's view of ``result.get()``."""
    try:
        value = result.get(timeout=timeout, disable_sync_subtasks=False)
    except CeleryTimeout:
        return "no result"
    except Exception as exc:  # noqa: BLE001 - the outcome is what was raised
        return f"raises {type(exc).__name__}: {masked(str(exc))}"
    return f"value {masked(json.dumps(value))}"


def state_after(result: Any, leaving: str, timeout: float = 5.0) -> str:
    """``result.state`` once it is no longer ``leaving`` (or still that after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while result.state == leaving and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(result.state)


TERMINAL = {S.COMPLETED.value, S.FAILED.value, S.CANCELLED.value, S.STALLED.value,
            S.DROPPED.value}


# --------------------------------------------------------------------------- a side
@dataclass
class Side:
    """One variant of the project: its client app, its worker, its traces."""

    variant: str
    app: Celery
    redis: str
    worker: Worker | None = None

    @property
    def tracked(self) -> bool:
        return self.variant == "jobbers"

    def task(self, name: str) -> Any:
        return self.app.tasks[f"parity.{name}"]

    def key(self, label: str) -> str:
        return f"parity:{self.variant}:{label}:{uuid.uuid4().hex[:10]}"

    def traces(self, key: str) -> list[dict[str, Any]]:
        return [parity_proj.trace_of(e)
                for e in parity_proj.effects(self.redis).lrange(key, 0, -1)]

    def wait_traces(self, key: str, n: int, timeout: float = GET) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            traces = self.traces(key)
            return traces if len(traces) >= n else None

        found: list[dict[str, Any]] = wait_for(enough, timeout=timeout,
                                               message=f"{n} traces in {key}")
        return found

    def read(self, task_id: str) -> Record:
        jobbers = get_jobbers(self.app)
        rec = jobbers.get(task_id)
        steps = [f"{t.from_state.value} -> {t.to_state.value}: {t.reason or ''}"
                 for t in jobbers.history(task_id)]
        error = f"{rec.error.type}: {rec.error.message}" if rec and rec.error else None
        return Record(task_id, rec.state.value if rec else None, rec.attempt if rec else 0,
                      error, steps)

    def record(self, task_id: str, *, timeout: float = 10.0,
               until: Callable[[Record], bool] | None = None) -> Record:
        """The record of ``task_id`` once it is terminal (or ``until`` holds), or as it is
        after ``timeout``."""
        done = until or (lambda r: r.state in TERMINAL)
        deadline = time.monotonic() + timeout
        current = self.read(task_id)
        while not done(current) and time.monotonic() < deadline:
            time.sleep(0.05)
            current = self.read(task_id)
        return current


def broker_holds(side: Side, task_id: str) -> bool:
    """Whether the side's broker holds a message of ``task_id``: waiting in the queue, or
    delivered and not acknowledged (where a Redis broker keeps the ETA message a worker
    holds until it is due)."""
    client = redis.Redis.from_url(f"{side.redis}/{parity_proj.DB[side.variant]}")
    try:
        raw = [*client.lrange("celery", 0, -1), *client.hvals("unacked")]
    finally:
        client.close()
    return any(task_id.encode() in m for m in raw)


# =========================================================================== scenarios
# Each runs on one side and returns its Outcome; records are read on the jobbers side.

def success(side: Side) -> Outcome:
    res = side.task("add").delay(2, 3)
    out = Outcome(settle(res), res.state, 1)
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def failure(side: Side) -> Outcome:
    key = side.key("boom")
    res = side.task("boom").delay(key, "boom")
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def chained(side: Side) -> Outcome:
    add = side.task("add")
    res = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async()
    out = Outcome(settle(res), res.state, 3)
    if side.tracked:
        for i, task_id in enumerate([res.parent.parent.id, res.parent.id, res.id]):
            out.records[f"link {i + 1}"] = side.record(task_id)
    return out


def grouped(side: Side) -> Outcome:
    add = side.task("add")
    res = group(add.s(i, i) for i in range(4)).apply_async()
    out = Outcome(settle(res), "", 4)
    out.seen["member states"] = [r.state for r in res.results]
    if side.tracked:
        for i, r in enumerate(res.results):
            out.records[f"member {i}"] = side.record(r.id)
    return out


def chorded(side: Side) -> Outcome:
    add, tsum = side.task("add"), side.task("tsum")
    res = chord(add.s(i, i) for i in range(3))(tsum.s())
    out = Outcome(settle(res), res.state, 4)
    if side.tracked:
        out.records["callback"] = side.record(res.id)
        for i, r in enumerate(res.parent.results):
            out.records[f"member {i}"] = side.record(r.id)
    return out


def starmapped(side: Side) -> Outcome:
    res = side.task("add").starmap([(1, 1), (2, 2), (3, 3)]).apply_async()
    out = Outcome(settle(res), res.state, 1)
    if side.tracked:
        out.records["starmap"] = side.record(res.id)
    return out


def mapped(side: Side) -> Outcome:
    res = side.task("tsum").map([[1, 2], [3], []]).apply_async()
    out = Outcome(settle(res), res.state, 1)
    if side.tracked:
        out.records["map"] = side.record(res.id)
    return out


def chunked(side: Side) -> Outcome:
    res = side.task("add").chunks(zip(range(6), range(6), strict=True), 3).apply_async()
    out = Outcome(settle(res), "", len(res.results))
    out.seen["chunk states"] = [r.state for r in res.results]
    if side.tracked:
        for i, r in enumerate(res.results):
            out.records[f"chunk {i}"] = side.record(r.id)
    return out


def retry_countdown(side: Side) -> Outcome:
    key = side.key("retry")
    res = side.task("retry_exc").apply_async((key, 2, 0.5))
    result = settle(res)
    traces = side.traces(key)
    gaps = [b["at"] - a["at"] for a, b in pairwise(traces)]
    out = Outcome(result, res.state, len(traces))
    out.seen["waited the countdown"] = all(g >= 0.45 for g in gaps)
    out.seen["retries seen by the body"] = [t["retries"] for t in traces]
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def linked(side: Side) -> Outcome:
    key = side.key("link")
    callback = side.task("note").s(key)
    callback.freeze()
    res = side.task("add").apply_async((1, 1), link=callback)
    out = Outcome(settle(res), res.state, 1)
    out.seen["callback got"] = [t["value"] for t in side.wait_traces(key, 1)]
    out.seen["callback result"] = settle(side.app.AsyncResult(callback.id))
    if side.tracked:
        out.records["task"] = side.record(res.id)
        out.records["callback"] = side.record(callback.id)
    return out


def linked_error(side: Side) -> Outcome:
    key, ekey = side.key("boom"), side.key("errback")
    errback = side.task("on_error").s(ekey)
    errback.freeze()
    res = side.task("boom").apply_async((key,), link_error=errback)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    traces = side.wait_traces(ekey, 1)
    out.seen["errback got the failed task's id"] = [t["failed"] == res.id for t in traces]
    if side.tracked:
        out.records["task"] = side.record(res.id)
        out.records["errback"] = side.record(errback.id)
    return out


def chord_failed_member(side: Side) -> Outcome:
    key = side.key("boom")
    add, boom, tsum = side.task("add"), side.task("boom"), side.task("tsum")
    res = chord([add.s(1, 1), boom.s(key)], tsum.s())()
    result = settle(res)  # raises the failed member's error at once (a parent's)
    out = Outcome(result, state_after(res, "PENDING"), 2)
    out.seen["callback's error"] = masked(repr(res.result))
    out.seen["members"] = [settle(r) for r in res.parent.results]
    if side.tracked:
        out.records["ok member"] = side.record(res.parent.results[0].id)
        out.records["failed member"] = side.record(res.parent.results[1].id)
        out.records["callback"] = side.record(res.id, timeout=0)
    return out


def retry_no_exc(side: Side) -> Outcome:
    key = side.key("retry")
    res = side.task("retry_no_exc").delay(key)
    out = Outcome(settle(res), res.state)
    out.runs = len(side.traces(key))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def retry_default_delay(side: Side) -> Outcome:
    key = side.key("retry")
    res = side.task("retry_default_delay").delay(key)
    out = Outcome(settle(res), res.state)
    traces = side.traces(key)
    out.runs = len(traces)
    gap = traces[1]["at"] - traces[0]["at"] if len(traces) > 1 else None
    out.seen["waited default_retry_delay (1 s)"] = gap is not None and gap >= 0.9
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def autoretry(times: int) -> Callable[[Side], Outcome]:
    def scenario(side: Side) -> Outcome:
        key = side.key("auto")
        res = side.task("autoretry").delay(key, times)
        out = Outcome(settle(res), res.state)
        traces = side.traces(key)
        out.runs = len(traces)
        gaps = [b["at"] - a["at"] for a, b in pairwise(traces)]
        # retry_backoff=True, retry_backoff_max=1, retry_jitter=True: each wait 0 or 1 s
        # each wait 0 or 1 s (under load, a few); default_retry_delay would be 180 s
        out.seen["retried within the backoff"] = all(g < 10 for g in gaps)
        out.apart["waits"] = [round(g, 2) for g in gaps]
        if side.tracked:
            out.records["task"] = side.record(res.id)
        return out
    return scenario


def expected_exceptions(side: Side) -> Outcome:
    key = side.key("expected")
    res = side.task("expected").delay(key, 2)
    out = Outcome(settle(res), res.state)
    traces = side.traces(key)
    out.runs = len(traces)
    gaps = [b["at"] - a["at"] for a, b in pairwise(traces)]
    out.seen["retried at once"] = all(g < 10 for g in gaps)  # not 180 s later
    out.apart["waits"] = [round(g, 2) for g in gaps]
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def expected_exceptions_exhausted(side: Side) -> Outcome:
    """Twenty tasks, one after the other, whose retries come at once and run out: what
    Celery stores last for each (a RETRY stored late, after the last attempt's FAILURE in
    the other pool process, would hide it for good)."""
    keys = [side.key("expected") for _ in range(20)]
    results, outcomes = [], set()
    for key in keys:  # one at a time: each retry finds a pool process free at once
        results.append(side.task("expected").delay(key, 9))
        outcomes.add(settle(results[-1]))
    out = Outcome(" | ".join(sorted(outcomes)), "", sum(len(side.traces(k)) for k in keys))
    # the behaviour checked is an absence (no late RETRY stored over a FAILURE): there is
    # no condition to poll for, so a bounded wait after the last attempt ended
    time.sleep(0.5)
    # not compared: plain Celery may store a late RETRY here (see DELIBERATE)
    out.apart["stored last"] = sorted({str(side.app.AsyncResult(r.id).state)
                                       for r in results})
    if side.tracked:
        for i, r in enumerate(results):
            out.records[f"task {i}"] = side.record(r.id)
    return out


def ended_without_result(task: str) -> Callable[[Side], Outcome]:
    """A body that ends with no result for the caller (a bare ``Retry``, ``Ignore``): the
    state it leaves is the outcome; ``get()`` would wait for ever."""
    def scenario(side: Side) -> Outcome:
        key = side.key(task)
        res = side.task(task).delay(key)
        side.wait_traces(key, 1)
        out = Outcome("not called: no result ever comes", state_after(res, "PENDING"),
                      len(side.traces(key)))
        if task == "ignore":
            out.seen["info"] = res.info
        if side.tracked:
            out.records["task"] = side.record(res.id)
            get_jobbers(side.app).clean()  # no stall, later either
            out.records["task, after a cleaner pass"] = side.read(res.id)
        return out
    return scenario


def rejected(requeue: bool, task: str = "reject") -> Callable[[Side], Outcome]:
    def scenario(side: Side) -> Outcome:
        key = side.key("reject")
        res = side.task(task).delay(key, requeue)
        if task == "reject_early_ack":  # acknowledged already: nothing runs it again
            side.wait_traces(key, 1)
            out = Outcome("not called: no result ever comes", state_after(res, "PENDING", 1.0))
        else:
            out = Outcome(settle(res), res.state)
        traces = side.traces(key)
        out.runs = len(traces)
        out.seen["redelivered"] = [t["redelivered"] for t in traces]
        if side.tracked:
            out.records["task"] = side.record(res.id)
        return out
    return scenario


def replaced(side: Side) -> Outcome:
    key = side.key("replace")
    res = side.task("replacer").delay(key, 100)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def replaced_in_chain(side: Side) -> Outcome:
    key = side.key("replace")
    res = chain(side.task("replacer").s(key, 100), side.task("add").s(2)).apply_async()
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["replaced"] = side.record(res.parent.id)
        out.records["next link"] = side.record(res.id)
    return out


def soft_limit(catch: bool) -> Callable[[Side], Outcome]:
    def scenario(side: Side) -> Outcome:
        key = side.key("soft")
        res = side.task("soft_limit").delay(key, catch)
        out = Outcome(settle(res), res.state, len(side.traces(key)))
        if side.tracked:
            out.records["task"] = side.record(res.id)
        return out
    return scenario


def hard_limit(side: Side) -> Outcome:
    key = side.key("hard")
    res = side.task("hard_limit").delay(key)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def rate_limited(side: Side) -> Outcome:
    key = side.key("rated")
    sent = time.time()
    results = [side.task("rated").delay(key) for _ in range(6)]
    values = [settle(r) for r in results]
    traces = side.traces(key)
    out = Outcome(f"{sum(v.startswith('value') for v in values)} values", "", len(traces))
    out.seen["states"] = sorted(r.state for r in results)
    starts = sorted(t["at"] for t in traces)
    # the bucket lets one through at once, then one per 0.2 s: the sixth 1 s after the
    # publish at the earliest (a body starts later than its dispatch, never sooner)
    out.seen["the sixth ran 1 s or more after the publish"] = starts[-1] - sent >= 0.95
    out.apart["gaps"] = [round(b - a, 2) for a, b in pairwise(starts)]
    if side.tracked:
        for i, r in enumerate(results):
            out.records[f"task {i}"] = side.record(r.id)
    return out


def expired(side: Side) -> Outcome:
    key = side.key("expires")
    res = side.task("traced").apply_async((key, "ran"),
                                          expires=datetime.now(UTC) - timedelta(seconds=1))
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def expired_before_countdown(side: Side) -> Outcome:
    key = side.key("expires")
    res = side.task("traced").apply_async((key, "ran"), countdown=1, expires=0.5)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def delayed(how: str) -> Callable[[Side], Outcome]:
    """A first run ``countdown=`` or ``eta=`` 1.5 s later; where the task waits is sampled
    while it waits."""
    def scenario(side: Side) -> Outcome:
        key = side.key(how)
        start, wait = time.time(), 1.5
        options = ({"countdown": wait} if how == "countdown"
                   else {"eta": datetime.now(UTC) + timedelta(seconds=wait)})
        res = side.task("traced").apply_async((key, "ran"), **options)
        if side.tracked:
            rec = side.record(res.id, until=lambda r: r.state == S.SCHEDULED.value,
                              timeout=wait / 2)
            during = {"record": rec.state, "broker holds a message": broker_holds(side, res.id)}
        else:  # the worker takes the ETA message and holds it, unacknowledged
            wait_for(lambda: broker_holds(side, res.id) or time.time() - start > wait / 2,
                     timeout=wait, message="the broker")
            during = {"broker holds a message": broker_holds(side, res.id)}
        out = Outcome(settle(res), res.state)
        traces = side.traces(key)
        out.runs = len(traces)
        out.seen["ran no earlier than asked"] = all(t["at"] >= start + wait - 0.05
                                                    for t in traces)
        out.apart["while it waits"] = during
        if side.tracked:
            out.records["task"] = side.record(res.id)
        return out
    return scenario


def revoked_waiting(side: Side) -> Outcome:
    """Celery's revoke (Flower's button) of a task waiting for its countdown."""
    key = side.key("revoke")
    res = side.task("traced").apply_async((key, "ran"), countdown=1)
    side.app.control.revoke(res.id)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def revoked_running(side: Side) -> Outcome:
    """Celery's revoke with terminate of a running task (prefork: SIGTERM to its child)."""
    key = side.key("revoke")
    res = side.task("sleeper").delay(key, 30)
    side.wait_traces(key, 1)
    side.app.control.revoke(res.id, terminate=True)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def lost_after_revoke(side: Side) -> Outcome:
    """A revoke with terminate, then the pool processes SIGKILLed under two ``acks_late``
    ``reject_on_worker_lost`` tasks (one of them in the process the revoke signalled, which
    jobbers' task unwinds in and plain Celery's leaves): both run again, as in Celery."""
    key = side.key("revoke")
    res = side.task("sleeper").delay(key, 30)
    side.wait_traces(key, 1)
    side.app.control.revoke(res.id, terminate=True)
    out = Outcome(settle(res), res.state, 1)
    keys = [side.key("lost"), side.key("lost")]
    lost = [side.task("lost").delay(k) for k in keys]
    for first in [side.wait_traces(k, 1)[0] for k in keys]:  # both processes busy
        os.kill(first["pid"], signal.SIGKILL)
    out.seen["the lost tasks"] = [settle(r) for r in lost]
    out.seen["their states"] = [r.state for r in lost]
    out.runs += sum(len(side.traces(k)) for k in keys)
    if side.tracked:
        out.records["revoked"] = side.record(res.id)
        for i, r in enumerate(lost):
            out.records[f"lost {i}"] = side.record(r.id)
    return out


def result_ignored(side: Side) -> Outcome:
    key = side.key("ignored")
    res = side.task("ignored").delay(key)
    side.wait_traces(key, 1)
    out = Outcome(settle(res, timeout=1.0), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def tasks_per_child(side: Side) -> Outcome:
    """``--max-tasks-per-child 3`` on a worker of 2 children: 12 tasks, published at once,
    run in 3 children or more (4 when no child goes past its limit)."""
    results = [side.task("pid").delay() for _ in range(12)]
    pids = [r.get(timeout=GET) for r in results]
    counts = {p: pids.count(p) for p in set(pids)}
    out = Outcome(f"{len(pids)} values", "", len(pids))
    # billiard may hand a child one job past its limit as it retires (seen in plain
    # Celery): the count per child is reported, not compared
    out.seen["children replaced"] = len(counts) >= 3
    out.apart["tasks per child"] = sorted(counts.values())
    if side.tracked:
        for i, r in enumerate(results):
            out.records[f"task {i}"] = side.record(r.id)
    return out


def unencodable_result(side: Side) -> Outcome:
    key = side.key("unencodable")
    res = side.task("unencodable_result").delay(key)
    out = Outcome(settle(res), res.state, len(side.traces(key)))
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def unencodable_argument(side: Side) -> Outcome:
    task_id = str(uuid.uuid4())
    try:
        side.task("add").apply_async(({1, 2}, 1), task_id=task_id)
    except Exception as exc:  # noqa: BLE001 - the outcome is what was raised
        result = f"apply_async raises {type(exc).__name__}"
    else:
        result = "apply_async returned"
    out = Outcome(result, side.app.AsyncResult(task_id).state)
    if side.tracked:
        out.records["task"] = side.record(task_id, timeout=2)
    return out


def worker_lost(task: str) -> Callable[[Side], Outcome]:
    """An ``acks_late`` task whose pool child is SIGKILLed while it runs (its pid is in the
    trace: a child of this side's worker)."""
    def scenario(side: Side) -> Outcome:
        key = side.key(task)
        res = side.task(task).delay(key)
        first = side.wait_traces(key, 1)[0]
        os.kill(first["pid"], signal.SIGKILL)
        out = Outcome(settle(res), res.state)
        out.runs = len(side.traces(key))
        if side.tracked:
            out.records["task"] = side.record(res.id)
            out.apart["dead letters"] = len(dead_letters(side, res.id, wait=task ==
                                                         "lost_refused"))
        return out
    return scenario


def dead_letters(side: Side, task_id: str, wait: bool = False) -> list[Any]:
    """The dead letters of ``task_id`` (with ``wait``, once there is one: the dispatcher
    writes them after the step, or for at most 5 s)."""
    def read() -> list[Any]:
        return [e for e in get_jobbers(side.app).sink.entries(limit=1000)
                if e.task_id == task_id]

    deadline = time.monotonic() + (5.0 if wait else 0.0)
    found = read()
    while not found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = read()
    return found


def chord_member_dead_lettered(side: Side) -> Outcome:
    """A chord whose header member fails: plain Celery fails the callback (ChordError) for
    good; a jobbers member that dead-letters holds its part, and resubmitting it runs the
    callback with every result."""
    key = side.key("boom_once")
    add, boom_once, tsum = side.task("add"), side.task("boom_once"), side.task("tsum")
    res = chord([add.s(1, 1), boom_once.s(key)], tsum.s())()
    out = Outcome(settle(res), "", 1)
    member = res.parent.results[1]
    out.seen["failed member"] = settle(member)
    out.apart["callback"] = state_after(res, "PENDING", timeout=1.0)
    if side.tracked:
        out.records["failed member"] = side.record(member.id)
        assert get_jobbers(side.app).resubmit([member.id]) == [member.id]
        # a fresh AsyncResult: ``res`` remembers its parent's failure
        out.apart["after resubmitting the member"] = settle(side.app.AsyncResult(res.id))
        out.records["member, resubmitted"] = side.record(
            member.id, until=lambda r: r.state == "completed")
        out.records["callback"] = side.record(res.id)
    return out


def shared(side: Side) -> Outcome:
    """Django-less ``@shared_task`` (``base=JobbersTask`` for jobbers)."""
    parity_proj.define_shared()  # registered on every app of this process
    task = side.app.tasks[f"parity.shared_{side.variant}"]
    res = task.delay(21)
    out = Outcome(settle(res), res.state, 1)
    out.seen["a JobbersTask"] = isinstance(task, JobbersTask) == side.tracked
    if side.tracked:
        out.records["task"] = side.record(res.id)
    return out


def sent_by_name(side: Side) -> Outcome:
    """``app.send_task`` by the name of a task the app registers, three calls of one tenant:
    jobbers caps the tenant at one (``max_concurrent=1, concurrency_key="tenant"``) and parks
    the calls past its place at their publish, as ``delay()`` does; plain Celery has no such
    cap."""
    key = side.key("by_name")
    results = [side.app.send_task("parity.keyed", args=(key, key)) for _ in range(3)]
    out = Outcome("; ".join(settle(r) for r in results), results[-1].state)
    traces = side.traces(key)
    out.runs = len(traces)
    out.seen["result type"] = type(results[0]).__name__
    spans = sorted((t["started"], t["at"]) for t in traces)
    out.apart["overlapping runs"] = sum(1 for (_, end), (start, _) in pairwise(spans)
                                        if start < end)
    if side.tracked:
        jobbers = get_jobbers(side.app)
        out.apart["parked at their publish"] = sum(
            1 for r in results for t in jobbers.history(r.id)
            if t.to_state is S.SCHEDULED and not t.worker)
        for i, r in enumerate(results):
            out.records[f"call {i}"] = side.record(r.id)
    return out


# --------------------------------------------------------------------------- eager, apply()
def eager_run(side: Side, sig: Any, key: str | None = None) -> Outcome:
    res = sig.apply_async()
    out = Outcome(settle(res), res.state, len(side.traces(key)) if key else 1)
    if side.tracked:
        out.records["task"] = side.read(res.id)
    return out


def eager_success(side: Side) -> Outcome:
    return eager_run(side, side.task("add").s(2, 3))


def eager_failure(side: Side) -> Outcome:
    key = side.key("boom")
    return eager_run(side, side.task("boom").s(key), key)


def eager_retry(side: Side) -> Outcome:
    key = side.key("retry")
    return eager_run(side, side.task("retry_exc").s(key, 2, 0.2), key)


def eager_chain(side: Side) -> Outcome:
    add = side.task("add")
    return eager_run(side, chain(add.s(1, 2), add.s(3), add.s(4)))


def applied(side: Side) -> Outcome:
    key = side.key("boom")
    ok, bad = side.task("add").apply((2, 3)), side.task("boom").apply((key,))
    out = Outcome(settle(ok), ok.state, 1)
    out.seen["failing apply()"] = [settle(bad), bad.state, len(side.traces(key))]
    if side.tracked:
        out.records["task"] = side.read(ok.id)
        out.records["failing task"] = side.read(bad.id)
    return out
