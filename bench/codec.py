"""What the payload codec (``jobbers_payload_keys``) costs per publish and per dead letter.

In one process, no Redis and no broker: the CPU jobbers' own code spends on each, with and
without keys, for payloads of three sizes (a login's two short strings, a 5 KB order, a
256 KB import: the ``jobbers_payload_warn_bytes`` default).

- publish: ``Recorder.publish``, the ``before_task_publish`` hook that builds the payload
  from the message, encodes it (sealed with keys) and hands the record's fields to the store
  (a stand-in that returns at once: the Redis round trip, the same with or without keys, is
  left out so the codec's share is not hidden by it);
- dead letter: ``dead_letter_entry`` from the record's fields (sealed by the publish, kept
  as they are: no cryptography) and, for a record published by a process without keys,
  sealed there; the JSON each sink then writes (``DeadLetter.to_json``) included;
- open: what a republish (scheduler, resubmit) adds to open the arguments.

Method: each case runs ``--number`` times per round (fewer for bigger payloads: about the
same bytes per round), ``--rounds`` rounds after a warm-up; the figure is the median round's
CPU time of this process per operation (``time.process_time``: other processes on a shared
machine slow it less than wall time), min-max over the rounds in brackets.

    .venv/bin/python bench/codec.py [--rounds 7] [--number 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobbers_celery.core.codec import PayloadCodec, new_key
from jobbers_celery.core.states import TaskState
from jobbers_celery.deadletter.entry import dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.store import StepResult


class _Store:
    """The store's submit, returning at once (the round trip is the same with keys)."""

    def submit(self, task_id: str, **_: Any) -> StepResult:
        return StepResult(applied=True, previous="missing", now_ms=1_000, attempt=0,
                          state=TaskState.SUBMITTED, epoch="e1")


def _payloads() -> dict[str, tuple[list[Any], dict[str, Any]]]:
    order = {"id": 1234, "lines": [{"sku": f"SKU-{i:05d}", "qty": i % 7 + 1,
                                    "price": "19.99", "note": "gift wrap " * 3}
                                   for i in range(60)],
             "customer": {"email": "ann@example.com", "token": "tok-" + "x" * 40}}
    return {
        "login (~100 B)": (["ann", "hunter2-s3cret"], {"remember": True}),
        "order (~5 KB)": ([order], {"api_key": "k-" + "y" * 30}),
        "import (~256 KB)": (["catalog-42", "row;" * 65_000], {"dry_run": False}),
    }


def _time(fn: Callable[[], object], number: int, rounds: int) -> tuple[float, float, float]:
    """Median, min and max CPU microseconds per call over ``rounds`` rounds."""
    for _ in range(max(1, number // 10)):  # warm-up
        fn()
    per_call = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(number):
            fn()
        per_call.append((time.process_time() - start) / number * 1e6)
    return statistics.median(per_call), min(per_call), max(per_call)


def _cases(codec: PayloadCodec | None, args: list[Any], kwargs: dict[str, Any]
           ) -> dict[str, Callable[[], object]]:
    recorder = Recorder(_Store(), None, codec=codec)  # type: ignore[arg-type]
    body = (args, kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    headers = {"id": "t-1", "task": "proj.login", "retries": 0, "timelimit": (None, None),
               "root_id": "t-1", "parent_id": None, "group": None, "lang": "py"}

    def publish() -> None:
        recorder.publish("proj.login", dict(headers), body, "", "celery", {"priority": 0},
                         version=1, dead_letter=True)

    data = {"args": args, "kwargs": kwargs, "options": {"queue": "celery"}}
    record = {"msg": recorder.encode(data), "ver": "1", "queue": "celery", "retries": "0"}
    clear = {**record, "msg": pl.dumps(data)}
    result = StepResult(applied=True, previous="started", now_ms=1_790_000_000_000, attempt=1)

    def dead_letter(raw: dict[str, str] = record) -> str:
        entry = dead_letter_entry(task_id="t-1", name="proj.login", reason="failed",
                                  result=result, raw=raw, message="declined", codec=codec)
        return json.dumps(entry.to_json(), default=str)

    sealed = pl.loads(record["msg"])
    cases: dict[str, Callable[[], object]] = {
        "publish": publish,
        "dead letter": dead_letter,
        "open (republish)": lambda: pl.open_arguments(sealed["args"], sealed["kwargs"], codec),
    }
    if codec is not None:
        cases["dead letter, record in clear"] = lambda: dead_letter(clear)
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000,
                        help="operations per round for the smallest payload (fewer for "
                             "bigger ones: the same bytes per round)")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    codec = PayloadCodec.of([new_key("bench")])
    rows: list[dict[str, Any]] = []
    print(f"{'payload':18} {'operation':30} {'no keys µs':>16} {'keys µs':>16} "
          f"{'added µs':>9} {'stored bytes (clear -> sealed)':>32}")
    for label, (args, kwargs) in _payloads().items():
        size = len(pl.dumps({"args": args, "kwargs": kwargs}))
        number = max(20, min(opts.number, opts.number * 200 // max(size // 10, 1)))
        plain_cases = _cases(None, args, kwargs)
        keyed_cases = _cases(codec, args, kwargs)
        sealed_size = len(pl.dumps(pl.seal_arguments({"args": args, "kwargs": kwargs},
                                                     codec)))
        for name, fn in keyed_cases.items():
            base = plain_cases.get(name, plain_cases["dead letter"])
            without = _time(base, number, opts.rounds)
            with_keys = _time(fn, number, opts.rounds)
            rows.append({"payload": label, "operation": name, "bytes": size,
                         "sealed_bytes": sealed_size, "without_us": without,
                         "with_us": with_keys, "added_us": with_keys[0] - without[0]})
            print(f"{label:18} {name:30} {_fmt(without):>16} {_fmt(with_keys):>16} "
                  f"{with_keys[0] - without[0]:9.1f} {size:>14,} -> {sealed_size:,}")
    if opts.json:
        opts.json.write_text(json.dumps(rows, indent=2))
    return 0


def _fmt(spread: tuple[float, float, float]) -> str:
    median, low, high = spread
    return f"{median:.1f} [{low:.0f}-{high:.0f}]"


if __name__ == "__main__":
    sys.exit(main())
