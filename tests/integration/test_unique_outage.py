"""Unique tasks and an outage of jobbers' store (docs/howto/unique.md, "Limits"), with a real
prefork worker: the broker and the results on the session's Redis, jobbers' store on a
private redis-server (``topology_servers``) that a test kills (SIGKILL, then restarts it)
or pauses (SIGSTOP, then SIGCONT) while a publisher process, connected before, publishes
copies of the same key (``until=end``; each copy's body runs while ``<key>:hold`` exists,
see ``unique_proj``).

What these tests assert:

- A copy published while the store is away goes out (its publish is not recorded, so no
  lock is taken), each copy of the same key alike. Once the store answers, the worker
  records each such copy at its start ("recorded by the worker: no submission record") and
  takes its lock then, as the publish would have: a copy whose key another copy holds (one
  recorded before the outage, or one recorded late just before) does not run: no record,
  its result REVOKED naming the holder. One copy of a key runs; a publish of the key after
  the outage is answered with the holder.
- A paused store: the publish whose first write was already on the publisher's open
  connection when the server stopped has it applied when the server resumes (its message
  went out at the socket timeout already). With one Redis that write is the publish's
  step: that copy's record and lock are made then. On several shards it is the lock's
  take (``uniq.lua``): the lock names that copy, whose late record keeps it.
- A lock taken before the store was killed and restarted with ``appendfsync always`` holds
  after the restart: a publish of its key is answered with the holder (the store-level
  test is test_unique_store.py::test_the_lock_survives_a_store_restart_with_aof).
- A store without persistence restarted: the lock is lost with the records, and a new
  publish of the key is accepted; the copy whose message still waited at the broker is
  recorded late, finds the key held by the new one and does not run.

A lost last second of an ``appendfsync everysec`` store is not tested: whether the kill
falls before or after the fsync of the lock's write is timing, not something a test can
decide.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobbers_celery import TaskState
from jobbers_celery.core.unique import key_digest
from jobbers_celery.store import RedisStore
from tests.conftest import ROOT, Worker, start_worker, subprocess_env, wait_for
from tests.integration.topology_servers import RestartableRedis, restartable_redis

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
MODULE = "tests.integration.unique_proj"
#: The store's connections time out after this (seconds): a paused server fails a step
#: after it on every redis-py version (redis-py 6.4 and 7 have no default timeout).
SOCKET_TIMEOUT = 1
#: What a worker's pool process logs when a start meets the store away: it gives the
#: delivery back to the broker.
GIVES_BACK = "the jobbers state store cannot be reached: until it answers, this worker"
LATE = "recorded by the worker: no submission record"

#: A publisher process, connected to the store before the test's fault: publishes
#: ``uq.end`` with the key of each line it reads, answers the id it was told (JSON).
PUBLISHER = """
import json, sys
from tests.integration import unique_proj as p
p.jobbers.store.client.ping()
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    print(json.dumps(p.until_end.delay(line.strip()).id), flush=True)
"""


class Publisher:
    """A process that publishes on demand (its store connection open across the fault)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER],
            cwd=ROOT,
            env=subprocess_env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._answer() == "ready"

    def _answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the publisher exited ({self.proc.poll()})"
        return json.loads(line)

    def __call__(self, key: str) -> str:
        """Publish a copy of ``key``: the id the publish answered (the holder's for a
        duplicate)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        return str(self._answer())

    def close(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.communicate(timeout=10)  # closes stdin: the process ends
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def up(redis_url: str) -> Any:
    from tests.integration import unique_proj

    return unique_proj


@pytest.fixture
def worker(up: Any, tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Worker]]:
    started: list[Worker] = []

    def start(env: dict[str, str]) -> Worker:
        started.append(start_worker(up.app, MODULE, tmp_path, concurrency=4, env=env))
        return started[-1]

    yield start
    for w in started:
        w.kill()


def new_key(what: str) -> str:
    return f"uq:outage:{what}:{uuid.uuid4().hex[:10]}"


def runs(client: Any, key: str) -> int:
    return int(client.llen(f"{key}:ran"))


def states(store: RedisStore, ids: list[str]) -> list[S | None]:
    return [r.state if (r := store.get(i)) is not None else None for i in ids]


def lock_of(up: Any, store: RedisStore, key: str) -> str:
    """The lock key of ``uq.end``'s copies of ``key``."""
    task = up.until_end
    return store.keys.unique(
        key_digest(task.name, task.jobbers_options.unique, [key], {}, task.run)
    )


def recorded_by(store: RedisStore, task_id: str) -> str | None:
    """The reason of the record's ``submitted`` step: who recorded the publish."""
    return next((t.reason for t in store.history(task_id) if t.to_state is S.SUBMITTED), None)


@pytest.mark.parametrize("shards", [1, 16])
@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_copies_published_while_the_store_is_away_run_one_at_a_time(
    up: Any, worker: Any, fault: str, shards: int
) -> None:
    """A holds ``k``'s lock and runs when the store goes away (killed and restarted with
    ``appendfsync always``, or paused); meanwhile the publisher publishes two copies of
    ``k2`` (C, D), which nobody holds, and one of ``k`` (B): each goes out with an id of
    its own. Once the store answers, the worker records B, C and D at their start (paused
    with one Redis: C's step, on the open connection, applied at the resume) and each takes
    its lock then: B finds A holding ``k`` and one of C, D the other holding ``k2``: those
    two do not run (REVOKED, no record). Publishes after the outage are answered with the
    holders. On one Redis and on 16 shards."""
    client = up._client
    k, k2 = new_key("held"), new_key("free")
    client.set(f"{k}:hold", 1)
    client.set(f"{k2}:hold", 1)
    with restartable_redis("always") as server:
        env = {
            "UNIQUE_PROJ_STORE": f"{server.url()}?socket_timeout={SOCKET_TIMEOUT}",
            "UNIQUE_PROJ_PREFIX": f"outage{fault}",
            "UNIQUE_PROJ_SHARDS": str(shards),
        }
        store = RedisStore.from_url(server.url(), prefix=f"outage{fault}", shards=shards)
        publish = Publisher(env)
        try:
            w = worker(env)
            a = publish(k)
            wait_for(lambda: states(store, [a]) == [S.STARTED], timeout=20, message="A to start")
            pid = server.server.proc.pid if server.server.proc else 0
            if fault == "killed":
                server.kill()
            else:
                os.kill(pid, signal.SIGSTOP)
            try:
                c, d, b = publish(k2), publish(k2), publish(k)
                assert len({a, b, c, d}) == 4  # each went out as its own copy
                # the worker meets the outage: it gives the deliveries back, not run
                wait_for(
                    lambda: GIVES_BACK in w.log,
                    timeout=30,
                    interval=0.1,
                    message="the worker to give a delivery back",
                )
            finally:
                if fault == "killed":
                    server.restart()
                else:
                    os.kill(pid, signal.SIGCONT)
            # paused, one Redis: C's step, on the wire, applied at the resume
            resumed = fault == "paused" and shards == 1

            def k2_holder() -> str | None:
                started = [i for i in (c, d) if states(store, [i]) == [S.STARTED]]
                return started[0] if len(started) == 1 else None

            # B and one of C, D do not run: recorded late, each finds its key held
            wait_for(
                lambda: (
                    states(store, [a]) == [S.STARTED] and k2_holder() is not None
                    and (runs(client, k), runs(client, k2)) == (1, 1)
                    and [up.app.AsyncResult(i).state for i in (b, c, d)].count("REVOKED") == 2
                ),
                timeout=40,
                interval=0.1,
                message="A and one copy of k2 to run, the two duplicates REVOKED",
            )
            holder = k2_holder()
            loser = d if holder == c else c
            assert up.app.AsyncResult(b).state == "REVOKED"
            assert up.app.AsyncResult(loser).state == "REVOKED"
            assert states(store, [b, loser]) == [None, None]  # no record: never ran
            assert recorded_by(store, a) == "published"
            assert recorded_by(store, holder) == (
                "published" if resumed and holder == c else LATE)
            if resumed:
                assert holder == c  # its step, with its lock, was applied at the resume
            assert store.get_raw(holder).get("uq")  # the late record took the lock
            assert publish(k) == a  # A's lock held through the outage
            assert publish(k2) == holder  # and the late copy's lock holds too
            client.delete(f"{k}:hold", f"{k2}:hold")
            wait_for(
                lambda: set(states(store, [a, holder])) == {S.COMPLETED},
                timeout=30,
                interval=0.1,
                message="the two copies that ran to complete",
            )
            assert (runs(client, k), runs(client, k2)) == (1, 1)
        finally:
            publish.close()
            store.client.close()


def test_a_restart_without_persistence_loses_the_lock(up: Any, worker: Any) -> None:
    """A store that keeps nothing on disk (``appendonly no``, no snapshot) killed and
    restarted: A's record and lock are gone while its message waits at the broker; B, a
    copy of the same key published then, is accepted. A, recorded by the worker at its
    start, finds the key held by B and does not run (REVOKED)."""
    client = up._client
    k = new_key("nopersist")
    client.set(f"{k}:hold", 1)
    server = RestartableRedis()
    server.server.conf.write_text(
        server.server.conf.read_text().replace("appendonly yes", "appendonly no")
    )
    server.start()
    try:
        env = {
            "UNIQUE_PROJ_STORE": f"{server.url()}?socket_timeout={SOCKET_TIMEOUT}",
            "UNIQUE_PROJ_PREFIX": "outagenopersist",
        }
        store = RedisStore.from_url(server.url(), prefix="outagenopersist", shards=1)
        publish = Publisher(env)
        try:
            a = publish(k)
            assert publish(k) == a
            server.kill()
            server.restart()
            probe = redis.Redis(port=server.port)
            try:
                assert probe.dbsize() == 0  # every record and lock lost
            finally:
                probe.close()
            b = publish(k)
            assert b != a  # the lock went with the restart
            worker(env)
            # A's message, recorded late by the worker, finds the key held by B: not run
            wait_for(
                lambda: states(store, [b]) == [S.STARTED] and runs(client, k) == 1
                and up.app.AsyncResult(a).state == "REVOKED",
                timeout=30,
                interval=0.1,
                message="B to run and A to be REVOKED",
            )
            assert states(store, [a]) == [None]
            assert recorded_by(store, b) == "published"
            client.delete(f"{k}:hold")
            wait_for(
                lambda: states(store, [b]) == [S.COMPLETED],
                timeout=30,
                interval=0.1,
                message="B to complete",
            )
            assert runs(client, k) == 1
        finally:
            publish.close()
            store.client.close()
    finally:
        server.stop()
