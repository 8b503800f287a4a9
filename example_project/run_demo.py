"""Run the jobbers demo end to end (``scripts/demo``).

Starts a private redis-server on a free port and a real ``celery worker``, submits tasks that
take every common path, prints their states live until they settle, then each task's history
and the dead-letter queue. Everything it started is stopped on exit (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"completed", "failed", "cancelled", "stalled", "dropped"}


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
    stack.callback(_stop, proc, "redis-server")
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


def _stop(proc: subprocess.Popen[Any], what: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    print(f"==> stopped {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait in all")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = _start_redis(stack)
        os.environ["DEMO_REDIS_URL"] = url
        log_path = Path(tempfile.gettempdir()) / "jobbers-demo-worker.log"
        with log_path.open("w") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "example_project.demo_app", "worker",
                 "-P", "prefork", "-c", "2", "-n", "demo@localhost", "-l", "INFO",
                 "--without-mingle", "--without-gossip"],
                cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        stack.callback(_stop, worker, "celery worker")
        from example_project import demo_app as demo

        _wait(lambda: bool(demo.app.control.ping(destination=["demo@localhost"], timeout=0.5)),
              30, "the celery worker")
        print(f"==> celery worker running (log: {log_path})\n")
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
        deadline = time.monotonic() + args.timeout
        last = ""
        while True:
            lines = []
            settled = True
            for label, task_id in submitted.items():
                rec = jobbers.get(task_id)
                state = rec.state.value if rec else "?"
                settled &= state in TERMINAL
                extra = ""
                if rec and rec.state.value == "scheduled" and rec.run_at:
                    extra = f" run_at {rec.run_at:%H:%M:%S.%f}"[:-3]
                attempt = rec.attempt if rec else 0
                lines.append(f"  {label:<52} {state:<10} attempt {attempt}{extra}")
            screen = "\n".join(lines)
            if screen != last:
                print(time.strftime("%H:%M:%S"), "states:\n" + screen + "\n", flush=True)
                last = screen
            if settled:
                break
            if time.monotonic() > deadline:
                print("demo: some tasks did not settle in time", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print("==> histories (every transition, Redis clock)")
        for label, task_id in submitted.items():
            print(f"  {label.split()[0]}  [{task_id}]")
            for t in jobbers.history(task_id):
                reason = f"  ({t.reason})" if t.reason else ""
                print(f"     {t.at:%H:%M:%S.%f}"[:-3] + f"  {t.from_state.value:>11} -> "
                      f"{t.to_state.value:<11} attempt {t.attempt}{reason}")
        print("\n==> dead-letter queue")
        for entry in jobbers.sink.entries():  # type: ignore[attr-defined]
            print(f"  {entry.name:<22} {entry.reason:<8} {entry.exception_type}: "
                  f"{entry.exception_message}")
        counts = {s.value: n for s, n in jobbers.counts().items() if n}
        print(f"\n==> counts {counts}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
