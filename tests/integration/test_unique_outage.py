"""Unique tasks and an outage of jobbers' store (docs/howto/unique.md, "Limits"), with a real
prefork worker: the broker and the results on the session's Redis, jobbers' store on a
private redis-server (``topology_servers``) that a test kills (SIGKILL, then restarts it)
or pauses (SIGSTOP, then SIGCONT) while a publisher process, connected before, publishes
copies of the same key (``until=end``; each copy's body runs while ``<key>:hold`` exists,
see ``unique_proj``).

What these tests found, and assert:

- A copy published while the store is away goes out (its publish is not recorded, so no
  lock is taken), each copy of the same key alike. Once the store answers, the worker
  records each such copy at its start ("recorded by the worker: no submission record"),
  without the lock: every copy runs, beside the copy that held the lock before the outage
  and beside each other, and the copies recorded late hold no lock while they run, so a
  publish of their key after the outage is accepted too unless a copy recorded before it
  holds the lock.
- A paused store: the publish whose first write was already on the publisher's open
  connection when the server stopped has it applied when the server resumes (its message
  went out at the socket timeout already); the publishes after it (the connection, timed
  out, connects again and gets no answer) go out unrecorded as above. With one Redis that
  write is the publish's step: the copy's record and lock are made then. On several
  shards it is the lock's take (``uniq.lua``), the step never sent: the lock names a copy
  the worker records without it, a key that counts as free, as after a kill.
- A lock taken before the store was killed and restarted with ``appendfsync always`` holds
  after the restart: a publish of its key is answered with the holder (the store-level
  test is test_unique_store.py::test_the_lock_survives_a_store_restart_with_aof).
- A store without persistence restarted: the lock is lost with the records, a new publish of
  the key is accepted, and the copy whose message still waited at the broker runs beside it.

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
def test_copies_published_while_the_store_is_away_all_run_without_the_lock(
    up: Any, worker: Any, fault: str, shards: int
) -> None:
    """A holds ``k``'s lock and runs when the store goes away (killed and restarted with
    ``appendfsync always``, or paused); meanwhile the publisher publishes two copies of
    ``k2`` (C, D), which nobody holds, and one of ``k`` (B): each goes out with an id of
    its own. Once the store answers, all four run at once. B and D (and C, but when paused
    with one Redis) are recorded by the worker at their start, without the lock; paused,
    one Redis: C's step, on the open connection, is applied at the resume and takes
    ``k2``'s lock. A's lock held through the outage: a publish of ``k`` after it is
    answered with A. Otherwise nothing holds ``k2`` although C and D run: a publish of it
    is accepted, a third copy. On one Redis and on 16 shards."""
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
            copies = [a, b, c, d]
            # each body marks its run after its start was recorded
            wait_for(
                lambda: (
                    states(store, copies) == [S.STARTED] * 4
                    and (runs(client, k), runs(client, k2)) == (2, 2)
                ),
                timeout=40,
                interval=0.1,
                message="the four copies to run at once",
            )
            # paused, one Redis: C's step, on the wire, applied at the resume
            resumed = fault == "paused" and shards == 1
            assert recorded_by(store, a) == "published"
            assert recorded_by(store, b) == LATE
            assert recorded_by(store, c) == ("published" if resumed else LATE)
            assert recorded_by(store, d) == LATE
            locks = {i: store.get_raw(i).get("uq") for i in copies}
            assert [bool(locks[i]) for i in copies] == [True, False, resumed, False]
            if fault == "paused" and shards > 1:
                # the lock's take (uniq.lua, before the step) was on the wire: applied at
                # the resume, it names C, whose record the worker made without the lock:
                # a key that counts as free
                assert store.client.get(lock_of(up, store, k2)) == c
            assert publish(k) == a  # A's lock held through the outage
            e = publish(k2)
            assert (e == c) if resumed else (e not in copies)
            client.delete(f"{k}:hold", f"{k2}:hold")
            ended = [*copies, e]
            wait_for(
                lambda: set(states(store, ended)) == {S.COMPLETED},
                timeout=30,
                interval=0.1,
                message="every copy to complete",
            )
            assert (runs(client, k), runs(client, k2)) == (2, 2 if resumed else 3)
        finally:
            publish.close()
            store.client.close()


def test_a_restart_without_persistence_loses_the_lock(up: Any, worker: Any) -> None:
    """A store that keeps nothing on disk (``appendonly no``, no snapshot) killed and
    restarted: A's record and lock are gone while its message waits at the broker; B, a
    copy of the same key published then, is accepted, and both run at once (A recorded by
    the worker at its start)."""
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
            wait_for(
                lambda: states(store, [a, b]) == [S.STARTED] * 2 and runs(client, k) == 2,
                timeout=30,
                interval=0.1,
                message="both copies to run at once",
            )
            assert recorded_by(store, a) == LATE
            assert recorded_by(store, b) == "published"
            client.delete(f"{k}:hold")
            wait_for(
                lambda: states(store, [a, b]) == [S.COMPLETED] * 2,
                timeout=30,
                interval=0.1,
                message="both copies to complete",
            )
        finally:
            publish.close()
            store.client.close()
    finally:
        server.stop()
