"""The three flow controls with the state store on Redis Sentinel (issue 28: "on one Redis,
on Sentinel and on Redis Cluster"), with a real prefork worker:

- unique: a duplicate publish while the first copy waits at the broker, or runs, sends no
  message and answers with the holder's id; once the copy ended, a new publish runs;
- a rate limit per key: calls of one key start no more than ``count`` in any window (the
  start times of the records), another key is not held back;
- fair shares: never more than the cap of one key at once, and a small key's tasks start
  while a large key has a backlog;
- across ``SENTINEL FAILOVER``: a unique lock taken before it holds; a rate limit and a cap
  under load stay within what the docs allow a failover (docs/howto/rate-limits.md,
  fair-shares.md), the figures printed; no call is left ``submitted`` for good (a start the
  demoted master refused is asked again, see docs/howto/topologies.md).

The module starts its own Sentinel set (master, replica, three sentinels on free ports:
tests/integration/topology_servers.py) and one worker for all its tests; the broker is the
session's private Redis, which no failover touches (tests/integration/sentinel_flow_proj.py).
The figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery, signals
from redis.sentinel import SentinelConnectionPool

from jobbers_celery import TaskState, get_jobbers
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.store import RedisStore
from tests.conftest import QUIET, RedisServer, Worker, start_worker, wait_for
from tests.integration.lifecycle_helpers import wait_state
from tests.integration.sentinel_flow_proj import CAP, RATE, build
from tests.integration.test_ratelimit import most_in_a_window, starts
from tests.integration.topology_servers import MASTER_NAME, SentinelSet, sentinel_set

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
MODULE = "tests.integration.sentinel_flow_proj"
COUNT, PERIOD = int(RATE.split("/")[0]), 1000
#: The broker's database on the session's Redis: not db 1, which other tests flush (a flush
#: would drop kombu's bindings under this module's worker).
BROKER_DB = 9
#: A queue no worker consumes: a copy published there waits.
IDLE = "sf-idle"


@dataclass
class Flow:
    """The module's world: the app (store on Sentinel), its worker, the broker's Redis
    (where the bodies' marks are) and the Sentinel set."""

    app: Celery
    jobbers: Jobbers
    worker: Worker
    marks: redis.Redis
    servers: SentinelSet

    def task(self, name: str) -> Any:
        return self.app.tasks[name]

    def lines(self, key: str) -> list[str]:
        """The list ``key`` of the marks (decoded: the client decodes replies)."""
        return [str(line) for line in self.marks.lrange(key, 0, -1)]


@pytest.fixture(scope="module")
def flow(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Flow]:
    with sentinel_set() as servers:
        broker = redis_server.url(BROKER_DB)
        prefix = f"sf{uuid.uuid4().hex[:6]}"
        app = build(servers.url, MASTER_NAME, broker, prefix)
        jobbers = get_jobbers(app)
        store = jobbers.store
        assert isinstance(store, RedisStore)
        assert isinstance(store.client.connection_pool, SentinelConnectionPool)
        env = {"SENTINEL_FLOW_STORE": servers.url, "SENTINEL_FLOW_MASTER": MASTER_NAME,
               "SENTINEL_FLOW_BROKER": broker, "SENTINEL_FLOW_PREFIX": prefix}
        # 4 processes, one message each at a time: what waits, waits in the store
        worker = start_worker(app, MODULE, tmp_path_factory.mktemp("sentinel-flow"),
                              concurrency=4, env=env,
                              options=[*QUIET, "--prefetch-multiplier", "1"])
        marks: redis.Redis = redis.Redis.from_url(broker, decode_responses=True)
        try:
            yield Flow(app, jobbers, worker, marks, servers)
        finally:
            worker.kill()
            marks.flushdb()
            marks.close()
            store.client.close()


@contextlib.contextmanager
def published(name: str) -> Iterator[list[str]]:
    """The ids of the messages of task ``name`` this process hands to the broker meanwhile."""
    sent: list[str] = []

    def count(sender: str | None = None, headers: dict[str, Any] | None = None,
              **_: Any) -> None:
        if sender == name:
            sent.append(str((headers or {}).get("id")))

    signals.after_task_publish.connect(count, weak=False)
    try:
        yield sent
    finally:
        signals.after_task_publish.disconnect(count)


def tag(what: str) -> str:
    return f"sf:{what}:{uuid.uuid4().hex[:8]}"


def terminal(jobbers: Jobbers, ids: list[str]) -> bool:
    return all(getattr(jobbers.get(i), "state", None) in TERMINAL for i in ids)


# ------------------------------------------------------------------------------ unique


def test_unique_a_duplicate_of_a_waiting_copy_sends_nothing(flow: Flow) -> None:
    """The copy waits at the broker (a queue no worker reads): a duplicate is answered with
    its id and sends nothing; once it is cancelled (terminal), a new publish runs."""
    once, k = flow.task("sf.once"), tag("wait")
    with published("sf.once") as sent:
        first = once.apply_async((k,), queue=IDLE)
        again = once.apply_async((k,), queue=IDLE)
        assert again.id == first.id
        assert sent == [first.id]
        assert flow.marks.llen(IDLE) == 1
        assert flow.jobbers.cancel(first.id)
        later = once.delay(k)
        assert later.id != first.id
        assert sent == [first.id, later.id]
    wait_state(flow.jobbers, later.id, S.COMPLETED, worker=flow.worker)
    assert flow.lines(f"{k}:ran") == [later.id]
    flow.marks.delete(IDLE)


def test_unique_a_duplicate_of_a_running_copy_sends_nothing(flow: Flow) -> None:
    """The copy runs: a duplicate is answered with its id and sends nothing; another key
    is its own copy; once the copy completed, a new publish runs."""
    once, k = flow.task("sf.once"), tag("run")
    flow.marks.set(f"{k}:hold", 1)
    with published("sf.once") as sent:
        first = once.delay(k)
        wait_state(flow.jobbers, first.id, S.STARTED, worker=flow.worker)
        again = once.delay(k)
        assert again.id == first.id
        assert sent == [first.id]
        other = once.delay(tag("other"))
        assert other.id != first.id
        flow.marks.delete(f"{k}:hold")
        wait_state(flow.jobbers, first.id, S.COMPLETED, worker=flow.worker)
        later = once.delay(k)
        assert later.id != first.id
        assert sent == [first.id, other.id, later.id]
    wait_state(flow.jobbers, later.id, S.COMPLETED, worker=flow.worker)
    assert flow.lines(f"{k}:ran") == [first.id, later.id]


# -------------------------------------------------------------------------- rate limit


def test_rate_limit_per_key(flow: Flow) -> None:
    """10 calls of one key at 4/s and 3 of another, published at once: at most 4 of the
    first key start in any 1 s window (the store's start times), the other key's start at
    once."""
    call, big, small = flow.task("sf.call"), tag("big"), tag("small")
    t0 = flow.jobbers.store.now_ms()
    ids = {account: [call.delay(account, n).id for n in range(calls)]
           for account, calls in ((big, 10), (small, 3))}
    every = [i for group in ids.values() for i in group]
    wait_for(lambda: all(getattr(flow.jobbers.get(i), "state", None) is S.COMPLETED
                         for i in every), timeout=30, interval=0.1,
             message="every call to complete")
    got = {a: sorted(t for i in group for t in starts(flow.jobbers, i))
           for a, group in ids.items()}
    print(f"\nSentinel: 10 calls of one key at {RATE}: started over "
          f"{(got[big][-1] - got[big][0]) / 1000:.2f} s, most in any 1 s window "
          f"{most_in_a_window(got[big])}; the other key's 3 started within "
          f"{(got[small][-1] - t0) / 1000:.2f} s of the publish")
    assert [len(got[big]), len(got[small])] == [10, 3]  # each started once
    assert most_in_a_window(got[big]) == COUNT
    assert got[big][-1] - got[big][0] < 2 * PERIOD + 2000  # 10 at 4/s: places at 0, 1, 2 s
    assert got[small][-1] - t0 < 1500  # the other key did not wait behind the first


# ------------------------------------------------------------------------- fair shares


def spans(flow: Flow, key: str) -> dict[str, list[tuple[float, float]]]:
    """Each tenant's bodies (start, end), from the marks."""
    out: dict[str, list[tuple[float, float]]] = {}
    for line in flow.lines(f"{key}:spans"):
        tenant, _id, start, end = line.split()
        out.setdefault(tenant, []).append((float(start), float(end)))
    return {t: sorted(s) for t, s in out.items()}


def most_at_once(bodies: list[tuple[float, float]]) -> int:
    """The most bodies running at one instant."""
    edges = sorted([(start, 1) for start, _ in bodies] + [(end, -1) for _, end in bodies])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def test_fair_shares_cap_per_key_and_a_small_key_goes_first(flow: Flow) -> None:
    """12 tasks of a large tenant (0.3 s each) then 2 of a small one, on 4 processes at
    ``max_concurrent=2`` per tenant: never more than 2 of a tenant at once; the small
    tenant's start while the large one still has tasks waiting."""
    fair, key = flow.task("sf.fair"), tag("fair")
    large = [fair.delay(key, "large", 0.3).id for _ in range(12)]
    small = [fair.delay(key, "small", 0.1).id for _ in range(2)]
    wait_for(lambda: terminal(flow.jobbers, large + small), timeout=30, interval=0.1,
             message="every task to end")
    records = [flow.jobbers.get(i) for i in large + small]
    assert {(r.state, r.attempt) for r in records if r is not None} == {(S.COMPLETED, 1)}
    bodies = spans(flow, key)
    small_started = max(s for s, _ in bodies["small"])
    waiting = sum(1 for s, _ in bodies["large"] if s > small_started)
    parked = [i for i in large if any((t.from_state, t.to_state) == (S.SUBMITTED, S.SCHEDULED)
                                      for t in flow.jobbers.history(i))]
    print(f"\nSentinel fair shares: most at once large {most_at_once(bodies['large'])}, "
          f"small {most_at_once(bodies['small'])} (cap {CAP}); {len(parked)} of 12 large "
          f"parked; the small tenant's started with {waiting} large still to start")
    assert [len(bodies["large"]), len(bodies["small"])] == [12, 2]
    assert most_at_once(bodies["large"]) == CAP
    assert int(flow.marks.get(f"{key}:large:max") or 0) == CAP
    assert most_at_once(bodies["small"]) <= CAP
    assert waiting >= 4  # published after 12, started with most of them still waiting
    assert parked
    assert flow.jobbers.store.fair_held() == []


# ---------------------------------------------------------------------------- failover


def in_sync(servers: SentinelSet) -> None:
    """Before a failover test: the replica is in sync (the module's second failover follows
    the first within seconds, maybe before the old master replicates the new one)."""
    wait_for(servers.in_sync, timeout=30, interval=0.1, message="the replica to be in sync")


def runs(flow: Flow, key: str) -> dict[str, list[float]]:
    """Task id -> its bodies' start times (s), from the marks of ``sf.call`` (``key``: the
    account) or ``sf.fair`` (``key``: the spans' key)."""
    out: dict[str, list[float]] = {}
    for line in flow.lines(f"{key}:starts") + flow.lines(f"{key}:spans"):
        fields = line.split()
        task_id, at = (fields[0], fields[1]) if len(fields) == 2 else (fields[1], fields[2])
        out.setdefault(task_id, []).append(float(at))
    return out


@dataclass
class Outcome:
    """What became of a batch across the failover: each task's end state in the store (the
    new master's word) and how many times its body ran (the marks)."""

    states: dict[str, TaskState | None]
    runs: dict[str, list[float]]

    def figures(self) -> str:
        ended = Counter(s.value if s else "no record" for s in self.states.values())
        twice = sum(1 for i in self.states if len(self.runs.get(i, [])) > 1)
        never = sum(1 for i in self.states if not self.runs.get(i))
        return f"end states {dict(sorted(ended.items()))}, ran twice {twice}, never ran {never}"

    def unfinished(self) -> list[str]:
        return [i for i, s in self.states.items() if s not in TERMINAL]

    def stranded(self) -> list[str]:
        """Tasks whose body ran but whose record is back at ``submitted`` with no message:
        nothing will end it."""
        return [i for i, s in self.states.items() if s is S.SUBMITTED and self.runs.get(i)]


def outcome(flow: Flow, ids: list[str], key: str) -> Outcome:
    return Outcome({i: getattr(flow.jobbers.get(i), "state", None) for i in ids},
                   runs(flow, key))


def test_unique_lock_holds_across_a_failover(flow: Flow) -> None:
    """A lock taken before ``SENTINEL FAILOVER`` (replicated by then) holds on the new
    master: a duplicate is answered with the holder's id and sends nothing; the holder's end
    frees it there, and a new publish runs."""
    in_sync(flow.servers)
    once, k = flow.task("sf.once"), tag("fo-once")
    flow.marks.set(f"{k}:hold", 1)
    holder = once.delay(k)
    wait_state(flow.jobbers, holder.id, S.STARTED, worker=flow.worker)
    old, new = flow.servers.failover()
    with published("sf.once") as sent:
        assert once.delay(k).id == holder.id
        flow.marks.delete(f"{k}:hold")
        wait_state(flow.jobbers, holder.id, S.COMPLETED, worker=flow.worker)
        later = once.delay(k)
        assert later.id != holder.id
        assert sent == [later.id]
    wait_state(flow.jobbers, later.id, S.COMPLETED, worker=flow.worker)
    assert flow.lines(f"{k}:ran") == [holder.id, later.id]
    print(f"\nSentinel failover {old} -> {new} while a unique copy ran: the duplicate was "
          f"answered with the holder, nothing sent; freed at its end on the new master")


def test_rate_limit_and_fair_shares_across_a_failover(flow: Flow) -> None:
    """``SENTINEL FAILOVER`` while 16 calls of one key wait on their rate (4/s) and 12 tasks
    of one tenant (0.5 s each) on their cap (2).

    Replication is asynchronous, and each process follows the switch within 0.5 s: what it
    writes to the old master meanwhile is lost. The docs allow a failover up to ``count``
    more starts of a key in the period after, and up to ``max_concurrent`` more of a key at
    once; a call or a parked task whose republish or release, start and end all went to the
    old master is published again by the new master's scheduler and runs again (at least
    once); an attempt whose end alone was lost is stalled. Measured, 10 runs: at most 8
    starts (2 x 4) in a 1 s window, 2-4 of the 16 calls and 2-4 of the 12 tasks ran twice, 2
    tasks stalled, never more than 2 of the tenant at once.

    Not allowed: a call left ``submitted`` for good (seen in 2 runs of 10 before a refused
    start was asked again after a master check)."""
    call, fair = flow.task("sf.call"), flow.task("sf.fair")
    account, key = tag("fo-rate"), tag("fo-fair")
    in_sync(flow.servers)
    calls = [call.delay(account, n).id for n in range(16)]
    tenant = [fair.delay(key, "t", 0.5).id for _ in range(12)]
    wait_for(lambda: flow.marks.llen(f"{account}:starts") >= COUNT + 1, timeout=10,
             message="the second window of calls to begin")
    began = time.monotonic()
    old, new = flow.servers.failover()
    switched = time.monotonic() - began
    ids = [*calls, *tenant]
    with contextlib.suppress(AssertionError):  # what is left then is what the failover left
        wait_for(lambda: terminal(flow.jobbers, ids), timeout=25, interval=0.2,
                 message="every task to end after the failover")
    ended = time.monotonic() - began
    rate, shares = outcome(flow, calls, account), outcome(flow, tenant, key)
    times = sorted(round(t * 1000) for group in rate.runs.values() for t in group)
    bodies = spans(flow, key)["t"]
    print(f"\nSentinel failover {old} -> {new} ({switched:.2f} s) mid-way: 16 calls at "
          f"{RATE}: most starts in any 1 s window {most_in_a_window(times)}, "
          f"{rate.figures()}; 12 tasks at max_concurrent={CAP}: most at once "
          f"{most_at_once(bodies)}, {shares.figures()}; all ended {ended:.1f} s after the "
          f"command")
    print("starts applied after a master recheck:",
          flow.worker.log.count("applied once the master was checked again"))
    for i in rate.unfinished() + shares.unfinished():
        print("unfinished", i, [(t.to_state.value, t.reason) for t in flow.jobbers.history(i)],
              *(line for line in flow.worker.log.splitlines() if i in line), sep="\n  ")
    assert sorted(rate.runs) == sorted(calls)  # every body ran
    assert sorted(shares.runs) == sorted(tenant)
    assert most_in_a_window(times) <= 2 * COUNT
    assert most_at_once(bodies) <= 2 * CAP
    # a parked task whose release, start and end all reached the old master is parked still
    # on the new one (released again once its key has room there: the places the lost
    # writes left, a start whose end was lost, a release whose start was lost, can hold it
    # past this test's wait), or released there and claimed (its publish lease, 30 s,
    # lapses after this test's wait: then the scheduler publishes it again). Seen in two
    # clean-clone runs; never left `submitted` by anything but a release's claim
    for i in shares.unfinished():
        last = [t.reason or "" for t in flow.jobbers.history(i)][-1]
        assert shares.states[i] is S.SCHEDULED or (
            shares.states[i] is S.SUBMITTED and last.startswith("released")), (i, last)
    assert len(shares.unfinished()) <= 1
    assert sorted(rate.unfinished()) == sorted(rate.stranded())  # no stall verdict missing
    # a start the demoted master refused is asked again once every connection checked the
    # master (worker/start.py): no call is left at `submitted` with no message (2 runs of
    # 10 stranded one before that)
    assert rate.stranded() == []
