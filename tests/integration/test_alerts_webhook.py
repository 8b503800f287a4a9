"""Alerts end to end: a real ``celery worker`` (prefork) whose failing tasks end in the
dead-letter queue posts to a local HTTP receiver; one alert per rule and task name, with
the link to the page that shows it; a receiver that is slow or down never holds a task up,
and its failure is logged once."""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobbers_celery import TaskState
from tests.conftest import free_port, start_worker, wait_for

SECRET = "T000/B000/SECRETPATH"


class Receiver:
    """A webhook receiver on a free port: each POST's body and when it arrived. ``hold``:
    every request waits until :meth:`release` (a receiver that does not answer)."""

    def __init__(self, hold: bool = False) -> None:
        self.got: list[tuple[float, dict[str, Any]]] = []
        self.released = threading.Event()
        if not hold:
            self.released.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.got.append((at, body))
                receiver.released.wait(30)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"

    def bodies(self) -> list[dict[str, Any]]:
        return [body["jobbers"] for _, body in self.got]

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.stop()


@pytest.fixture
def aproj(redis_url: str) -> Any:
    return importlib.import_module("tests.integration.alerts_proj")


@pytest.fixture
def start(aproj: Any, tmp_path: Path) -> Iterator[Any]:
    workers = []

    def run(**env: str) -> Any:
        worker = start_worker(aproj.app, "tests.integration.alerts_proj", tmp_path,
                              concurrency=1, env=env)  # one child: events handled in order
        workers.append(worker)
        return worker

    yield run
    for worker in workers:
        worker.kill()


def dead(aproj: Any, *ids: str) -> None:
    wait_for(lambda: all((r := aproj.jobbers.get(i)) is not None and r.state is TaskState.FAILED
                         for i in ids), timeout=30, message=f"{ids} failed")


def test_a_dead_letter_reaches_the_webhook_once_with_its_link(
        aproj: Any, start: Any, receivers: list[Receiver], capsys: Any) -> None:
    receiver = Receiver()
    receivers.append(receiver)
    start(ALERTS_WEBHOOK=receiver.url)
    ids = [aproj.boom1.delay("42").id, aproj.boom1.delay("43").id]
    dead(aproj, *ids)
    last = aproj.boom2.delay("44").id  # handled after both of boom1's: says they were
    dead(aproj, last)
    wait_for(lambda: len(receiver.got) >= 2, timeout=30, message="two alerts")
    got = receiver.bodies()
    assert [b["key"] for b in got] == ["alerts.boom1", "alerts.boom2"]  # boom1's 2nd: deduped
    assert got[0]["kind"] == "dead_letter_rate"
    assert got[0]["rule"] == "first"
    assert got[0]["link"] == (
        "https://ops.example.com/admin/jobbers/deadletterentry/?task_name=alerts.boom1")
    _, slack = receiver.got[0]
    assert "<https://ops.example.com/admin/jobbers/deadletterentry/?task_name=alerts.boom1" \
           "|Open in jobbers>" in slack["text"]
    latencies = [at - datetime.fromisoformat(body["jobbers"]["at"]).timestamp()
                 for at, body in receiver.got]
    with capsys.disabled():  # a measured figure, never asserted on (bench/alerts_latency.py)
        print(f"\nalert latency, dead letter written -> webhook received: "
              f"{', '.join(f'{x * 1000:.1f} ms' for x in latencies)}")


def test_a_slow_receiver_never_holds_a_task_up(aproj: Any, start: Any,
                                                receivers: list[Receiver]) -> None:
    slow, after = Receiver(hold=True), Receiver()
    receivers += [slow, after]
    start(ALERTS_WEBHOOK=slow.url, ALERTS_WEBHOOK_AFTER=after.url, ALERTS_TIMEOUT="5")
    failing = aproj.boom1.delay("42")
    done = aproj.ok.delay()
    assert done.get(timeout=30) == "done"
    dead(aproj, failing.id)
    # the task after the failing one ran while the alert thread still waited on the slow
    # receiver (its rule's alert comes before the second rule's; under load the post may
    # reach it after the task ended: waited for, the receiver still holding it)
    wait_for(lambda: len(slow.got) == 1, timeout=10, message="the slow receiver's alert")
    assert after.got == []
    slow.release()
    wait_for(lambda: len(after.got) == 1, timeout=30, message="the second rule's alert")


def test_a_receiver_down_is_logged_once(aproj: Any, start: Any,
                                        receivers: list[Receiver]) -> None:
    after = Receiver()
    receivers.append(after)
    down = f"http://127.0.0.1:{free_port()}/services/{SECRET}"
    worker = start(ALERTS_WEBHOOK=down, ALERTS_WEBHOOK_AFTER=after.url)
    ids = [aproj.boom1.delay("1").id, aproj.boom2.delay("2").id, aproj.boom3.delay("3").id]
    dead(aproj, *ids)
    assert aproj.ok.delay().get(timeout=30) == "done"
    # each event tried the receiver that is down first (its mark cleared each time)
    wait_for(lambda: len(after.got) == 3, timeout=30, message="three alerts to the other")
    failures = [line for line in worker.log.splitlines() if "alerts: webhook" in line
                and "failed" in line]
    assert len(failures) == 1, worker.log
    assert "unreachable: ConnectionRefusedError" in failures[0]
    assert SECRET not in worker.log


def test_a_stall_and_the_cleaner_overdue_reach_the_webhook(aproj: Any, start: Any,
                                                           receivers: list[Receiver]) -> None:
    from tests.integration.stall_helpers import fabricate

    receiver = Receiver()
    receivers.append(receiver)
    # two started tasks whose heartbeats stop at once (a worker that vanished)
    fabricate(aproj.jobbers.store, ["ghost-1", "ghost-2"], wid="ghost:1:abcd", hb_ms=300,
              srec=0)
    worker = start(ALERTS_OPS_WEBHOOK=receiver.url)  # no beat: its catch-ups are the passes
    wait_for(lambda: {b["kind"] for b in receiver.bodies()} >= {"stall", "cleaner_overdue"},
             timeout=30, message="a stall and an overdue cleaner told")
    told = {b["kind"]: b for b in receiver.bodies()}
    assert told["stall"]["key"] == "proj.add"
    assert told["stall"]["title"] == "2 task(s) of proj.add stalled"
    assert told["stall"]["link"] == "https://ops.example.com/admin/jobbers/deadletterentry/live/"
    assert told["cleaner_overdue"]["title"] == "The jobbers cleaner is overdue"
    # the catch-up passes go on, one every three intervals: the outage is told once
    wait_for(lambda: worker.log.count("catching up") >= 3, timeout=30,
             message="three catch-up passes")
    assert [b["kind"] for b in receiver.bodies()].count("cleaner_overdue") == 1
