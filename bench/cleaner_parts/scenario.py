"""The world the cleaner benchmark measures: the bench app with jobbers installed and its two
tasks (one heartbeats, one never does), the live worker incarnations and their liveness
ticker, a deployment up for a day with no outage, and the two ways a task stalls."""

from __future__ import annotations

import argparse
import random
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from _common import PrivateRedis, ping, wait_for

#: The two bench tasks: one heartbeats (``max_heartbeat_interval``), one never does.
FETCH = "bench.fetch_url"
BATCH = "bench.process_batch"
HB_INTERVAL_S = 300
DAY_MS = 86_400_000
WORKER_VARIANTS = ("hb", "worker")
#: The four ways 1,000 stall: (variant, recovered, label), in the order they run.
STALLED_VARIANTS = tuple((v, rec, f"{v}-{'recover' if rec else 'dlq'}")
                         for v in WORKER_VARIANTS for rec in (False, True))


@dataclass(frozen=True)
class LiveWorker:
    hostname: str
    wid: str


def ns_of(keys: Any) -> str:
    """The namespace of a ``Keys`` (``{jobbers}``, or a shard's ``{jobbers.3.17}``)."""
    return str(keys.task("")).removesuffix(":task:")


def make_worker(name: str) -> LiveWorker:
    # liveness.set_worker_id's format: <hostname>:<pid>:<hex6>
    host = f"celery@{name}.prod.example.internal"
    return LiveWorker(host, f"{host}:{random.randint(1000, 65000)}:{secrets.token_hex(3)}")


class Scene:
    """A Celery app on the private ``redis-server`` with jobbers installed (``--shards``,
    ``--lost-after``), its two tasks and ``--workers`` live worker incarnations."""

    def __init__(self, args: argparse.Namespace, srv: PrivateRedis) -> None:
        import redis
        from celery import Celery

        from jobbers_celery import JobbersTask, install

        self.args = args
        self.srv = srv
        self.client = redis.Redis.from_url(srv.url, decode_responses=True)
        wait_for(lambda: ping(self.client), 10, "redis-server to answer")
        self.app = Celery("bench_cleaner", broker=srv.url)
        self.app.conf.update(
            jobbers_redis_url=srv.url, jobbers_worker_lost_after=args.lost_after,
            task_serializer="json", accept_content=["json"],
            broker_connection_retry_on_startup=True,
        )
        if args.shards is not None:
            self.app.conf.jobbers_store_shards = args.shards
        self.jobbers = install(self.app)
        self.store = self.jobbers.store
        #: The global keys (dead letters, the cleaner's pass record); a task's are
        #: ``self.store.keys_of(task_id)``, each shard's ``self.store.shards.keys``.
        self.keys = self.store.keys
        #: The namespace of each shard (the dataset's layout is written here, at first use).
        self.ns = [ns_of(k) for k in self.store.shards.keys]

        @self.app.task(base=JobbersTask, name=FETCH, max_heartbeat_interval=HB_INTERVAL_S,
                       dead_letter_policy="save", queue="io", shared=False)
        def fetch_url(url: str, timeout: int = 30, tags: Any = None) -> None:
            return None

        @self.app.task(base=JobbersTask, name=BATCH, dead_letter_policy="save", shared=False)
        def process_batch(batch_id: int, source: str, options: Any = None) -> None:
            return None

        self.tasks = {FETCH: fetch_url, BATCH: process_batch}

    def make_workers(self) -> list[LiveWorker]:
        return [make_worker(f"worker-{i:02d}") for i in range(self.args.workers)]

    def now_ms(self) -> int:
        return self.store.now_ms()

    def up_for_a_day(self) -> None:
        """A deployment that has been up for a day with no outage: each shard's clock (the
        cleaner judges a shard's candidates by it) had its last gap end a day ago; the live
        workers keep it ticking (see Ticker)."""
        now = self.now_ms()
        for k in self.store.shards.keys:
            self.client.hset(k.clock, mapping={"tick": now, "resumed_at": now - DAY_MS,
                                               "gap_ms": -1})


class Ticker:
    """The live workers' liveness refresh (the real ``store.alive`` call that
    ``Liveness.refresh`` makes), in one thread.

    It keeps the workers set fresh and ticks the clock, so the cleaner sees no outage
    (``resumed_at`` stays where it was) and live workers' tasks are never judged dead.
    ``store.alive`` runs on a per-thread connection: this thread has its own. It does not say
    which tasks these simulated workers run (``running``): ``Liveness.refresh`` would report
    the live workers' loaded tasks, which no process here runs, as orphans, and stall them
    behind the measured passes' backs.
    """

    def __init__(self, jobbers: Any, workers: list[LiveWorker]) -> None:
        from jobbers_celery.lifecycle import liveness

        self.jobbers = jobbers
        self.wids = [w.wid for w in workers]
        self.gaps = liveness.gaps(jobbers.config)
        self.lost_ms = int(jobbers.config.worker_lost_after * 1000)
        self.period = liveness.refresh_period(jobbers.config.worker_lost_after)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-ticker", daemon=True)
        self.errors = 0

    def refresh(self) -> None:
        for wid in self.wids:
            self.jobbers.store.alive(wid, self.gaps, (), self.lost_ms)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - counted and reported; keep ticking
                self.errors += 1

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Stalls:
    """Makes loaded running tasks stall, the two ways the cleaner judges: a hung task on a
    live worker (heartbeat deadline passed) and a task of a worker incarnation that died."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.running: dict[str, list[str]] = {FETCH: [], BATCH: []}  # live, not yet stalled
        self._dead = 0

    def _take_running(self, name: str, n: int) -> list[str]:
        """``n`` of the loaded running tasks of ``name``, at random (no longer live)."""
        live = self.running[name]
        if len(live) < n:
            raise RuntimeError(f"{n:,} {name} tasks to stall, but {len(live):,} are loaded "
                               "running: raise --running or lower --stalled")
        return [live.pop(random.randrange(len(live))) for _ in range(n)]

    def prepare(self, variant: str, recover: bool) -> tuple[list[str], str | None]:
        """Make ``--stalled`` of the running tasks stalled. Returns their ids (and the dead wid)."""
        scene = self.scene
        store = scene.store
        of = store.keys_of  # each task's keys are in its shard
        n = scene.args.stalled
        now = scene.now_ms()
        pipe = scene.client.pipeline(transaction=False)
        dead_wid = None
        if variant == "hb":
            # hung tasks on live workers: last heartbeat 2 intervals ago, deadline passed
            ids = self._take_running(FETCH, n)
            old = now - 2 * HB_INTERVAL_S * 1000
            for task_id in ids:
                k = of(task_id)
                pipe.hset(k.task(task_id), mapping={"hb_at": old})
                pipe.zadd(k.heartbeat_due, {task_id: old + HB_INTERVAL_S * 1000})
        else:
            # a worker incarnation that died 10 minutes ago with these tasks
            self._dead += 1
            dead = make_worker(f"worker-dead-{self._dead:02d}")
            dead_wid = dead.wid
            ids = self._take_running(BATCH, n)
            for task_id, (wid, start) in zip(ids, store.fields(ids, ("wid", "start_at")),
                                             strict=True):
                k = of(task_id)
                pipe.zrem(k.worker_tasks(wid or ""), task_id)
                pipe.zadd(k.worker_tasks(dead.wid), {task_id: int(start or now)})
                pipe.hset(k.task(task_id), mapping={"wid": dead.wid, "worker": dead.hostname})
            # last seen in every shard's copy of the workers set (a liveness refresh
            # writes them all)
            for k in store.shards.keys:
                pipe.zadd(k.workers, {dead.wid: now - 600_000})
        if recover:
            for task_id in ids:
                pipe.hset(of(task_id).task(task_id), "srec", "1")  # max_stall_recoveries=1
        pipe.execute()
        return ids, dead_wid
