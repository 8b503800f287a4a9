"""A Redis that goes away under load: a Sentinel failover, and a plain Redis killed and
restarted. Real prefork workers run a batch of tasks (half heartbeat, half never do) while
the fault happens; every task must end terminal, none stalled falsely, none run twice.

Each test starts its own servers on free ports (tests/integration/topology_servers.py) and
its own worker on them; executions are counted from marker files, not from the Redis that
fails. The figures (recovery time, counts) are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from redis.sentinel import SentinelConnectionPool

from jobbers_celery import TaskState, install
from jobbers_celery.core.states import TERMINAL
from tests.conftest import start_worker, wait_for
from tests.integration import fault_proj
from tests.integration.beat_helpers import Beat
from tests.integration.topology_servers import (
    MASTER_NAME,
    BatchOutcome,
    restartable_redis,
    sentinel_set,
)

S = TaskState
CONCURRENCY = 6
#: 16 tasks that heartbeat for 2 s and 16 that sleep 1 s without heartbeats: ~8 s of work
#: on 6 processes, so the fault lands with tasks running and others queued.
BEATING, QUIET = 16, 16


@contextlib.contextmanager
def fault_worker(tmp_path: Path, app: Celery, env: dict[str, str]) -> Iterator[Path]:
    """A real prefork worker of ``fault_proj``; yields its log file (w-*.log: attached to
    the report on failure)."""
    worker = start_worker(app, "tests.integration.fault_proj", tmp_path,
                          concurrency=CONCURRENCY, env=env)
    try:
        yield worker.log_path
    finally:
        worker.stop()


@dataclass
class Figures(BatchOutcome):
    """What a fault did to a batch, and how long it took to recover."""

    fault_s: float = 0.0
    recovered_s: float = 0.0
    cleaner_errors: int = 0

    def line(self, what: str) -> str:
        return (f"{what}: published {self.published}, completed {self.completed}, other "
                f"terminal {self.other_terminal}, lost {self.lost}, ran twice "
                f"{self.ran_twice}, stalled {self.stalled} (end lost {self.lost_ends}); fault "
                f"{self.fault_s:.2f} s, first step after it {self.recovered_s:.2f} s after it "
                f"began; cleaner passes that failed meanwhile {self.cleaner_errors}")


def run_batch(tmp_path: Path, app: Celery, env: dict[str, str], fault: Callable[[], float],
              check: Callable[[], None] = lambda: None) -> Figures:
    """Publish the batch, call ``fault()`` (returns when the fault is over; its duration)
    once a quarter of it completed, wait until every task is terminal, ``check()`` while
    the worker still runs; count."""
    marks = tmp_path / "marks"
    marks.mkdir()
    jobbers = install(app)
    figures = Figures()
    with fault_worker(tmp_path, app, {**env, "FAULT_PROJ_MARKS": str(marks)}), \
            Beat(jobbers, interval=0.5) as beat:
        # the records are read, not the results: no AsyncResult stays subscribed to a
        # Redis the test stops (its later garbage collection fails another test)
        ids = [app.tasks[f"{app.main}.beating"].apply_async((2.0,), ignore_result=True).id
               for _ in range(BEATING)]
        ids += [app.tasks[f"{app.main}.quiet"].apply_async((1.0,), ignore_result=True).id
                for _ in range(QUIET)]
        figures.published = len(ids)

        def finished() -> list[str]:
            return [i for i in ids if (r := jobbers.get(i)) is not None and r.state in TERMINAL]

        wait_for(lambda: len(finished()) >= len(ids) // 4, timeout=60, interval=0.1,
                 message="a quarter of the batch to finish")
        began = time.monotonic()
        began_ms = time.time() * 1000
        figures.fault_s = fault()
        # the first lifecycle step any worker recorded once the fault was over (the new
        # master named by every sentinel, or Redis restarted), from when the fault began
        over_ms = began_ms + figures.fault_s * 1000
        figures.recovered_s = figures.fault_s + wait_for(
            lambda: _first_step_after(jobbers, ids, over_ms), timeout=60, interval=0.05,
            message="a lifecycle step after the fault") / 1000
        try:
            wait_for(lambda: len(finished()) == len(ids), timeout=60, interval=0.2,
                     message="every task of the batch to be terminal")
        except AssertionError:
            for i in ids:
                r = jobbers.get(i)
                print(i, r and r.state, [(t.to_state.value, t.at.isoformat()) for t in jobbers.history(i)])
            print("fault at", began_ms, figures)
            raise
        check()
        figures.cleaner_errors = sum(1 for at, _ in beat.errors if at >= began)
    figures.count(jobbers, ids, marks)
    return figures


def _first_step_after(jobbers: Any, ids: list[str], after_ms: float) -> float | None:
    """ms from ``after_ms`` to the earliest step recorded after it (None: none yet)."""
    times = [t.at.timestamp() * 1000 for i in ids for t in jobbers.history(i)]
    later = [t for t in times if t > after_ms]
    return min(later) - after_ms if later else None


def assert_clean(figures: Figures, lost_ends_allowed: bool = False) -> None:
    """Every task completed and ran; no false stall (no heartbeat, worker not seen); a task
    ran twice only if the fault lost the end of its attempt in flight (asynchronous
    replication: Sentinel only)."""
    assert figures.completed == figures.published, figures
    assert figures.lost == 0, figures
    assert figures.stalled == figures.lost_ends, figures
    assert figures.ran_twice <= figures.lost_ends, figures
    if not lost_ends_allowed:
        assert figures.lost_ends == 0, figures


def test_sentinel_failover_mid_batch(tmp_path: Path) -> None:
    """Broker, results and the state store on one Sentinel set (kombu's URL form);
    ``SENTINEL FAILOVER`` while the batch runs."""
    with sentinel_set() as servers:
        app = fault_proj.build(servers.url, MASTER_NAME, name="failover")
        jobbers = install(app)
        assert jobbers.config.redis_url == servers.url
        ports: list[int] = []

        def failover() -> float:
            started = time.monotonic()
            ports.extend(servers.failover())
            return time.monotonic() - started

        def liveness_on_new_master() -> None:
            # the worker's liveness thread writes to the new master
            assert isinstance(jobbers.store.client.connection_pool, SentinelConnectionPool)
            new_master = redis.Redis(port=ports[1], decode_responses=True)
            assert new_master.info("replication")["role"] == "master"
            key = jobbers.store.shards.keys[0].workers
            wait_for(lambda: max(score for _, score in new_master.zrange(key, 0, -1,
                                                                         withscores=True))
                     > jobbers.store.now_ms() - 3000, message="a liveness refresh on it")

        env = {"FAULT_PROJ_BROKER": servers.url, "FAULT_PROJ_MASTER": MASTER_NAME,
               "FAULT_PROJ_NAME": "failover"}
        figures = run_batch(tmp_path, app, env, failover, liveness_on_new_master)
        print("\n" + figures.line(f"Sentinel failover {ports[0]} -> {ports[1]}"))
    assert_clean(figures, lost_ends_allowed=True)


def test_redis_killed_and_restarted_mid_batch(tmp_path: Path) -> None:
    """The state store's Redis (AOF on) killed with SIGKILL and restarted after 3 s under
    the batch: shorter than the 6 s outage gap that silence alone reveals, longer than the
    tasks' max_heartbeat_interval (2 s). The broker is another Redis, which stays up: this is
    about jobbers' verdicts, not kombu's reconnection."""
    with restartable_redis() as store, restartable_redis() as broker:
        app = fault_proj.build(broker.url(), store=store.url(), name="restart")

        def restart() -> float:
            started = time.monotonic()
            store.kill()
            time.sleep(3.0)  # the outage itself: nothing to poll meanwhile
            store.restart()
            return time.monotonic() - started

        env = {"FAULT_PROJ_BROKER": broker.url(), "FAULT_PROJ_STORE": store.url(),
               "FAULT_PROJ_NAME": "restart"}
        figures = run_batch(tmp_path, app, env, restart)
        print("\n" + figures.line("Redis killed, restarted after 3 s"))
    assert_clean(figures)
