"""The lean EVALSHA path recovers from a flushed script cache and a dropped connection."""

from __future__ import annotations

import os

import pytest

from jobbers_celery.core.states import TaskState as S
from jobbers_celery.store import RedisStore

pytestmark = pytest.mark.redis


def _submit(store: RedisStore, task_id: str) -> bool:
    return store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), name="n",
                      create={"name": "n", "queue": "q"}).applied


def test_script_cache_flushed_reloads_and_applies_once(redis_url):
    store = RedisStore.from_url(redis_url)
    assert _submit(store, "a")
    store.client.script_flush()  # what a Redis restart does to the script cache
    assert _submit(store, "b")
    assert len(store.history("b")) == 1


def test_connection_killed_by_the_server_reconnects(redis_url):
    store = RedisStore.from_url(redis_url)
    assert _submit(store, "a")
    conn = store._transition._connection([store.keys_of("x").task("x")])
    conn.send_command("CLIENT", "ID")
    conn_id = conn.read_response()
    # Kill only this connection: the session's other clients (Celery's) must live on.
    assert store.client.execute_command("CLIENT", "KILL", "ID", conn_id) == 1
    assert _submit(store, "b")  # the send fails or the health check reconnects; no error
    assert store._transition._connection([store.keys_of("x").task("x")]) is conn  # same object, reconnected in place
    assert len(store.history("b")) == 1


def test_each_thread_and_each_forked_process_gets_its_own_connection(redis_url):
    import threading

    store = RedisStore.from_url(redis_url)
    mine = store._transition._connection([store.keys_of("x").task("x")])
    other: list[object] = []
    t = threading.Thread(target=lambda: other.append(store._transition._connection([store.keys_of("x").task("x")])))
    t.start()
    t.join()
    assert other[0] is not mine
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's socket
        code = 0 if store._transition._connection([store.keys_of("x").task("x")]) is not mine and _submit(store, "c") else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get("c") is not None


def test_a_thread_that_ends_hands_its_connections_back(redis_url):
    """A process that starts thread after thread (a thread per request) never runs out of
    connections: redis-py 8's pools allow 100, and each thread's step connection used to
    count for ever (from the 100th thread on, every step raised 'Too many connections')."""
    import threading

    store = RedisStore.from_url(redis_url)
    pool = store.client.connection_pool
    done: list[bool] = []
    for i in range(2 * 100 + 10):
        t = threading.Thread(target=lambda i=i: done.append(_submit(store, f"t{i}")))
        t.start()
        t.join()
    assert done == [True] * 210
    # the ended threads' connections were given back: a handful in the pool, not 210
    assert len(pool._available_connections) + len(pool._in_use_connections) < 10
