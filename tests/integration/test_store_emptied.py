"""jobbers' Redis restarted without persistence is reported once, clearly: two real
workers (prefork) use a private redis-server as their store; it is killed, its data
deleted, and started again empty on the same port. Exactly one of the workers logs one
ERROR line ("jobbers store emptied: ..."), and one ``store_emptied`` alert reaches the
webhook (a local HTTP receiver); later checks say nothing more."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from jobbers_celery import Jobbers, TaskState
from tests.conftest import Worker, start_worker, wait_for
from tests.integration import emptied_proj
from tests.integration.test_alerts_webhook import Receiver
from tests.integration.topology_servers import RestartableRedis, restartable_redis

pytestmark = [pytest.mark.redis, pytest.mark.worker]

LINE = "jobbers store emptied: "


@pytest.fixture
def store() -> Iterator[RestartableRedis]:
    with restartable_redis() as server:
        yield server


def _empty_restart(server: RestartableRedis) -> None:
    """Kill the server and start it again without its data (no AOF, no RDB)."""
    server.kill()
    for path in server.dir.iterdir():
        if path.name != "redis.conf":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    server.restart()


def test_a_store_restarted_empty_is_reported_once(
        store: RestartableRedis, redis_url: str, tmp_path: Path) -> None:
    receiver = Receiver()
    app = emptied_proj.build(store.url(), receiver.url)
    proj = SimpleNamespace(app=app, add=app.tasks["emptied.add"],
                           jobbers=Jobbers.of(app))
    env = {"EMPTIED_STORE": store.url(), "EMPTIED_WEBHOOK": receiver.url}
    client = redis.Redis.from_url(store.url())
    workers: list[Worker] = []
    try:
        for _ in range(2):
            workers.append(start_worker(proj.app, "tests.integration.emptied_proj", tmp_path,
                                        concurrency=1, env=env))
        first = proj.add.delay(1, 2)
        wait_for(lambda: (r := proj.jobbers.get(first.id)) is not None
                 and r.state is TaskState.COMPLETED, timeout=30, message="a first task")

        def refreshed_since(since: float) -> bool:  # each worker ticked (and checked)
            seen = [w.last_seen_at.timestamp() for w in proj.jobbers.workers()]
            return len(seen) == 2 and min(seen) > since

        since = proj.jobbers.now().timestamp()
        wait_for(lambda: refreshed_since(since), timeout=15,
                 message="a liveness refresh of each worker")

        _empty_restart(store)
        wait_for(lambda: client.dbsize() > 0, timeout=15, message="the workers back on it")
        wait_for(lambda: sum(w.log.count(LINE) for w in workers) >= 1, timeout=30,
                 message="the ERROR line")
        wait_for(lambda: len(receiver.bodies()) >= 1, timeout=30, message="the alert")
        second = proj.add.delay(2, 3)  # the store works again: a new dataset
        wait_for(lambda: (r := proj.jobbers.get(second.id)) is not None
                 and r.state is TaskState.COMPLETED, timeout=30, message="a task after")
        for _ in range(2):  # two more checks each: nothing more is said
            since = proj.jobbers.now().timestamp()
            wait_for(lambda since=since: refreshed_since(since), timeout=15,
                     message="more refreshes")

        lines = [line for w in workers for line in w.log.splitlines() if LINE in line]
        print("\n" + "\n".join(lines))
        print(f"alert: {receiver.bodies()}")
        assert len(lines) == 1
        assert "ERROR" in lines[0]
        assert "lost its data: its dataset id changed from " in lines[0]
        (alert,) = receiver.bodies()
        assert alert["kind"] == "store_emptied"
    finally:
        for worker in workers:
            worker.kill()
        client.close()
        receiver.stop()



def test_every_shards_epoch_is_read_and_a_lost_one_reported(
        redis_url: str) -> None:
    """Sharded (a Redis Cluster's node may lose its slots alone): the epoch keys of every
    shard are read, and one shard's loss is reported."""
    from jobbers_celery.lifecycle.emptied import EmptiedWatch
    from tests.integration.store_helpers import store_factory

    with store_factory(redis_url) as make:
        s = make(prefix="emptied-shards", shards=4)
        sent: list[object] = []
        watch = EmptiedWatch(s, sent.append, "emptied-shards", "w@host")
        assert not watch.check()
        first = s.epochs()
        assert len(set(first)) == 4
        assert s.epoch("any-task") in first  # the steps' epoch is its shard's
        s.client.delete(s.shards.keys[2].epoch)
        assert watch.check()
        assert watch.seen is not None
        assert watch.seen[2] != first[2]
        assert [a for i, a in enumerate(first) if i != 2] == \
            [a for i, a in enumerate(watch.seen) if i != 2]
        assert "1 of its 4 shards changed: shard 2 (" in str(getattr(sent[0], "text", ""))
