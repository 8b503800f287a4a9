#!/usr/bin/env python
"""How long from an alert event to the webhook receiving it?

In one process, as a worker's child would: ``Alerts`` over a ``RedisStore`` on a private
``redis-server`` (the dedupe mark and, for dead letters, the rate counter are real Redis
round trips) posts to a local HTTP receiver (``http.server`` in a thread). Measured from the
``emit`` (or ``dead_lettered``) call to the receiver reading the request, by one clock:

- ``first``: the process's first event (the delivery thread starts, the first connections);
- ``event``: ``--events`` events one at a time, each waited for (distinct keys: none is
  deduplicated), the steady latency;
- ``dead letter``: ``--events`` dead letters of distinct task names through a
  dead-letter-rate rule of threshold 1 (counter, then mark, then post);
- ``burst``: ``--burst`` events handed over at once; the time until the last one arrived
  (one delivery thread posts them one after another).

The end-to-end test (``tests/integration/test_alerts_webhook.py``) prints the same figure
for a real prefork worker, from the dead letter's write to the receiver.

    .venv/bin/python bench/alerts_latency.py
    .venv/bin/python bench/alerts_latency.py --events 500 --json out.json
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from _common import (
    PrivateRedis,
    common_options,
    distribution,
    failed,
    on_sys_path,
    wait_for,
    write_json,
)

on_sys_path()

import redis

from jobbers_celery import JobbersConfig
from jobbers_celery.alerts import AlertEvent, AlertKind, Alerts
from jobbers_celery.store import RedisStore


class Receiver:
    """Counts the POSTs and notes when each arrived (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.arrived: list[float] = []
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.cond:
                    receiver.arrived.append(time.perf_counter())
                    receiver.cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 30.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.arrived) >= count, timeout):
                raise RuntimeError(f"{count} alerts did not arrive in {timeout} s")
            return self.arrived[count - 1]


def measure(url: str, receiver: Receiver, events: int, burst: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=True)
    store = RedisStore(client, "bench", shards=1)
    rules = [{"name": "all", "kind": "stall", "webhooks": [receiver.url]},
             {"name": "rate", "kind": "dead_letter_rate", "threshold": 1, "window": 600,
              "task": "bench.*", "webhooks": [receiver.url]}]
    config = JobbersConfig.from_mapping({"jobbers_redis_url": url, "jobbers_alerts": rules,
                                         "jobbers_alert_webhook_allow_networks": ["127.0.0.0/8"],
                                         "jobbers_admin_url": "https://ops.example.com/admin/"})
    alerts = Alerts(store, config)
    n = 0

    def one(hand_over: Any) -> float:
        nonlocal n
        n += 1
        started = time.perf_counter()
        hand_over(n)
        return receiver.wait(n) - started

    def stall(i: int) -> None:
        alerts.emit(AlertEvent(AlertKind.STALL, f"bench.task{i}", f"1 task of bench.task{i} "
                               "stalled", "text", "jobbers/deadletterentry/live/",
                               task_name=f"bench.task{i}"))

    first = one(stall)
    steady = [one(stall) for _ in range(events)]
    dead = [one(lambda i: alerts.dead_lettered(f"bench.dead{i}")) for _ in range(events)]
    started = time.perf_counter()
    for _ in range(burst):
        n += 1
        stall(n)
    last = receiver.wait(n) - started
    assert alerts.flush()
    return {"first_ms": first * 1000,
            "event_ms": _ms(distribution(steady)), "dead_letter_ms": _ms(distribution(dead)),
            "burst": burst, "burst_last_ms": last * 1000, "stats": dict(alerts.stats)}


def _ms(seconds: dict[str, float]) -> dict[str, float]:
    return {k: v if k == "n" else v * 1000 for k, v in seconds.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200, help="events measured one at a time")
    ap.add_argument("--burst", type=int, default=200, help="events handed over at once")
    common_options(ap)
    args = ap.parse_args()
    server = PrivateRedis(args.redis_server)
    receiver = Receiver()
    try:
        client = redis.Redis.from_url(server.url)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 10, "redis-server to answer")
        result = measure(server.url, receiver, args.events, args.burst)
    except Exception as exc:  # noqa: BLE001 - reported as a failed benchmark
        return failed(exc)
    finally:
        receiver.server.shutdown()
        server.stop()
    ev, dl = result["event_ms"], result["dead_letter_ms"]
    print(f"alert latency, event -> webhook received ({args.events} events each, ms):")
    print(f"  first event of the process  {result['first_ms']:7.2f}")
    print(f"  event (mark + POST)         median {ev['p50']:.2f}  p95 {ev['p95']:.2f}  "
          f"p99 {ev['p99']:.2f}  max {ev['max']:.2f}")
    print(f"  dead letter (count + mark + POST) median {dl['p50']:.2f}  p95 {dl['p95']:.2f}  "
          f"p99 {dl['p99']:.2f}  max {dl['max']:.2f}")
    print(f"  burst of {args.burst}: the last arrived after {result['burst_last_ms']:.1f} ms")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
