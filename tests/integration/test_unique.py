"""Unique tasks end to end (``unique=Unique(...)``, docs/howto/unique.md), on a real Redis
with real prefork workers and several publishing processes:

- publishers in several processes racing on the same keys: one record and one message per
  key, every publisher answered with the winner's id (one Redis, and the sharded layout);
- the lock's points: ``until=end`` keeps it while the copy runs and frees it when it ends,
  ``until=start`` frees it when the copy starts, a window outlives its task until its ttl;
  a cancel and a stall (the worker killed, the cleaner's verdict) free it;
- ``raise_duplicate``: :class:`DuplicateTask` names the holder, and nothing is sent;
- a duplicate in a canvas is not sent and its result is REVOKED at once, naming the holder,
  as Celery stores a member revoked before it ran: a group's result completes, a chord's
  callback fails with ``ChordError``, a chain's last link is REVOKED; nothing hangs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import chord, group
from celery import states as celery_states
from celery.exceptions import ChordError, TaskRevokedError

from jobbers_celery import TaskState
from jobbers_celery.core.unique import DuplicateTask
from jobbers_celery.store import RedisStore
from tests.conftest import ROOT, Worker, start_worker, subprocess_env, wait_for
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
MODULE = "tests.integration.unique_proj"

#: A publisher process: says it is ready (imported and connected), waits for the go key,
#: publishes each key of argv in order, prints the ids it was answered with (JSON).
PUBLISHER = """
import json, sys, time, redis
from tests.integration import unique_proj as p
ready, go, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
c = redis.Redis.from_url(p.URL)
p.jobbers.store.client.ping()
c.incr(ready)
while not c.exists(go):
    time.sleep(0.001)
print(json.dumps([p.until_end.delay(k).id for k in keys]))
"""


@pytest.fixture
def up(redis_url: str) -> Any:
    from tests.integration import unique_proj
    return unique_proj


@pytest.fixture
def workers(up: Any, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(concurrency: int = 2, **env: str) -> Worker:
        worker = start_worker(up.app, MODULE, tmp_path, concurrency=concurrency,
                              env=env or None)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def key(prefix: str = "k") -> str:
    return f"uq:{prefix}:{uuid.uuid4().hex[:10]}"


def ran(client: Any, k: str) -> int:
    return int(client.llen(f"{k}:ran"))


def race(n: int, keys: list[str], env: dict[str, str] | None = None) -> list[list[str]]:
    """``n`` publisher processes publishing ``keys`` at once; the ids each was answered."""
    go, ready = key("go"), key("ready")
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, ready, go, *keys], cwd=ROOT,
                              env=subprocess_env(env), stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    client = redis.Redis.from_url(os.environ["JOBBERS_TEST_REDIS_URL"])
    # every process imported and connected (each then polls the go key)
    wait_for(lambda: int(client.get(ready) or 0) == n, timeout=60, interval=0.05,
             message="the publishers to be ready")
    client.set(go, 1)
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def broker_messages(client: Any, name: str) -> int:
    """Messages of task ``name`` waiting in the default queue (no worker consumes here)."""
    return sum(1 for raw in client.lrange("celery", 0, -1)
               if json.loads(raw)["headers"]["task"] == name)


@pytest.mark.parametrize("shards", [1, 16])
def test_racing_publishers_in_six_processes_send_one_message_per_key(redis_url: str,
                                                                     shards: int) -> None:
    keys = [key("race") for _ in range(15)]
    prefix = f"race{shards}"
    env = {"UNIQUE_PROJ_SHARDS": str(shards), "UNIQUE_PROJ_PREFIX": prefix}
    answers = race(6, keys, env)
    store = RedisStore.from_url(redis_url, prefix=prefix, shards=shards)
    client = store.client
    assert broker_messages(client, "uq.end") == len(keys)
    records = store.tasks(name="uq.end", limit=1000)
    assert len(records) == len(keys)
    for i in range(len(keys)):
        ids = {answer[i] for answer in answers}
        assert len(ids) == 1, f"key {i}: publishers told different ids {ids}"
    assert {r.task_id for r in records} == {answers[0][i] for i in range(len(keys))}
    store.client.close()


def test_until_end_holds_while_it_runs_and_frees_at_the_end(up: Any, workers: Any) -> None:
    client, jobbers = up._client, up.jobbers
    k = key()
    client.set(f"{k}:hold", 1)
    workers()
    first = up.until_end.delay(k)
    wait_state(jobbers, first.id, S.STARTED)
    again = up.until_end.delay(k, note="other kwargs, same key")
    assert again.id == first.id
    assert up.until_end.delay(key()).id != first.id  # another key: its own copy
    client.delete(f"{k}:hold")
    wait_state(jobbers, first.id, S.COMPLETED)
    later = up.until_end.delay(k)
    assert later.id != first.id
    wait_state(jobbers, later.id, S.COMPLETED)
    assert ran(client, k) == 2
    record = jobbers.store.get_raw(first.id)
    assert record["uq"].startswith("e:")


def test_until_start_dedups_waiting_copies_only(up: Any, workers: Any) -> None:
    client, jobbers = up._client, up.jobbers
    k = key()
    client.set(f"{k}:hold", 1)
    first = up.until_start.delay(k)
    assert up.until_start.delay(k).id == first.id  # waiting: the same copy
    # One process, busy with first: second waits (submitted) until first ends. With two,
    # second would start on the free one at once, its start freeing the lock, and the
    # publish after it could be told second's id or a new one, whichever came first.
    workers(concurrency=1)
    wait_state(jobbers, first.id, S.STARTED)
    second = up.until_start.delay(k)  # started: a new copy may wait
    assert second.id != first.id
    assert up.until_start.delay(k).id == second.id
    assert jobbers.get(second.id).state is S.SUBMITTED  # it was waiting, as meant
    client.delete(f"{k}:hold")
    wait_state(jobbers, second.id, S.COMPLETED)
    assert ran(client, k) == 2


def test_a_window_outlives_its_task_until_its_ttl(up: Any, workers: Any) -> None:
    client, jobbers = up._client, up.jobbers
    workers()
    k = key()
    published = time.monotonic()
    first = up.window.delay(k)
    wait_state(jobbers, first.id, S.COMPLETED)
    # ttl 5 s from the publish: wide enough that a loaded worker's run and the polls of its
    # record end well inside it
    assert up.window.delay(k).id == first.id
    later = wait_for(lambda: (r := up.window.delay(k)).id != first.id and r, timeout=20,
                     interval=0.1, message="the window to pass")
    assert time.monotonic() - published >= up.WINDOW_TTL_S - 0.1  # not before its ttl
    wait_state(jobbers, later.id, S.COMPLETED)
    assert ran(client, k) == 2


def test_a_cancel_frees_the_lock(up: Any) -> None:
    jobbers = up.jobbers
    k = key()
    first = up.until_end.delay(k)
    assert up.until_end.delay(k).id == first.id
    assert jobbers.cancel(first.id)
    assert jobbers.get(first.id).state is S.CANCELLED
    assert up.until_end.delay(k).id != first.id


def test_a_stalled_copy_frees_the_lock(up: Any, workers: Any) -> None:
    client, jobbers = up._client, up.jobbers
    k = key()
    client.set(f"{k}:hold", 1)
    doomed = workers()
    first = up.until_end.delay(k)
    wait_state(jobbers, first.id, S.STARTED)
    os.killpg(doomed.proc.pid, signal.SIGKILL)  # the worker dies, its task with it
    doomed.proc.wait(10)
    assert up.until_end.delay(k).id == first.id  # still started in the record
    workers()  # its cleaner declares the lost attempt stalled
    wait_state(jobbers, first.id, S.STALLED, timeout=30)
    client.delete(f"{k}:hold")
    second = up.until_end.delay(k)
    assert second.id != first.id
    wait_state(jobbers, second.id, S.COMPLETED)


def test_raise_duplicate_names_the_holder_and_sends_nothing(up: Any) -> None:
    client = up._client
    account = key("acct")
    first = up.raising.delay(account=account, payload="a")
    before = broker_messages(client, "uq.raising")
    with pytest.raises(DuplicateTask) as caught:
        up.raising.delay(account=account, payload="b")  # key=: the account alone
    assert caught.value.holder == first.id
    assert broker_messages(client, "uq.raising") == before
    # per call: no uniqueness for this publish
    assert up.raising.apply_async(kwargs={"account": account}, unique=False).id != first.id


def test_a_group_sends_no_member_whose_key_a_copy_holds(up: Any) -> None:
    """A group's members are recorded a batch at a time (lifecycle/bulk.py): a member whose
    key a copy holds is not sent, the others are."""
    client = up._client
    held, free = key(), key()
    first = up.until_end.delay(held)
    before = broker_messages(client, "uq.end")
    result = group(up.until_end.s(held), up.until_end.s(free), up.until_end.s(free)).apply_async()
    assert broker_messages(client, "uq.end") == before + 1  # free's first member only
    members = [r.id for r in result.results]
    assert up.jobbers.get(members[0]) is None  # its key was held by first: no record
    assert up.jobbers.get(members[1]) is not None
    assert up.jobbers.store.unique_of(members[1]).holder == members[1]
    assert up.jobbers.unique_holder("uq.end", [held]) == first.id
    # neither duplicate waits for ever: REVOKED at once, naming the copy holding its key
    for member, holder in ((members[0], first.id), (members[2], members[1])):
        revoked = up.app.AsyncResult(member)
        assert revoked.state == celery_states.REVOKED
        assert holder in str(revoked.result)
        assert up.jobbers.get(member) is None  # and no record


def test_a_group_with_a_duplicate_member_completes(up: Any, workers: Any) -> None:
    """As a group whose member was revoked before it ran: ``get`` raises
    ``TaskRevokedError``, or returns it among the others' results (``propagate=False``)."""
    held, free = key(), key()
    first = up.until_end.delay(held)
    result = group(up.until_end.s(held), up.until_end.s(free)).apply_async()
    workers()
    values = result.get(propagate=False, timeout=30)
    assert isinstance(values[0], TaskRevokedError)
    assert first.id in str(values[0])
    assert values[1] == free
    with pytest.raises(TaskRevokedError):
        result.get(timeout=30)
    assert first.get(timeout=30) == held


def test_a_chord_whose_header_holds_a_duplicate_fails_its_callback(up: Any,
                                                                   workers: Any) -> None:
    """As a chord whose header member was revoked: the member's part is counted at the
    publish, and the callback fails with ``ChordError`` once the others returned."""
    held, a, b = key(), key(), key()
    first = up.until_end.delay(held)
    callback = chord([up.until_end.s(a), up.until_end.s(held), up.until_end.s(b)],
                     up.count.s()).apply_async()
    header: Any = callback.parent
    duplicate = header.results[1].id
    assert up.app.AsyncResult(duplicate).state == celery_states.REVOKED
    workers()
    error = callback.get(timeout=30, propagate=False)  # the callback's own outcome
    assert isinstance(error, ChordError)
    assert re.match(rf"Dependency {duplicate} raised TaskRevokedError\(.*{first.id}", str(error))
    assert callback.state == celery_states.FAILURE
    with pytest.raises(TaskRevokedError):  # Celery raises the header's error first
        callback.get(timeout=30)
    assert [r.get(timeout=30) for r in (header.results[0], header.results[2])] == [a, b]
    assert first.get(timeout=30) == held


def test_a_chain_whose_first_link_is_a_duplicate_is_revoked(up: Any) -> None:
    """Its first link is not sent, so neither is the rest: every link with an id of its own
    is REVOKED at once (no worker needed), so ``get`` raises instead of waiting."""
    held = key()
    first = up.until_end.delay(held)
    before = broker_messages(up._client, "uq.end")
    last = (up.until_end.s(held) | up.count.s() | up.count.s()).apply_async()
    assert broker_messages(up._client, "uq.end") == before
    with pytest.raises(TaskRevokedError, match=first.id):
        last.get(timeout=10)
    assert last.parent.state == celery_states.REVOKED
    assert last.parent.parent.state == celery_states.REVOKED


def test_the_cli_shows_the_key_and_its_holder(up: Any) -> None:
    k = key()
    first = up.until_end.delay(k)
    cmd = [sys.executable, "-m", "celery", "-A", MODULE, "jobbers", "show", first.id]
    human = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True,
                           text=True, timeout=60, check=True).stdout
    shown = json.loads(subprocess.run([*cmd, "--json"], cwd=ROOT, env=subprocess_env(),
                                      capture_output=True, text=True, timeout=60,
                                      check=True).stdout)
    lock = shown["unique"]
    assert (lock["until"], lock["holder"]) == ("end", first.id)
    assert f"key {lock['key'][:16]}, until end: held by this task" in human
    assert k not in json.dumps(lock)


def test_a_delayed_first_publish_takes_the_lock_at_the_publish(up: Any) -> None:
    k = key()
    later = up.until_end.apply_async((k,), countdown=600)  # waits in the store, scheduled
    assert up.jobbers.get(later.id).state is S.SCHEDULED
    assert up.until_end.delay(k).id == later.id
    assert up.until_end.apply_async((k,), countdown=5).id == later.id


def test_a_record_made_again_from_its_dead_letter_takes_the_lock_again(up: Any) -> None:
    """A dead-lettered copy whose record expired is made again by a DLQ resubmit: its
    recorded payload kept the lock's header, so the record made again holds the lock, and a
    new publish of the key is answered with it (before, it took no lock)."""
    from jobbers_celery import DeadLetter
    from jobbers_celery.core.records import from_ms

    jobbers, store = up.jobbers, up.jobbers.store
    k = key()
    first = up.until_end.delay(k)
    raw = store.get_raw(first.id)
    data = json.loads(raw["msg"])
    assert data["options"]["headers"]["jobbers_unique"] == raw["uq"]
    assert jobbers.cancel(first.id)
    entry = DeadLetter(
        task_id=first.id, name="uq.end", version=None, queue="celery", reason="failed",
        args=data["args"], kwargs=data["kwargs"], exception_type="ValueError",
        exception_message="x", traceback=None, attempt=1, retry_attempt=0, worker=None,
        failed_at=from_ms(1_700_000_000_000), options=data["options"])
    store.client.delete(store.keys_of(first.id).task(first.id))  # its record expired
    assert jobbers.resubmit_dead_letters([entry]) == [first.id]
    assert jobbers.get(first.id).state is S.SUBMITTED
    assert up.until_end.delay(k).id == first.id  # the record made again holds the lock
    assert jobbers.cancel(first.id)
    assert up.until_end.delay(k).id != first.id
