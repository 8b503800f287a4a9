"""Full memory (``maxmemory`` reached, ``noeviction``) is a store outage, not a task's failure.

Each test starts its own redis-server (tests/conftest.py ``RedisServer``) and fills its
memory up: a lifecycle step is refused as a whole (it writes nothing, not even the ZREM out
of its source index), waits while memory is full (``wait_out_outages``) and applies once it
is freed; a heartbeat is not delivered instead of raising into the task body; running tasks
of a real worker neither fail nor are dead-lettered, and complete once memory is freed. A
worker warns at start when ``maxmemory-policy`` evicts.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobbers_celery import TaskState, install
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.store import UNREACHABLE, RedisStore, WritesRefused, is_outage
from jobbers_celery.worker.signals import check_eviction
from tests.conftest import RedisServer, start_worker, wait_for
from tests.integration import fault_proj
from tests.integration.beat_helpers import Beat
from tests.integration.store_helpers import create
from tests.integration.topology_servers import executions, restartable_redis

S = TaskState
pytestmark = pytest.mark.redis

FILLER = "filler:"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    yield srv
    srv.stop()


def fill_memory(client: redis.Redis, headroom: int = 1 << 20) -> int:
    """Set ``maxmemory`` a little above what is used now, write filler keys until Redis
    refuses one, then lower ``maxmemory`` 1 MiB under what is used (as when it was reached
    with small writes, and so that it stays full while buffers come and go); returns how many filler keys were written."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + headroom)
    written = 0
    value = "x" * 65536
    while True:
        try:
            client.set(f"{FILLER}{written}", value)
        except redis.exceptions.OutOfMemoryError:
            # the refused value's buffer is freed afterwards, and used_memory counts buffers
            # (AOF, clients') that come and go: stay well over the limit meanwhile
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used - (1 << 20))
            return written
        written += 1


def free_memory(client: redis.Redis) -> None:
    keys = list(client.scan_iter(f"{FILLER}*", count=1000))
    if keys:
        client.delete(*keys)
    client.config_set("maxmemory", 0)


def started(store: RedisStore, task_id: str) -> int:
    create(store, task_id)
    res = store.step(task_id, S.STARTED, start=True, worker="w1@host", wid="w1")
    assert res.applied, res
    return res.attempt


def snapshot(store: RedisStore, task_id: str) -> tuple[dict[str, str], dict[str, float | None]]:
    client = store.client
    scores = {s.value: client.zscore(store.keys_of(task_id).state_index(s), task_id) for s in S
              if s is not S.UNSUBMITTED}
    return dict(client.hgetall(store.keys_of(task_id).task(task_id))), scores  # type: ignore[arg-type]


def test_a_step_refused_for_full_memory_writes_nothing(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url(), prefix="oom")
    attempt = started(store, "t1")
    before = snapshot(store, "t1")
    assert before[1]["started"] is not None
    fill_memory(store.client)
    with pytest.raises(redis.exceptions.OutOfMemoryError) as info:
        store.step("t1", S.COMPLETED, fence=attempt, wid_fence="w1")
    assert isinstance(info.value, UNREACHABLE)
    assert is_outage(info.value)
    assert snapshot(store, "t1") == before  # not even the ZREM out of `started`
    free_memory(store.client)
    res = store.step("t1", S.COMPLETED, fence=attempt, wid_fence="w1")
    assert res.applied
    assert res.state is S.COMPLETED
    assert [t.to_state for t in store.history("t1")] == [S.SUBMITTED, S.STARTED, S.COMPLETED]


def test_a_worker_step_waits_while_memory_is_full(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url(), prefix="oom")
    attempt = started(store, "t1")
    store.wait_out_outages(30)
    fill_memory(store.client)
    other = redis.Redis.from_url(server.url())
    freed = threading.Timer(1.0, free_memory, args=(other,))
    began = time.monotonic()
    freed.start()
    try:
        res = store.step("t1", S.COMPLETED, fence=attempt, wid_fence="w1")
    finally:
        freed.join()
    waited = time.monotonic() - began
    print(f"\nstep waited {waited:.2f} s for memory freed after 1 s")
    assert res.applied
    assert res.state is S.COMPLETED
    assert waited >= 1.0
    assert len(store.history("t1")) == 3  # applied once


def test_a_heartbeat_under_full_memory_is_not_delivered(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url(), prefix="oom")
    attempt = started(store, "t1")
    fill_memory(store.client)
    beat = store.heartbeat("t1", attempt, progress='"half"')
    assert not beat.delivered
    assert not beat.accepted
    assert store.client.hget(store.keys_of("t1").task("t1"), "progress") is None
    free_memory(store.client)
    assert store.heartbeat("t1", attempt, progress='"half"').accepted


def test_prune_runs_under_full_memory(server: RedisServer) -> None:
    """prune only deletes (``#!lua flags=allow-oom``): it frees memory while it is full."""
    store = RedisStore.from_url(server.url(), prefix="oom", retention=0)
    attempt = started(store, "t1")
    assert store.step("t1", S.COMPLETED, fence=attempt).applied
    fill_memory(store.client)
    wait_for(lambda: store.now_ms() > int(store.get_raw("t1")["done_at"]), timeout=2)
    assert store.prune() == 1
    assert store.get("t1") is None


def test_startup_warns_when_the_policy_evicts(server: RedisServer,
                                              caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore.from_url(server.url(), prefix="oom")
    with caplog.at_level(logging.WARNING, logger="jobbers.signals"):
        assert check_eviction(store) is None  # noeviction (RedisServer's setting)
        store.client.config_set("maxmemory-policy", "allkeys-lru")
        message = check_eviction(store)
    assert message is not None
    assert "allkeys-lru" in message
    assert [r.getMessage() for r in caplog.records] == [message]


def test_startup_reads_the_policy_from_info(server: RedisServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``INFO memory`` (the documented ACL rule grants it, not ``CONFIG``); nothing said
    when it is refused."""
    store = RedisStore.from_url(server.url(), prefix="oom")
    store.client.config_set("maxmemory-policy", "volatile-lru")
    asked: list[str] = []

    def config_get(*_: object, **__: object) -> None:
        asked.append("config|get")
        raise redis.exceptions.NoPermissionError("no permissions to run 'config|get'")

    monkeypatch.setattr(store.client, "config_get", config_get)
    message = check_eviction(store)
    assert message is not None
    assert "volatile-lru" in message

    def info(*_: object, **__: object) -> None:
        raise redis.exceptions.NoPermissionError("no permissions to run 'info'")

    monkeypatch.setattr(store.client, "info", info)
    assert check_eviction(store) is None  # refused: nothing to say
    assert asked == []  # CONFIG is never asked


# serial: its tasks heartbeat every second against a max_heartbeat_interval of 2 s; with
# four xdist workers on two cores, one heartbeat came 4.1 s late and the task was stalled
@pytest.mark.serial
@pytest.mark.parametrize("full_s", [8.0, 4.0])
def test_running_tasks_survive_full_memory(tmp_path: Path, full_s: float) -> None:
    """A real prefork worker runs heartbeating and quiet tasks; the state store's memory is
    full for ``full_s`` mid-batch (longer than max_heartbeat_interval, 2 s; longer and
    shorter than the 6 s outage gap): no task fails, stalls or is dead-lettered; every task
    completes, once, after memory is freed."""
    with restartable_redis() as store_srv, restartable_redis() as broker:
        app = fault_proj.build(broker.url(), store=store_srv.url(), name="oom")
        jobbers = install(app)
        client = redis.Redis.from_url(store_srv.url())
        client.config_set("maxmemory-policy", "noeviction")
        marks = tmp_path / "marks"
        marks.mkdir()
        env = {"FAULT_PROJ_BROKER": broker.url(), "FAULT_PROJ_STORE": store_srv.url(),
               "FAULT_PROJ_NAME": "oom", "FAULT_PROJ_MARKS": str(marks)}
        worker = start_worker(app, "tests.integration.fault_proj", tmp_path, concurrency=4,
                              env=env)
        try:
            with Beat(jobbers, interval=0.5):
                # results are not read (the records are): ignore_result, so that no
                # AsyncResult stays subscribed to this test's Redis after it is stopped
                # (its later garbage collection fails in whichever test runs then)
                ids = [app.tasks["oom.beating"].apply_async((6.0,), ignore_result=True).id
                       for _ in range(4)]
                ids += [app.tasks["oom.quiet"].apply_async((1.0,), ignore_result=True).id
                        for _ in range(4)]

                def running() -> int:
                    return sum(1 for i in ids if (r := jobbers.get(i)) and r.state is S.STARTED)

                wait_for(lambda: running() >= 4, timeout=30, interval=0.05,
                         message="four tasks running")
                filled = fill_memory(client)
                began = time.monotonic()
                # full for full_s: heartbeats, liveness refreshes, cleaner passes and the steps
                # of the tasks that end meanwhile are all refused
                while time.monotonic() - began < full_s:
                    time.sleep(0.2)  # the fault's length itself: nothing to poll
                free_memory(client)
                print(f"\nmemory full for {time.monotonic() - began:.1f} s "
                      f"({filled} filler keys of 64 KiB)")

                def finished() -> list[str]:
                    return [i for i in ids
                            if (r := jobbers.get(i)) is not None and r.state in TERMINAL]

                wait_for(lambda: len(finished()) == len(ids), timeout=60, interval=0.2,
                         message="every task to be terminal")
        finally:
            worker.stop()
        log = worker.log
        refused_beats = log.count("not delivered")
        records = {i: jobbers.get(i) for i in ids}
        states = {i: r.state if r else None for i, r in records.items()}
        print(f"states {sorted(s.value for s in states.values() if s)}; heartbeats not "
              f"delivered {refused_beats}; liveness refreshes refused "
              f"{log.count('liveness refresh failed (store outage')}")
        assert all(s is S.COMPLETED for s in states.values()), (states, log[-5000:])
        assert not [t for i in ids for t in jobbers.history(i) if t.to_state is S.STALLED]
        counts = executions(marks)
        assert all(counts.get(i) == 1 for i in ids), counts
        assert "OutOfMemoryError" not in log, log[-5000:]
        assert "Traceback" not in log, log[-5000:]
        assert refused_beats > 0


def refuse_writes_for_a_failed_save(server: RedisServer, client: redis.Redis) -> None:
    """``MISCONF``: an RDB save fails (the server's directory is gone) with save points set
    and ``stop-writes-on-bgsave-error yes``; Redis then refuses writes, and even PING."""
    shutil.rmtree(server.dir)
    client.config_set("save", "3600 1")
    client.config_set("stop-writes-on-bgsave-error", "yes")
    client.bgsave()

    def failed() -> bool:
        info = client.info("persistence")
        return info["rdb_last_bgsave_status"] == "err" and not info["rdb_bgsave_in_progress"]

    wait_for(failed, timeout=10, message="the RDB save to fail")


def test_a_failed_rdb_save_is_an_outage_too(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url(), prefix="oom")
    attempt = started(store, "t1")
    before = snapshot(store, "t1")
    admin = redis.Redis.from_url(server.url())
    refuse_writes_for_a_failed_save(server, admin)
    # the step's connection is open (refused script) / a new store's is not (refused PING)
    for each in (store, RedisStore.from_url(server.url(), prefix="oom")):
        with pytest.raises(WritesRefused, match=r"^MISCONF") as info:
            each.step("t1", S.COMPLETED, fence=attempt, wid_fence="w1")
        assert isinstance(info.value, UNREACHABLE)
        beat = each.heartbeat("t1", attempt)
        assert not beat.delivered
    assert snapshot(store, "t1") == before
    # a worker's step waits until writes are taken again
    store.wait_out_outages(30)
    taken = threading.Timer(1.0, admin.config_set, args=("save", ""))
    taken.start()
    try:
        res = store.step("t1", S.COMPLETED, fence=attempt, wid_fence="w1")
    finally:
        taken.join()
    assert res.applied
    assert len(store.history("t1")) == 3


def test_a_worker_warns_at_start_when_the_policy_evicts(tmp_path: Path) -> None:
    with restartable_redis() as server:
        redis.Redis.from_url(server.url()).config_set("maxmemory-policy", "allkeys-lru")
        app = fault_proj.build(server.url(), name="evicts")
        env = {"FAULT_PROJ_BROKER": server.url(), "FAULT_PROJ_NAME": "evicts"}
        worker = start_worker(app, "tests.integration.fault_proj", tmp_path, concurrency=1,
                              env=env)
        try:
            wait_for(lambda: "maxmemory-policy allkeys-lru" in worker.log, timeout=10,
                     message="the eviction warning in the worker's log")
        finally:
            worker.stop()
    line = next(x for x in worker.log.splitlines() if "maxmemory-policy allkeys-lru" in x)
    assert "WARNING" in line
