"""Run the jobbers demo end to end (``scripts/demo``).

Starts a private redis-server on a free port, real ``celery worker`` processes and a real
``celery beat`` (which runs the jobbers cleaner every second), then shows, live:

1. tasks that take every common path (success, retries with backoff, the dead-letter queue,
   dropped);
2. a long import whose worker is SIGKILLed mid-import: the cleaner marks it stalled, with
   its evidence, and resubmits it; another worker resumes it from its checkpoint;
3. a running task cancelled with ``jobbers.cancel()``: it stops at its next heartbeat;
4. a ``max_concurrent=1`` task submitted three times: the extra runs are deferred.

Everything it started is stopped on exit (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"completed", "failed", "cancelled", "stalled", "dropped"}
LOG_DIR = Path(tempfile.gettempdir())
MAIN_WORKER = "demo@localhost"
WORKER_A = "importer-a@localhost"
WORKER_B = "importer-b@localhost"
#: The import's worker is killed once this many chunks are checkpointed.
KILL_AFTER_CHUNKS = 3


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def check(self, what: str) -> None:
        if time.monotonic() > self.at:
            raise SystemExit(f"demo: timed out waiting for {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.1)


def _start_redis(stack: ExitStack) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("demo: redis-server not found (apt-get install redis-server)")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="jobbers-demo-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    stack.callback(_stop, [(proc, "redis-server")])
    import redis

    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    _wait(up, 10, "redis-server")
    print(f"==> private redis-server on 127.0.0.1:{port}")
    return f"redis://127.0.0.1:{port}/0"


def _stop(procs: list[tuple[subprocess.Popen[Any], str]]) -> None:
    """SIGTERM (warm shutdown) to all at once, then wait for each."""
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc, what in procs:
        if proc.returncode == -signal.SIGKILL:
            continue  # the demo killed it on purpose, and said so
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        print(f"==> stopped {what}")


def _celery(args: list[str], log_name: str) -> subprocess.Popen[Any]:
    """A celery process in its own session (process group), logging to a file."""
    with (LOG_DIR / log_name).open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project.demo_app", *args],
            cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


def _worker(name: str, queues: str, concurrency: int, log_name: str) -> subprocess.Popen[Any]:
    return _celery(["worker", "-P", "prefork", "-c", str(concurrency), "-n", name, "-Q", queues,
                    "-l", "INFO", "--without-mingle", "--without-gossip"], log_name)


def _group_pids(pgid: int) -> list[int]:
    """The processes of a process group (Linux /proc; empty elsewhere)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(entry.parent.name))
    return sorted(pids)


def _clock(at: Any) -> str:
    return f"{at:%H:%M:%S.%f}"[:-3]


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _row(rec: Any) -> str:
    if rec is None:
        return "?"
    state = rec.state.value
    extra = ""
    if state == "scheduled" and rec.run_at:
        extra = f"  run_at {_clock(rec.run_at)}"
    elif rec.progress is not None and state in ("started", "cancelled", "completed"):
        extra = f"  progress {json.dumps(rec.progress)}"
    if rec.checkpoint is not None and state == "started":
        extra += f"  checkpoint {json.dumps(rec.checkpoint)}"
    worker = f"  on {rec.worker}" if rec.worker and state == "started" else ""
    return f"{state:<10} attempt {rec.attempt}{worker}{extra}"


def _watch(jobbers: Any, tasks: dict[str, str], deadline: Deadline, width: int = 52,
           on_poll: Any = None, events: Any = None, changes_only: bool = False) -> None:
    """Print the tasks' states whenever they change, until every one is terminal.

    A table of every task at each change, or (``changes_only``, and for a single task) one
    timestamped line per task that changed. ``events`` is called before each poll (to print
    what happened meanwhile), ``on_poll`` after it (to act on what it shows).
    """
    last: dict[str, str] = {}
    while True:
        if events is not None:
            events()
        rows, settled = {}, True
        for label, task_id in tasks.items():
            rec = jobbers.get(task_id)
            settled &= rec is not None and rec.state.value in TERMINAL
            rows[label] = f"{label:<{width}} {_row(rec)}"
        if rows != last:
            if changes_only or len(rows) == 1:
                for label, row in rows.items():
                    if last.get(label) != row:
                        print(_now(), row, flush=True)
            else:
                print(_now(), "states:\n" + "\n".join(f"  {r}" for r in rows.values()) + "\n",
                      flush=True)
            last = rows
        if on_poll is not None:
            on_poll()
        if settled:
            return
        deadline.check("tasks to settle (see the logs in " + str(LOG_DIR) + ")")
        time.sleep(0.1)


def _history(jobbers: Any, label: str, task_id: str, workers: bool = False) -> None:
    print(f"  {label}  [{task_id}]")
    for t in jobbers.history(task_id):
        line = (f"     {_clock(t.at)}  {t.from_state.value:>11} -> {t.to_state.value:<11} "
                f"attempt {t.attempt}")
        if workers and t.worker:
            line += f"  {t.worker}"
        if t.reason:
            line += f"  ({t.reason})"
        print(textwrap.fill(line, 120, subsequent_indent=" " * 49, break_long_words=False,
                            break_on_hyphens=False))


def part_paths(demo: Any, deadline: Deadline) -> None:
    print("==> 1. tasks taking every common path")
    submitted = {
        "export_report(7)         succeeds": demo.export_report.delay(7).id,
        "sync_crm('acme')         retries, then succeeds": demo.sync_crm.delay("acme").id,
        "import_catalog(url)      retries run out -> DLQ":
            demo.import_catalog.delay("https://example.invalid/feed.xml").id,
        "resize_images(3)         bug -> fails at once -> DLQ":
            demo.resize_images.delay(3).id,
        "send_task('demo.nope')   nobody has it -> dropped":
            demo.app.send_task("demo.nope", args=[1]).id,
    }
    jobbers = demo.jobbers
    _watch(jobbers, submitted, deadline)
    print("==> histories (every transition, Redis clock)")
    for label, task_id in submitted.items():
        _history(jobbers, label.split()[0], task_id)
    print("\n==> dead-letter queue")
    for entry in jobbers.sink.entries():
        print(f"  {entry.name:<22} {entry.reason:<8} {entry.exception_type}: "
              f"{entry.exception_message}")
    print()


def part_stall(demo: Any, worker_a: subprocess.Popen[Any],
               procs: list[tuple[subprocess.Popen[Any], str]], deadline: Deadline) -> None:
    jobbers = demo.jobbers
    print(f"==> 2. a long import survives a SIGKILLed worker\n"
          f"  import_products: 8 chunks of 0.5 s, heartbeat(progress, checkpoint) after each,\n"
          f"  max_heartbeat_interval=5, max_stall_recoveries=1, queue 'imports' (only worker A,\n"
          f"  {WORKER_A}, consumes it). The demo SIGKILLs worker A's process group once\n"
          f"  {KILL_AFTER_CHUNKS} chunks are checkpointed, then starts worker B ({WORKER_B}).\n")
    task_id = demo.import_products.delay("https://example.invalid/products.xml").id
    seen_report: set[str] = set()
    killed = False

    def on_poll() -> None:
        nonlocal killed
        rec = jobbers.get(task_id)
        if (not killed and rec is not None and rec.worker == WORKER_A
                and (rec.checkpoint or 0) >= KILL_AFTER_CHUNKS):
            pids = _group_pids(worker_a.pid)
            os.killpg(worker_a.pid, signal.SIGKILL)
            worker_a.wait(5)
            killed = True
            print(f"{_now()} checkpoint {rec.checkpoint} saved -> SIGKILL to worker A's process "
                  f"group {worker_a.pid} (pids {', '.join(map(str, pids)) or '?'}: main "
                  f"process and pool child)", flush=True)
            worker_b = _worker(WORKER_B, "imports", 1, "jobbers-demo-worker-b.log")
            procs.append((worker_b, f"celery worker B ({WORKER_B})"))
            print(f"{_now()} started worker B {WORKER_B} (pid {worker_b.pid}); the import "
                  f"waits for the cleaner", flush=True)

    def events() -> None:
        status = jobbers.cleaner_status()
        report = status.last_report or {}
        if report.get("stalled") and report["at"] not in seen_report:
            seen_report.add(report["at"])
            print(f"{_now()} cleaner pass by {status.by}: examined {report['examined']}, "
                  f"stalled {report['stalled']}, resubmitted {report['recovered_count']}, "
                  f"dead-lettered {report['dead_lettered_count']}", flush=True)

    _watch(jobbers, {"import_products": task_id}, deadline, width=0, on_poll=on_poll,
           events=events)
    rec = jobbers.get(task_id)
    print("\n==> history of the import (the stall reason is the cleaner's evidence)")
    _history(jobbers, "import_products", task_id, workers=True)
    print("\n==> chunks each attempt loaded (the task writes each one down)")
    attempts: dict[int, dict[str, Any]] = {}
    for raw in demo.demo_redis.lrange(demo.CHUNK_LOG.format(task_id), 0, -1):
        entry = json.loads(raw)
        run = attempts.setdefault(entry["attempt"], {"chunks": []})
        if entry["event"] == "start":
            run.update(worker=entry["worker"], checkpoint=entry["checkpoint"])
        else:
            run["chunks"].append(entry["chunk"])
    loads: dict[int, int] = {}
    for attempt, run in attempts.items():
        for chunk in run["chunks"]:
            loads[chunk] = loads.get(chunk, 0) + 1
        print(f"  attempt {attempt} on {run.get('worker')}: self.checkpoint = "
              f"{run.get('checkpoint')!r}, loaded chunks {run['chunks']}")
    twice = sorted(c for c, n in loads.items() if n > 1)
    print("  loaded twice: " + (", ".join(map(str, twice)) if twice else
                                "none, the chunks up to the checkpoint were not redone")
          + f"; final state {rec.state.value if rec else '?'}\n")


def part_cancel(demo: Any, deadline: Deadline) -> None:
    jobbers = demo.jobbers
    print("==> 3. cancelling a running task\n"
          "  reindex_search: 100 batches of 0.2 s, heartbeat(progress) after each (a heartbeat\n"
          "  is sent at most once a second; the calls in between are not sent).\n")
    task_id = demo.reindex_search.delay("products").id
    asked = False

    def on_poll() -> None:
        nonlocal asked
        rec = jobbers.get(task_id)
        if not asked and rec is not None and rec.progress is not None:
            asked = True
            print(f"{_now()} jobbers.cancel(id) -> {jobbers.cancel(task_id)} (it is started: "
                  f"it stops at its next heartbeat)", flush=True)

    _watch(jobbers, {"reindex_search": task_id}, deadline, width=0, on_poll=on_poll)
    print()
    _history(jobbers, "reindex_search", task_id)
    print()


def part_cap(demo: Any, deadline: Deadline) -> None:
    jobbers = demo.jobbers
    print("==> 4. max_concurrent=1: rebuild_sitemap (0.8 s) submitted 3 times at once\n"
          "  one runs; the others go to scheduled for 0.5-1.5 s and try again, using no retry.\n")
    tasks = {f"rebuild_sitemap({n})": demo.rebuild_sitemap.delay(n).id for n in (1, 2, 3)}
    _watch(jobbers, tasks, deadline, width=18, changes_only=True)
    print()
    for label, task_id in tasks.items():
        _history(jobbers, label, task_id)
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=90, help="seconds to wait in all")
    args = parser.parse_args()
    deadline = Deadline(args.timeout)
    with ExitStack() as stack:
        url = _start_redis(stack)
        os.environ["DEMO_REDIS_URL"] = url
        beat_dir = tempfile.mkdtemp(prefix="jobbers-demo-beat-")
        stack.callback(shutil.rmtree, beat_dir, ignore_errors=True)
        procs: list[tuple[subprocess.Popen[Any], str]] = []
        stack.callback(_stop, procs)
        main_worker = _worker(MAIN_WORKER, "celery", 3, "jobbers-demo-worker.log")
        procs.append((main_worker, f"celery worker ({MAIN_WORKER})"))
        worker_a = _worker(WORKER_A, "imports", 1, "jobbers-demo-worker-a.log")
        procs.append((worker_a, f"celery worker A ({WORKER_A})"))
        beat = _celery(["beat", "-l", "INFO", "-s", str(Path(beat_dir) / "schedule")],
                       "jobbers-demo-beat.log")
        procs.append((beat, "celery beat"))
        from example_project import demo_app as demo

        _wait(lambda: len(demo.app.control.ping(destination=[MAIN_WORKER, WORKER_A],
                                                timeout=0.5) or []) == 2, 30, "the celery workers")
        print(f"==> celery worker {MAIN_WORKER} (queue 'celery') and worker A {WORKER_A} "
              f"(queue 'imports') running;\n    celery beat runs the jobbers cleaner "
              f"(jobbers.clean) every 1 s; logs: {LOG_DIR}/jobbers-demo-*.log\n")
        part_paths(demo, deadline)
        part_stall(demo, worker_a, procs, deadline)
        part_cancel(demo, deadline)
        part_cap(demo, deadline)
        counts = {s.value: n for s, n in demo.jobbers.counts().items() if n}
        print(f"==> counts {counts}\n")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        raise SystemExit(130) from None
