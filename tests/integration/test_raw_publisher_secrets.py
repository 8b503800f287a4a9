"""Secrets from a publisher without jobbers (a raw kombu message: protocol 2 with an
``argsrepr`` that shows the real values, and protocol 1, which has none) reach no place people
read on a jobbers worker: ``celery inspect active/reserved``, the ``task-received`` event
(Flower), the worker's log at DEBUG (Celery's ``Received task`` and ``TaskPool: Apply`` lines,
the failure line that shows the exception's ``repr()``); the task still gets the real value."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import Worker, wait_for

pytestmark = pytest.mark.worker

TASK = "secrets.login"


def raw_publish(app: Any, kwargs: dict[str, Any], protocol: int) -> str:
    """Publish ``secrets.login`` as a client without jobbers would (kombu only)."""
    task_id = str(uuid.uuid4())
    args = ["ann"]
    if protocol == 2:
        body: Any = [args, kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}]
        headers = {"lang": "py", "task": TASK, "id": task_id, "root_id": task_id,
                   "parent_id": None, "group": None, "retries": 0, "eta": None,
                   "expires": None, "timelimit": [None, None], "shadow": None,
                   "origin": "raw@client",
                   # what Celery without jobbers writes: the real values
                   "argsrepr": repr(args), "kwargsrepr": repr(kwargs)}
    else:
        body = {"task": TASK, "id": task_id, "args": args, "kwargs": kwargs, "retries": 0,
                "eta": None, "expires": None, "utc": True}
        headers = {}
    with app.connection_for_write() as conn:
        conn.Producer().publish(body, routing_key="celery", exchange="", headers=headers,
                                serializer="json", declare=[app.amqp.queues["celery"]])
    return task_id


@pytest.fixture
def events(proj: Any) -> Iterator[list[dict[str, Any]]]:
    """Every task event on the broker while the test runs."""
    app = proj.app
    got: list[dict[str, Any]] = []
    holder: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        with app.connection_for_read() as conn:
            recv = app.events.Receiver(conn, handlers={"*": got.append})
            holder["recv"] = recv
            ready.set()
            recv.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    with app.events.default_dispatcher() as dispatcher:
        def probed() -> bool:
            dispatcher.send("jobbers-test-probe", probe=probe)
            return any(e.get("probe") == probe for e in got)
        wait_for(probed, timeout=15, interval=0.2, message="the event receiver to listen")
    yield got
    holder["recv"].should_stop = True
    thread.join(5)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_raw_publishers_secrets_are_shown_nowhere(
        proj: Any, worker_factory: Callable[..., Worker], events: list[dict[str, Any]],
        r: Any, pool: str) -> None:
    app = proj.app
    worker = worker_factory(pool=pool, concurrency=1, app="tests.integration.secrets_proj",
                            extra=["-E", "-l", "DEBUG"])
    key = f"got-{uuid.uuid4().hex[:8]}"
    planted = {2: "pw-raw2-hunter7", 1: "pw-raw1-hunter8"}
    held = raw_publish(app, {"password": planted[2], "key": key, "hold": 3.0}, 2)
    waiting = raw_publish(app, {"password": planted[1], "key": key, "fail": True}, 1)
    inspect = app.control.inspect([worker.name], timeout=2)

    seen: dict[str, str] = {}

    def both_listed() -> bool:
        active, reserved = inspect.active() or {}, inspect.reserved() or {}
        seen["inspect active"] = repr(active)
        seen["inspect reserved"] = repr(reserved)
        return held in seen["inspect active"] and waiting in seen["inspect reserved"]

    wait_for(both_listed, timeout=20, interval=0.3, message="one task active, one reserved")
    wait_for(lambda: r.llen(key) == 2, timeout=30, message="both tasks to run")
    assert sorted(r.lrange(key, 0, -1)) == sorted(planted.values())
    wait_for(lambda: "secrets.login" in worker.log and "LoginError" in worker.log,
             timeout=20, message="the failure in the worker's log")
    received = [e for e in events if e.get("type") == "task-received"]
    assert {e["uuid"] for e in received} >= {held, waiting}
    seen["task-received events"] = repr(received)
    seen["worker log"] = worker.log
    assert "TaskPool: Apply" in worker.log or pool == "threads"

    found = [(place, secret) for place, text in seen.items() for secret in planted.values()
             if secret in text]
    print(f"planted secrets found in clear: {len(found)} {found}")
    assert found == []
