"""The state store on a real Redis Cluster of three masters and their replicas (the broker
stays the session's Redis).

The module starts its own cluster (``redis-cli --cluster create``, free ports, removed at
the end: tests/integration/topology_servers.py) and a copy of ``tests.integration.proj``
built with ``jobbers_redis_url`` on one of its nodes; the workers it starts get the same
URL (``JOBBERS_TEST_STORE_URL``). jobbers must see a cluster and use redis-py's cluster
client from that URL alone.

Representative paths with real prefork workers: the lifecycle, a delayed retry (the
scheduler), stall recovery after SIGKILL of the whole worker (the cleaner), cancellation,
the concurrency cap, a dead letter in the Redis sink resubmitted; the keys spread over the
three masters (the default 16 shards); then the slot of one shard is resharded to another
master while tasks of that shard run (clients see ``ASK``, ``TRYAGAIN`` and ``MOVED``), and
its master is failed over to its replica under load: nothing is lost or run twice. Unique
tasks: publisher processes racing on the same keys, the lock held while the copy runs and
freed at its end; the lock follows a recovered, resubmitted, stalled or cancelled copy.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import _state as celery_state
from celery.exceptions import DuplicateTaskNameWarning
from redis.cluster import RedisCluster

from jobbers_celery import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.store import RedisStore
from tests.conftest import ROOT, start_worker, subprocess_env, wait_for
from tests.integration import (
    cancel_cases,
    fair_cases,
    lifecycle_cases,
    stall_cases,
    unique_cases,
    workflow_cases,
)
from tests.integration.lifecycle_helpers import unique, wait_state
from tests.integration.topology_servers import ClusterSet, cluster_set

pytestmark = [pytest.mark.redis, pytest.mark.worker, pytest.mark.cluster]

S = TaskState


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    with cluster_set() as servers:
        yield servers


@pytest.fixture(scope="module")
def cluster_proj(cluster: ClusterSet, redis_server: Any) -> Iterator[ModuleType]:
    """``tests/integration/proj.py`` executed again as another module, its store on the
    cluster (the session's ``proj`` keeps the plain Redis)."""
    import tests.integration.proj as original  # the session's, on the plain Redis

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBBERS_TEST_STORE_URL", cluster.url(1))  # any node will do
        spec = importlib.util.spec_from_file_location("tests.integration.proj_on_cluster",
                                                      original.__file__)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        finalizers = set(celery_state._on_app_finalizers)
        current = celery_state.get_current_app()
        spec.loader.exec_module(module)
        with warnings.catch_warnings():
            # proj's tasks are shared (Celery's default): the copy's app also receives the
            # session module's callables of the same names; either runs the same body
            warnings.simplefilter("ignore", DuplicateTaskNameWarning)
            module.app.finalize(auto=True)
        # and apps made later must not receive the copy's
        celery_state._on_app_finalizers.intersection_update(finalizers)
        try:
            yield module
        finally:  # the session's proj is the app of the tests that follow
            sys.modules.pop(spec.name, None)
            Jobbers._installed.discard(module.jobbers)
            current.set_current()


@pytest.fixture
def proj(cluster_proj: ModuleType, cluster: ClusterSet, redis_url: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """This module's tests use the cluster-backed app; workers get its store URL."""
    monkeypatch.setenv("JOBBERS_TEST_STORE_URL", cluster.url(1))
    cluster.flush()
    yield cluster_proj
    print(f"\nkeys per master (port: keys) {cluster.keys_per_master()}")


def test_the_store_is_a_cluster_client(proj: Any) -> None:
    assert isinstance(proj.jobbers.store.client, RedisCluster)


@pytest.mark.parametrize("case", [
    fair_cases.case_publish_parks_past_the_room_and_releases_in_order,
    fair_cases.case_start_parks_an_unthrottled_publish_past_the_cap,
    fair_cases.case_a_task_parked_again_keeps_its_place,
    fair_cases.case_a_task_first_parked_at_its_start_is_placed_by_its_submission,
    fair_cases.case_a_parked_task_come_due_is_published_once_and_no_longer_parked,
])
def test_fair_shares_on_the_cluster(proj: Any, case: Callable[[Any], None]) -> None:
    """Fair shares: a key's lists live in the global slot, which a publish and a keyed start
    ask first (one call), whatever master holds the task's shard."""
    case(proj.jobbers.store)


@pytest.mark.parametrize("case", unique_cases.CASES,
                         ids=[c.__name__[5:] for c in unique_cases.CASES])
def test_unique_locks_follow_their_task_on_the_cluster(proj: Any,
                                                       case: Callable[[Any], None]) -> None:
    """Unique tasks: the lock in the global slot (one master), the record in its shard's
    (maybe another): a stall recovery and a resubmit take it again, a stall verdict, a
    cancel and a purge delete it (tests/integration/unique_cases.py)."""
    case(proj.jobbers.store)


def test_a_plain_client_on_a_cluster_node_is_a_clear_error(cluster: ClusterSet) -> None:
    """The store of a process that could not ask the node whether it is a cluster (it was
    unreachable at start) and so got a plain client: the first step the node redirects
    says what happened and what to do, instead of failing obscurely."""
    import redis

    from jobbers_celery.core.errors import ConfigurationError
    from jobbers_celery.store import RedisStore

    keys_slot = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port).keyslot(
        "{jobbers}:x")
    other = next(p for p in cluster.masters() if p != cluster.owner(keys_slot))
    store = RedisStore(redis.Redis(port=other, decode_responses=True))
    with pytest.raises(ConfigurationError, match=r"names a Redis Cluster node.*restart"):
        store.submit("t-1", sources=(TaskState.UNSUBMITTED,), reason="published",
                     create={"name": "x", "queue": "celery"})


def test_keys_spread_over_every_master(proj: Any, worker_factory: Any,
                                       cluster: ClusterSet) -> None:
    """The shards' hash tags fall in equal slot ranges, so with ``--cluster create``'s
    three equal ranges each master serves a third of the shards, and the records of 48
    tasks land on all three."""
    store = proj.jobbers.store
    assert store.shards.count == 16
    shard_owner = [cluster.owner(store.client.keyslot(k.task("x"))) for k in store.shards.keys]
    per_master = {port: shard_owner.count(port) for port in cluster.masters()}
    worker = worker_factory(concurrency=4)
    ids = [proj.add.delay(i, 1).id for i in range(48)]
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.COMPLETED, worker=worker)
    keys = cluster.keys_per_master()
    records = {port: 0 for port in keys}
    for task_id in ids:
        records[cluster.owner(store.client.keyslot(store.keys_of(task_id).task(task_id)))] += 1
    print(f"\nshards per master {per_master}; records of 48 tasks per master {records}; "
          f"keys per master {keys}")
    assert sorted(per_master.values()) == [5, 5, 6]
    assert all(n > 0 for n in records.values()), records
    assert all(n > 0 for n in keys.values()), keys
    assert sum(proj.jobbers.counts().values()) == 48


def test_lifecycle(proj: Any, worker_factory: Any, tmp_path: Path) -> None:
    lifecycle_cases.started_then_completed_with_timestamps(proj, worker_factory, "prefork")
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("w-*.log"))
    assert "MOVED" not in logs
    assert "Traceback" not in logs


def test_reads_cleaner_and_purge_on_the_cluster(proj: Any, worker_factory: Any) -> None:
    """What the CLI, the Django live pages and the metric gauges read, on the cluster."""
    worker = worker_factory(concurrency=2)
    ids = [proj.add.delay(i, i).id for i in range(5)]
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.COMPLETED, worker=worker)
    later = proj.flaky.apply_async((1, 300)).id  # fails once, then waits 300 s
    wait_state(proj.jobbers, later, S.SCHEDULED, worker=worker)
    jobbers = proj.jobbers
    assert jobbers.counts()[S.COMPLETED] == 5
    assert jobbers.counts()[S.SCHEDULED] == 1
    newest = [r.task_id for r in jobbers.tasks(limit=3)]
    assert len(newest) == 3
    assert newest[0] == later
    assert sorted(r.task_id for r in jobbers.tasks(state=S.COMPLETED, name="proj.add")) \
        == sorted(ids)
    assert [r.task_id for r in jobbers.scheduled()] == [later]
    assert [w.hostname for w in jobbers.workers()] == [worker.name]
    report = jobbers.cleaner.run(by="test")
    assert report.as_dict()["stalled"] == 0
    purged = jobbers.purge(name="proj.add")
    assert purged.removed == 5
    assert jobbers.get(ids[0]) is None


def test_delayed_retries_wait_in_the_store_and_are_republished(proj: Any,
                                                              worker_factory: Any) -> None:
    lifecycle_cases.expected_exception_with_delay_waits_in_scheduled(
        proj, worker_factory, "prefork")


def test_killed_worker_task_is_stalled_and_resumed_once(proj: Any, worker_factory: Any) -> None:
    stall_cases.killed_worker_task_is_stalled_and_resumed_once_on_another_worker(
        proj, worker_factory, "resumable", "prefork")


def test_started_task_ends_cancelled_at_its_next_heartbeat(proj: Any,
                                                           worker_factory: Any) -> None:
    cancel_cases.started_task_ends_cancelled_at_its_next_heartbeat(
        proj, worker_factory, "prefork")


def test_scheduled_task_cancelled_at_once(proj: Any, worker_factory: Any) -> None:
    cancel_cases.scheduled_task_cancelled_at_once_and_never_republished(proj, worker_factory)


def test_concurrency_cap_holds(proj: Any, worker_factory: Any) -> None:
    from tests.integration.test_concurrency import most_started_at_once

    worker_factory(concurrency=4)
    key = unique("capped")
    ids = [proj.capped.delay(key, 0.3).id for _ in range(8)]
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.COMPLETED, timeout=60)
    assert most_started_at_once(proj.jobbers, ids) <= 2
    assert int(proj._redis().get(f"{key}:max") or 0) <= 2


def test_a_nested_canvas_and_a_cancelled_workflow_on_the_cluster(proj: Any,
                                                                 worker_factory: Any) -> None:
    """A workflow's members spread over the shards (and so the masters): its index is read
    from every shard, its cancel mark written to every shard."""
    worker = worker_factory(concurrency=4)
    workflow_cases.a_nested_canvas_is_one_workflow(proj, worker)
    workflow_cases.cancelling_a_running_workflow_cancels_its_members(proj, worker)


def test_a_dead_letter_is_resubmitted_and_completes(proj: Any, worker_factory: Any) -> None:
    worker_factory(concurrency=2)
    key = unique("fail-once")
    task_id = proj.fail_once.delay(key).id
    wait_state(proj.jobbers, task_id, S.FAILED, timeout=30)
    sink = proj.jobbers.sink
    [entry] = wait_for(lambda: sink.of_task(task_id), timeout=15, message="the dead letter")
    assert proj.jobbers.resubmit_dead_letters([entry]) == [task_id]
    record = wait_state(proj.jobbers, task_id, S.COMPLETED, timeout=30)
    assert record.attempt == 2


def _under_load(proj: Any, worker_factory: Any, cluster: ClusterSet, tmp_path: Path,
                fault: Callable[[int], str]) -> dict[str, int]:
    """Run ``fault(slot)`` on the slot of one shard once 5 of 40 tasks of that shard ran,
    publish 10 more after it, and check that all 50 complete, each body once, with no
    traceback in the workers' logs. Returns the ``ASK``/``TRYAGAIN``/``MOVED`` replies the
    clients met meanwhile; prints them with what ``fault`` says it did."""
    store = proj.jobbers.store
    shard = 3
    slot = store.client.keyslot(store.shards.keys[shard].task("x"))
    in_shard = (i for i in (str(uuid.uuid4()) for _ in range(100_000))
                if store.shards.index(i) == shard)
    worker_factory(concurrency=4)
    key = unique("runs")
    before = cluster.redirections()
    ids = [proj.record_run.apply_async((key, 0.05), task_id=next(in_shard)).id
           for _ in range(40)]
    wait_for(lambda: proj._redis().llen(key) >= 5, timeout=30, message="tasks to run")
    done = fault(slot)
    ids += [proj.record_run.apply_async((key, 0.0), task_id=next(in_shard)).id
            for _ in range(10)]  # after it: MOVED
    for task_id in ids:
        wait_state(proj.jobbers, task_id, S.COMPLETED, timeout=60)
    runs = proj._redis().lrange(key, 0, -1)
    assert sorted(r.split(":")[0] for r in runs) == sorted(ids)  # each body ran once
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("w-*.log"))
    assert "Traceback" not in logs  # waited out as a store outage, not a failure
    after = cluster.redirections()
    met = {k: after.get(k, 0) - before.get(k, 0) for k in ("ASK", "TRYAGAIN", "MOVED")}
    print(f"\n{done} while {len(ids)} tasks ran: replies met {met}; completed {len(ids)}, "
          f"ran twice 0, lost 0")
    return met


def test_resharding_the_slot_under_load_loses_nothing(proj: Any, worker_factory: Any,
                                                      cluster: ClusterSet,
                                                      tmp_path: Path) -> None:
    """Move the slot of a shard to another master, a few keys at a time, while 40
    tasks run: during the move the clients get ``ASK`` (keys already moved) and
    ``TRYAGAIN`` (a script's keys split between two nodes), after it ``MOVED``. Every task
    must complete once."""

    def reshard(slot: int) -> str:
        source = cluster.owner(slot)
        target = next(port for port in cluster.masters() if port != source)

        def met_half_moved() -> None:  # a client met the slot half moved: ASK or TRYAGAIN
            seen = cluster.redirections()
            wait_for(lambda: _half_moved(cluster.redirections()) > _half_moved(seen),
                     timeout=30, message="a client to meet the slot half moved")

        moved = cluster.migrate_slot(slot, target, batch=3, between=met_half_moved)
        assert cluster.owner(slot) == target
        return f"resharded slot {slot} from {source} to {target}: {moved} keys moved"

    met = _under_load(proj, worker_factory, cluster, tmp_path, reshard)
    assert met["MOVED"] > 0


def _half_moved(counts: dict[str, int]) -> int:
    return counts.get("ASK", 0) + counts.get("TRYAGAIN", 0)


def test_failing_the_master_over_under_load_loses_nothing(proj: Any, worker_factory: Any,
                                                         cluster: ClusterSet,
                                                         tmp_path: Path) -> None:
    """``CLUSTER FAILOVER`` to the replica of the master that serves a shard's slot while 40
    tasks of that shard run: the old master becomes a replica and answers ``MOVED``; the clients follow
    to the new master. Every task completes once."""

    def failover(slot: int) -> str:
        old = cluster.owner(slot)
        new = cluster.failover(old)
        assert cluster.owner(slot) == new
        return f"failed over slot {slot} from {old} to {new}"

    _under_load(proj, worker_factory, cluster, tmp_path, failover)


#: A publisher process of tests/integration/unique_proj.py (its store on the cluster): reads
#: the layout, says it is ready, waits for the go key, publishes each key of argv in order
#: and prints the ids it was answered with (JSON).
UNIQUE_PUBLISHER = """
import json, sys, time, redis
from tests.integration import unique_proj as p
ready, go, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
assert p.jobbers.store.sharded
c = redis.Redis.from_url(p.URL)
c.incr(ready)
while not c.exists(go):
    time.sleep(0.001)
print(json.dumps([p.until_end.delay(k).id for k in keys]))
"""


def test_racing_publishers_of_a_unique_task_on_the_cluster(proj: Any, cluster: ClusterSet,
                                                            tmp_path: Path) -> None:
    """Four publisher processes publish the same 8 keys of a unique task (``until=end``,
    16 shards) at once: one record and one message per key, every publisher answered with
    the winner's id; the lock (global slot) is held while the copy runs on a prefork worker
    and freed when it ends, whatever master holds the copy's record."""
    from tests.integration import unique_proj as up

    tag = uuid.uuid4().hex[:8]
    env = {"UNIQUE_PROJ_STORE": cluster.url(1), "UNIQUE_PROJ_SHARDS": "16",
           "UNIQUE_PROJ_PREFIX": f"uqc{tag}"}
    keys = [f"uqc:{tag}:{i}" for i in range(8)]
    broker = up._client  # the session's Redis: broker, and the bodies' marks
    ready, go = f"uqc:{tag}:ready", f"uqc:{tag}:go"
    procs = [subprocess.Popen([sys.executable, "-c", UNIQUE_PUBLISHER, ready, go, *keys],
                              cwd=ROOT, env=subprocess_env(env), stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    try:
        wait_for(lambda: int(broker.get(ready) or 0) == 4
                 or any(p.poll() is not None for p in procs), timeout=30,
                 message="the publishers to import and connect")
        broker.set(go, 1)
        answers = []
        for proc in procs:
            stdout, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0
            answers.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    winners = answers[0]
    for i in range(len(keys)):
        assert len({answer[i] for answer in answers}) == 1, f"key {i}: {answers}"
    store = RedisStore(RedisCluster.from_url(cluster.url(1), decode_responses=True),
                       prefix=f"uqc{tag}", shards=16)
    assert sorted(r.task_id for r in store.tasks(name="uq.end", limit=100)) == sorted(winners)
    sent = [json.loads(raw)["headers"] for raw in broker.lrange("celery", 0, -1)]
    assert sorted(h["id"] for h in sent if h["task"] == "uq.end") == sorted(winners)
    masters = {cluster.owner(store.client.keyslot(store.keys_of(w).task(w))) for w in winners}
    infos = [store.unique_of(w) for w in winners]
    assert [getattr(info, "holder", None) for info in infos] == winners
    digests = [info.digest for info in infos if info is not None]
    locks = [store.keys.unique(d) for d in digests]
    assert all(store.client.exists(lock) for lock in locks)
    broker.set(f"{keys[0]}:hold", 1)
    worker = start_worker(up.app, "tests.integration.unique_proj", tmp_path, env=env)
    try:
        def state(task_id: str) -> str:
            return store.get_raw(task_id).get("state", "")

        wait_for(lambda: state(winners[0]) == "started", timeout=20, message="key 0 to start")
        assert store.unique_holder(digests[0]) == winners[0]
        broker.delete(f"{keys[0]}:hold")
        wait_for(lambda: all(state(w) == "completed" for w in winners), timeout=20,
                 interval=0.05, message="every copy to complete")
    finally:
        worker.kill()
    try:
        assert [int(broker.llen(f"{k}:ran")) for k in keys] == [1] * len(keys)
        assert [store.unique_holder(d) for d in digests] == [None] * len(keys)
        # on shards the lock is deleted by a call of its own right after the end step
        wait_for(lambda: not any(store.client.exists(lock) for lock in locks), timeout=10,
                 message="the locks to be deleted")
        lock_masters = {cluster.owner(store.client.keyslot(lock)) for lock in locks}
    finally:
        store.client.close()
    print(f"\n4 publishers x {len(keys)} keys: {len(winners)} records, {len(sent)} messages; "
          f"records on {len(masters)} master(s), locks on {lock_masters}; freed at the end")
