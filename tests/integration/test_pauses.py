"""Pause and resume of a task name or a queue, with real ``celery worker`` subprocesses.

- a paused task name's messages are held (``scheduled``, reason ``paused: ...``, no
  ``run_at``, no retry used), a worker started after the pause holds them too, and after
  the resume each runs exactly once;
- messages a busy worker had already fetched when the pause came are held when they
  reach the pool (the pause in flight);
- a paused queue is no longer consumed (Redis and RabbitMQ brokers): its messages stay in
  the broker, counted in its depth (and, on Redis, the age of the oldest), a worker
  started later does not consume it either, and they run after the resume;
- a message fetched from a paused queue goes back to that queue only (RabbitMQ: its
  consumer tag's; Redis: the queue stamped at delivery, not every queue its exchange and
  routing key bind).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobbers_celery import PauseOutcome, TaskState
from jobbers_celery.core.pauses import HELD_REASON
from jobbers_celery.lifecycle import pausing
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.integration.test_cli import Run, cli
from tests.rabbitmq import RabbitVhost, use_broker

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState


#: A pause waits ``pausing.REPLY_TIMEOUT_S`` (1 s) for the workers' replies; a worker that
#: replies later (a loaded machine) applies the pause all the same but is missing from the
#: outcome's ``workers``. The pauses whose ``workers`` a test checks wait REPLY_S (the
#: whole of it: Celery collects replies until the timeout), still far from a worker that
#: never replies, the only way to miss it here.
REPLY_S = 5.0


def pause(proj: Any, **target: str) -> PauseOutcome:
    """``jobbers.pause(**target)`` waiting up to REPLY_S for the replies."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pausing, "REPLY_TIMEOUT_S", REPLY_S)  # read at each broadcast
        return proj.jobbers.pause(by="test", **target)


def cli_pause(*args: str) -> Run:
    """``cli("pause", *args)``, waiting up to REPLY_S for the replies (set in the command's
    own process)."""
    code = ("import sys; from jobbers_celery.lifecycle import pausing; "
            f"pausing.REPLY_TIMEOUT_S = {REPLY_S}; from celery.__main__ import main; "
            "sys.argv[0] = 'celery'; main()")
    proc = subprocess.run(
        [sys.executable, "-c", code, "-A", "tests.integration.proj", "jobbers", "pause",
         *args], cwd=ROOT, env=subprocess_env({"NO_COLOR": "1"}), capture_output=True,
        text=True, timeout=60, check=False)
    return Run(("pause", *args), proc.returncode, proc.stdout, proc.stderr)


def _held(proj: Any, task_id: str) -> bool:
    rec = proj.jobbers.get(task_id)
    if rec is None or rec.state is not S.SCHEDULED:
        return False
    last = proj.jobbers.history(task_id)[-1]
    return rec.run_at is None and (last.reason or "").startswith(HELD_REASON)


def _ran_once_each(r: Any, key: str, ids: list[str]) -> bool:
    runs = r.lrange(key, 0, -1)
    return sorted(runs) == sorted(f"{i}:1" for i in ids)


def test_paused_task_name_is_held_then_runs_once_after_resume(proj, worker_factory, r):
    w1 = worker_factory(concurrency=2)
    out = pause(proj, name="proj.record_run")
    assert out.changed
    assert w1.name in out.workers
    key = "pause:runs"
    ids = [proj.record_run.delay(key).id for _ in range(3)]
    wait_for(lambda: all(_held(proj, i) for i in ids), timeout=15,
             message="the 3 messages held")
    # a task of another name still runs on the same worker
    assert proj.add.delay(1, 2).get(timeout=10) == 3
    assert r.llen(key) == 0
    assert proj.jobbers.held_count("proj.record_run") == 3
    for i in ids:
        rec = proj.jobbers.get(i)
        assert rec.retry_attempt == 0
        assert rec.attempt == 0
        assert rec.error is None

    # a worker started after the pause obeys it
    w1.stop()
    w2 = worker_factory(concurrency=2)
    later = [proj.record_run.delay(key).id for _ in range(2)]
    wait_for(lambda: all(_held(proj, i) for i in later), timeout=15,
             message="the messages the later worker received held")
    assert f"holding proj.record_run[{later[0]}]" in w2.log or \
        f"holding proj.record_run[{later[1]}]" in w2.log
    assert [p.target for p in proj.jobbers.pauses()] == ["proj.record_run"]

    res = proj.jobbers.resume(name="proj.record_run", by="test")
    assert res.changed
    assert res.released == 5
    every = ids + later
    wait_for(lambda: all(proj.jobbers.get(i).state is S.COMPLETED for i in every),
             timeout=20, message="the 5 held tasks completed after the resume")
    assert _ran_once_each(r, key, every)
    for i in every:
        rec = proj.jobbers.get(i)
        assert rec.retry_attempt == 0
        assert rec.attempt == 1
        steps = [(t.to_state, (t.reason or "").split(":")[0]) for t in proj.jobbers.history(i)]
        assert steps[:4] == [(S.SUBMITTED, "published"), (S.SCHEDULED, HELD_REASON),
                             (S.SUBMITTED, "resumed"), (S.STARTED, "")], steps
    assert proj.jobbers.held_count("proj.record_run") == 0
    assert proj.jobbers.pauses() == []


def test_pause_of_messages_already_fetched_holds_them(proj, worker_factory, r):
    """The pause comes while the worker holds fetched messages (prefetch) behind a busy
    pool slot: they are held when they reach the pool, not run."""
    worker_factory(concurrency=1)
    blocker = proj.until_released.delay("pause:block")
    wait_for(lambda: r.llen("pause:block") == 1, timeout=10, message="the blocker started")
    key = "pause:fetched"
    ids = [proj.record_run.delay(key).id for _ in range(2)]
    out = pause(proj, name="proj.record_run")
    assert out.workers  # it holds the pause before the blocker ends
    r.set("pause:block:release", "ok")
    assert blocker.get(timeout=10) == "ok"
    wait_for(lambda: all(_held(proj, i) for i in ids), timeout=10,
             message="the fetched messages held")
    assert r.llen(key) == 0
    proj.jobbers.resume(name="proj.record_run", by="test")
    wait_for(lambda: _ran_once_each(r, key, ids), timeout=15, message="both ran once")


def _depth(proj: Any, queue: str) -> int | None:
    got = [q for q in proj.jobbers.queues() if q.name == queue]
    return got[0].depth if got else None


def _queue_paused_keeps_messages(proj: Any, worker_factory: Any, r: Any,
                                 full: bool) -> Any:
    """The queue ``other`` paused: messages stay in the broker; after the resume each runs
    once. ``full``: also through the command line, and a worker started later leaves them
    there too. Returns the queue's info while paused."""
    w1 = worker_factory(queues="celery,other")
    if full:
        out = cli_pause("--queue", "other", "--json")  # the command line, end to end
        assert out.rc == 0, out.err
        assert out.json()["changed"] is True
        assert w1.name in out.json()["workers"]
    else:
        assert w1.name in pause(proj, queue="other").workers
    wait_for(lambda: "Canceling queue other" in w1.log, timeout=10,
             message="the consumer of other cancelled")
    key = "pause:queue"
    ids = [proj.record_run.apply_async((key,), queue="other").id for _ in range(3)]
    wait_for(lambda: _depth(proj, "other") == 3, timeout=10, message="3 messages in other")
    # the worker goes on with its other queue, and leaves these in the broker
    assert proj.add.delay(2, 2).get(timeout=10) == 4
    if full:
        w2 = worker_factory(queues="celery,other")  # started later: does not consume other
        assert "not consuming from queue other: it is paused" in w2.log
        assert proj.add.apply_async((3, 3)).get(timeout=10) == 6
    info = next(q for q in proj.jobbers.queues(proj.jobbers.worker_views())
                if q.name == "other")
    assert info.depth == 3
    assert info.paused
    if full:
        shown = {q["name"]: q for q in cli("queues", "--json").json()}
        assert shown["other"]["depth"] == 3
        assert shown["other"]["paused"] is True
    assert r.llen(key) == 0
    assert all(proj.jobbers.get(i).state is S.SUBMITTED for i in ids)
    proj.jobbers.resume(queue="other", by="test")
    wait_for(lambda: _ran_once_each(r, key, ids), timeout=15, message="the 3 ran once")
    assert _depth(proj, "other") == 0
    return info, ids


def test_paused_queue_on_redis_keeps_messages_and_reports_age(proj, worker_factory, r):
    info, ids = _queue_paused_keeps_messages(proj, worker_factory, r, full=True)
    assert info.oldest_task_id == ids[0]  # the tail of the list: consumed first
    assert info.oldest_age_s is not None
    assert 0 <= info.oldest_age_s < 60
    assert info.consumers == []  # no worker consumes it while it is paused


@pytest.fixture
def on_rabbitmq(proj: Any, rabbitmq: RabbitVhost, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> Iterator[None]:
    rabbitmq.reset()
    with use_broker(proj.app, rabbitmq.url, monkeypatch):
        yield
    rabbitmq.reset()


@pytest.mark.rabbitmq
def test_paused_queue_on_rabbitmq_keeps_messages(proj, worker_factory, r, on_rabbitmq):
    info, ids = _queue_paused_keeps_messages(proj, worker_factory, r, full=False)
    # the age from jobbers' records: AMQP cannot show a message without taking it
    assert info.oldest_task_id == ids[0]
    assert info.oldest_age_s is not None
    assert 0 <= info.oldest_age_s < 60
    assert "records" in info.note


def test_redis_depth_and_oldest_over_priority_lists_and_a_key_prefix(redis_url, r):
    """kombu's Redis queue is a list per priority step (``name\\x06\\x16<n>``) under the
    transport's ``global_keyprefix``: the depth sums them, the oldest message is the
    oldest of their tails, and nothing is taken from them."""
    from celery import Celery

    from jobbers_celery.lifecycle import fleet

    app = Celery("prefixed", broker=redis_url, set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": "pfx:"}
    now = 10_000_000
    # published with kombu itself: no Celery publish signal (jobbers' stamps its own time)
    with app.connection_for_write() as conn, conn.SimpleQueue("pq") as queue:
        for n, (priority, at) in enumerate([(0, now - 9000), (6, now - 4000),
                                            (0, now - 1000)]):
            queue.put({"n": n}, headers={"id": f"m{n}", "jobbers_published_at": at},
                      priority=priority)
    assert r.llen("pfx:pq") == 2
    assert r.llen("pfx:pq\x06\x166") == 1
    (info,) = fleet.read_queues(app, ["pq"], now, lambda _: None)
    assert info.depth == 3
    assert info.oldest_task_id == "m0"
    assert info.oldest_age_s == 9.0
    assert r.llen("pfx:pq") + r.llen("pfx:pq\x06\x166") == 3  # nothing taken
    (empty,) = fleet.read_queues(app, ["nothing-here"], now, lambda _: None)
    assert empty.depth == 0
    assert empty.oldest_age_s is None


@pytest.mark.parametrize("shards", [1, 16])
def test_hold_and_release_scripts_on_redis(make_store, shards):
    """hold.lua and release.lua on a real Redis, with one shard and with 16 (each shard's
    copy of the pauses): a hold only while paused, a held record without run_at that no
    scheduler claims, a release that waits while paused again, forgets a cancelled one,
    and publishes each once."""
    from jobbers_celery.core.pauses import PauseKind, held_reason
    from tests.integration.store_helpers import create

    store = make_store(prefix=f"pz{shards}", shards=shards)
    name = "proj.paused"
    ids = [f"held-{n}" for n in range(6)]
    for i in ids:
        create(store, i, name=name)
    reason = held_reason(name)
    refused = store.hold(ids[0], name, worker="w1", reason=reason)
    assert not refused.applied
    assert refused.why == "not_paused"
    assert store.pause(PauseKind.TASK, name, "test")
    assert not store.pause(PauseKind.TASK, name, "again")
    for i in ids:
        assert store.hold(i, name, worker="w1", reason=reason).state is S.SCHEDULED
    assert store.held_count(name) == 6
    rec = store.get(ids[0])
    assert rec.state is S.SCHEDULED
    assert rec.run_at is None
    assert store.due()[0] == []  # never due
    assert store.release(name, ids, lease_ms=1000, worker=None, reason="r") is None
    assert store.cancel(ids[1], "test").outcome == "cancelled"  # held: cancelled at once
    assert store.unpause(PauseKind.TASK, name)
    held = [i for shard in store.held_ids(name) for i in shard]
    assert sorted(held) == sorted(ids)
    out = store.release(name, held, lease_ms=1000, worker=None, reason="resumed: test")
    released = sorted(c.task_id for c in out or [])
    assert released == sorted(i for i in ids if i != ids[1])  # the cancelled one forgotten
    assert store.get(ids[1]).state is S.CANCELLED
    assert store.get(ids[0]).state is S.SUBMITTED
    assert store.held_count(name) == 0
    again = store.release(name, held, lease_ms=1000, worker=None, reason="resumed: test")
    assert again == []  # each once
    assert store.hold(ids[0], name, worker="w1", reason=reason).why == "not_paused"


@pytest.mark.rabbitmq
def test_a_paused_queue_is_the_one_consumed_not_the_routing_key(proj, worker_factory, r,
                                                                  rabbitmq, on_rabbitmq):
    """Queue ``h2-reports`` is also bound to the exchange ``h2-jobs`` by the key ``h2-daily``,
    the name of another queue the worker consumes: pausing ``h2-daily`` does not hold what
    that key routed into ``h2-reports``; pausing ``h2-reports`` gives back the messages the
    worker had fetched from it (their consumer tag's queue), which run after the resume."""
    from kombu import Connection

    w = worker_factory(queues="celery,h2-reports,h2-daily", concurrency=1)
    with Connection(rabbitmq.url) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange="h2-jobs", type="direct", durable=True,
                                 auto_delete=False)
        channel.queue_bind(queue="h2-reports", exchange="h2-jobs", routing_key="h2-daily")
    key = "pause:bound"

    def send() -> str:
        return str(proj.record_run.apply_async((key,), exchange="h2-jobs",
                                               routing_key="h2-daily").id)

    try:
        assert w.name in pause(proj, queue="h2-daily").workers
        wait_for(lambda: "Canceling queue h2-daily" in w.log, timeout=10,
                 message="the consumer of h2-daily cancelled")
        first = send()
        wait_for(lambda: r.llen(key) == 1, timeout=15, message="the bound message ran")
        blocker = proj.until_released.delay("pause:bound:block")
        wait_for(lambda: r.llen("pause:bound:block") == 1, timeout=10,
                 message="the blocker started")
        fetched = [send() for _ in range(2)]
        wait_for(lambda: all(f"[{i}] received" in w.log for i in fetched), timeout=10,
                 message="both fetched behind the busy slot")
        assert w.name in pause(proj, queue="h2-reports").workers
        wait_for(lambda: "Canceling queue h2-reports" in w.log, timeout=10,
                 message="the consumer of h2-reports cancelled")
        r.set("pause:bound:block:release", "ok")
        assert blocker.get(timeout=10) == "ok"
        wait_for(lambda: all(f"[{i}] back to queue h2-reports" in w.log for i in fetched),
                 timeout=10, message="both given back to h2-reports")
        assert r.lrange(key, 0, -1) == [f"{first}:1"]
        proj.jobbers.resume(queue="h2-reports", by="test")
        wait_for(lambda: _ran_once_each(r, key, [first, *fetched]), timeout=15,
                 message="each ran once")
    finally:
        proj.jobbers.resume(queue="h2-daily", by="test")
        with Connection(rabbitmq.url) as conn:
            channel = conn.channel()
            for queue in ("h2-reports", "h2-daily"):
                channel.queue_delete(queue)
            channel.exchange_delete("h2-jobs")


def test_a_give_back_on_redis_goes_to_its_queue_not_every_bound_one(proj, worker_factory, r,
                                                                      redis_url):
    """Queues ``h9-q`` (consumed) and ``h9-s`` (not) are both bound to ``h9-e`` by the key
    ``h9-daily``. The messages the worker had fetched from ``h9-q`` when it was paused go
    back to ``h9-q`` only: kombu's reject with requeue would restore a copy into ``h9-s``
    too (a task run twice by whoever consumes it)."""
    from kombu import Connection, Exchange, Queue

    ex = Exchange("h9-e", type="direct")
    q, s = Queue("h9-q", ex, routing_key="h9-daily"), Queue("h9-s", ex, routing_key="h9-daily")
    w = worker_factory(queues="celery,h9-q", concurrency=1, app="tests.integration.bound_proj")
    key = "pause:h9"
    with Connection(redis_url) as conn:
        s(conn.default_channel).declare()

        def depth(queue: Queue) -> int:  # an empty list is no queue to Redis
            return int(r.llen(queue.name))

        try:
            blocker = proj.until_released.delay("pause:h9:block")
            wait_for(lambda: r.llen("pause:h9:block") == 1, timeout=10,
                     message="the blocker started")
            fetched = [str(proj.record_run.apply_async((key,), exchange="h9-e",
                                                       routing_key="h9-daily").id)
                       for _ in range(2)]
            wait_for(lambda: all(f"[{i}] received" in w.log for i in fetched), timeout=10,
                     message="both fetched from h9-q behind the busy slot")
            assert depth(s) == 2  # the copies the exchange routed into h9-s
            assert w.name in pause(proj, queue="h9-q").workers
            wait_for(lambda: "Canceling queue h9-q" in w.log, timeout=10,
                     message="the consumer of h9-q cancelled")
            r.set("pause:h9:block:release", "ok")
            assert blocker.get(timeout=10) == "ok"
            wait_for(lambda: all(f"[{i}] back to queue h9-q" in w.log for i in fetched),
                     timeout=10, message="both given back to h9-q")
            wait_for(lambda: depth(q) == 2, timeout=5, message="both back in h9-q")
            assert depth(s) == 2  # not a copy more into h9-s (kombu's requeue: 4)
            assert r.llen(key) == 0
            proj.jobbers.resume(queue="h9-q", by="test")
            wait_for(lambda: _ran_once_each(r, key, fetched), timeout=15,
                     message="each ran once from h9-q")
            assert (depth(q), depth(s)) == (0, 2)
        finally:
            proj.jobbers.resume(queue="h9-q", by="test")
            for queue in (q, s):
                queue(conn.default_channel).delete()
