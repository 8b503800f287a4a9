"""Run the jobbers example end to end (``scripts/example``).

Sets up the example Django project (migrations, an admin user), uses the Redis in
``REDIS_URL`` or starts a private ``redis-server``, starts real ``celery worker`` processes,
``celery beat`` (which runs the jobbers cleaner every second) and the Django web server,
then submits tasks that take every path jobbers knows and shows their states live:

  success; retries with exponential backoff, then success; retries running out and a bug,
  both into the dead-letter queue; a task that freezes and is stalled by its heartbeat
  deadline; a task cancelled while it runs; a message for another task version, dropped;
  a long task whose worker gets SIGTERM (resubmitted, resumed on a new worker from its
  checkpoint); a long task whose worker is SIGKILLed (recovered by the cleaner, resumed);
  and a max_concurrent=1 task whose extra runs are deferred.

Then it prints what happened (each task's transitions, the dead-letter queue as stored in
the database, grouped by fingerprint) with links to the admin and the API, and keeps the
admin, the API, the workers and beat running until Ctrl-C, which stops everything it started.

Exit status: 0 when every task ended as expected, 1 when one did not (or a process died),
2 when the setup failed (no Redis, no database), 130 when interrupted before the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

TERMINAL = ("completed", "failed", "cancelled", "stalled", "dropped")
STEPS = 6
MAIN, LONG_A, IMPORTS_B, LONG_C = ("main@example", "long-a@example", "imports-b@example",
                                   "long-c@example")
#: A long task's worker is stopped (SIGTERM) or killed (SIGKILL) once this many chunks
#: are checkpointed.
ACT_AT_CHUNK = 3


class SetupError(Exception):
    """The example cannot run here; the message says what to do."""


class Failed(Exception):
    """Something went wrong after the setup (a process died, a timeout)."""


class Stop(BaseException):
    """SIGTERM or SIGHUP: unwind and stop everything, like Ctrl-C."""


# ---------------------------------------------------------------------- terminal output
class UI:
    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.color = self.tty and not os.environ.get("NO_COLOR") and os.environ.get(
            "TERM") != "dumb"
        self.step_no = 0
        self._status = False  # a status line is on screen (TTY only)

    @property
    def width(self) -> int:
        return max(60, shutil.get_terminal_size((120, 40)).columns) if self.tty else 160

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self.paint(text, "1")

    def dim(self, text: str) -> str:
        return self.paint(text, "2")

    def state(self, state: str, width: int = 0) -> str:
        code = {"completed": "32", "failed": "31", "stalled": "31", "dropped": "31",
                "cancelled": "33", "scheduled": "33", "started": "36",
                "submitted": "34"}.get(state, "0")
        return self.paint(f"{state:<{width}}", code)

    def out(self, text: str = "") -> None:
        self.clear_status()
        print(text, flush=True)

    def status(self, text: str) -> None:
        """A transient progress line (TTY), or nothing (plain output gets the results)."""
        if self.tty:
            sys.stdout.write("\r\x1b[2K    " + self.dim(text[: self.width - 5]))
            sys.stdout.flush()
            self._status = True

    def clear_status(self) -> None:
        if self._status:
            sys.stdout.write("\r\x1b[2K")
            sys.stdout.flush()
            self._status = False

    def header(self, title: str, note: str = "") -> None:
        self.step_no += 1
        self.out(self.bold(f"[{self.step_no}/{STEPS}] {title}") + self.dim(note))

    @contextmanager
    def step(self, title: str) -> Iterator[list[str]]:
        """``[n/N] title`` ... ``done in 1.2 s``, then the lines the step added."""
        self.step_no += 1
        started = time.monotonic()
        self.out(self.bold(f"[{self.step_no}/{STEPS}] {title}"))
        notes: list[str] = []
        yield notes
        for note in notes:
            self.out(f"    {note}")
        self.out(self.dim(f"    done in {time.monotonic() - started:.1f} s"))


# ---------------------------------------------------------------------- processes
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    stopped_on_purpose: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("      | " + line for line in text[-lines:])


def group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (Linux /proc; empty elsewhere)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return sorted(pids)


class Processes:
    """Every process this command starts, each in its own session (so Ctrl-C in the
    terminal reaches only this command, which stops them in order)."""

    def __init__(self, log_dir: Path, env: dict[str, str], report: Report) -> None:
        self.log_dir = log_dir
        self.env = env
        self.report = report
        self.procs: list[Proc] = []

    def start(self, name: str, cmd: list[str], log_name: str, cwd: Path = HERE) -> Proc:
        log = self.log_dir / log_name
        with log.open("wb") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(cmd, cwd=cwd, env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        self.report.started(proc)
        return proc

    def celery(self, name: str, args: list[str], log_name: str) -> Proc:
        return self.start(name, [sys.executable, "-m", "celery", "-A", "example", *args],
                          log_name)

    def worker(self, hostname: str, queues: str, concurrency: int) -> Proc:
        short = hostname.split("@")[0]
        return self.celery(f"worker {hostname}", [
            "worker", "-P", "prefork", "-c", str(concurrency), "-n", hostname, "-Q", queues,
            "-l", "INFO", "--without-mingle", "--without-gossip"], f"worker-{short}.log")

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.stopped_on_purpose and not proc.alive():
                raise Failed(f"{proc.name} (pid {proc.pid}) exited with status "
                             f"{proc.popen.returncode}; the end of {proc.log}:\n{proc.tail()}")

    def stop_all(self, ui: UI, keep_last: Proc | None = None) -> None:
        """SIGTERM to each (workers at once: a warm shutdown), wait, SIGKILL what is left;
        ``keep_last`` (Redis) goes after everything that uses it."""
        first = [p for p in self.procs if p is not keep_last]
        for proc in first:
            if proc.alive():
                _signal(proc.pid, signal.SIGTERM)
        for proc in [*first, *([keep_last] if keep_last else [])]:
            if proc is keep_last and proc.alive():
                _signal(proc.pid, signal.SIGTERM)
            was_alive = proc.popen.returncode is None
            try:
                proc.popen.wait(20)
            except subprocess.TimeoutExpired:
                ui.out(f"    {proc.name} did not stop within 20 s: SIGKILL")
                _killpg(proc.pid)
                proc.popen.wait(5)
            # pool children or anything else left in its group
            if group_pids(proc.pid):
                _killpg(proc.pid)
            if was_alive:
                ui.out(ui.dim(f"    stopped {proc.name} (pid {proc.pid})"))


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _killpg(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(what: str, predicate: Callable[[], Any], timeout: float,
               procs: Processes | None = None, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if procs is not None:
            procs.check_alive()
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------- report file
class Report:
    """``--report FILE``: what happened, as JSON, written as it goes (pids included, so
    that whoever runs this can check that nothing it started is left)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {"processes": [], "tasks": [], "dead_letters": [],
                                     "ok": False, "exit_status": None, "timings": {}}

    def started(self, proc: Proc) -> None:
        self.data["processes"].append({"name": proc.name, "pid": proc.pid})
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


# ---------------------------------------------------------------------- scenario
@dataclass
class Row:
    label: str
    call: str
    explain: str
    expect: str
    submit: Callable[[], Any]
    dead_letter: bool = False
    task_id: str = ""
    record: Any = None
    history: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.record.state.value if self.record is not None else "?"

    @property
    def settled(self) -> bool:
        return self.state in TERMINAL


def scenario_rows(tasks: Any) -> list[Row]:
    feed_a = [{"sku": "A-1", "price": "9.90", "qty": 3}, {"sku": "A-2", "price": "4.50", "qty": 1}]
    feed_b = [{"sku": "G-7", "price": "12.00", "qty": 2}]
    return [
        Row("success", "send_order_confirmation(1001)", "runs and returns",
            "completed", lambda: tasks.send_order_confirmation.delay(1001)),
        Row("retry+backoff", "charge_payment(1002)",
            "PaymentGatewayBusy twice (expected exception): retried after 0.5 s and 1 s "
            "(exponential backoff, waiting in Redis), then charged", "completed",
            lambda: tasks.charge_payment.delay(1002)),
        Row("retries run out", "sync_inventory('berlin')",
            "SupplierTimeout on every attempt: 2 retries, then failed into the DLQ", "failed",
            lambda: tasks.sync_inventory.delay("berlin"), dead_letter=True),
        Row("bug", "import_supplier_feed('acme')",
            "KeyError (unexpected exception): failed at once, no retry, into the DLQ",
            "failed", lambda: tasks.import_supplier_feed.delay("acme", feed_a),
            dead_letter=True),
        Row("same bug", "import_supplier_feed('globex')",
            "the same KeyError on other data: same fingerprint, one failure group", "failed",
            lambda: tasks.import_supplier_feed.delay("globex", feed_b), dead_letter=True),
        Row("freeze", "render_invoice_pdf('INV-7')",
            "renders pages, then freezes without heartbeating: after "
            "max_heartbeat_interval=2 s the cleaner declares it stalled, into the DLQ",
            "stalled", lambda: tasks.render_invoice_pdf.delay("INV-7"), dead_letter=True),
        Row("cancel", "export_orders('2025-10')",
            "a long export; cancelled while it runs, it stops at its next heartbeat",
            "cancelled", lambda: tasks.export_orders.delay("2025-10")),
        Row("version", "recalculate_prices('spring')",
            "published for version 2 (headers={'jobbers_version': 2}); the workers run "
            "version 1: dropped before it runs, into the DLQ", "dropped",
            lambda: tasks.recalculate_prices.apply_async(
                args=["spring"], headers={"jobbers_version": 2}), dead_letter=True),
        Row("SIGTERM", "reindex_catalog()",
            f"on_shutdown=resubmit; its worker {LONG_A} gets SIGTERM after chunk "
            f"{ACT_AT_CHUNK}: resubmitted with its checkpoint, resumed by {LONG_C}",
            "completed", lambda: tasks.reindex_catalog.delay()),
        Row("SIGKILL", "import_products()",
            f"its worker {IMPORTS_B} is SIGKILLed after chunk {ACT_AT_CHUNK}: the cleaner "
            f"sees the worker gone (worker_lost_after=3 s), stalls and resubmits it "
            f"(max_stall_recoveries=1), {LONG_C} resumes it from its checkpoint", "completed",
            lambda: tasks.import_products.delay()),
        *[Row(f"max_concurrent {n}", f"rebuild_sitemap({n})",
              "max_concurrent=1, submitted 3 times at once: one runs, the others are "
              "deferred (scheduled) without using a retry", "completed",
              lambda n=n: tasks.rebuild_sitemap.delay(n)) for n in (1, 2, 3)],
    ]


class Scenario:
    def __init__(self, ui: UI, procs: Processes, jobbers: Any, tasks: Any,
                 timeout: float) -> None:
        self.ui = ui
        self.procs = procs
        self.jobbers = jobbers
        self.tasks = tasks
        self.timeout = timeout
        self.rows = scenario_rows(tasks)
        self.by_label = {r.label: r for r in self.rows}
        self.t0 = 0.0
        self.events: list[str] = []
        self._pending_events: list[str] = []
        self._drawn = 0
        self._last_lines: dict[str, str] = {}
        self._seen_passes: set[str] = set()
        self.cancelled = False
        self.sigtermed: Proc | None = None
        self.sigkilled: Proc | None = None
        self.long_c: Proc | None = None
        self.workers: dict[str, Proc] = {}

    # ---------------------------------------------------------------- actions
    def event(self, text: str) -> None:
        line = f"+{time.monotonic() - self.t0:5.1f}s  {text}"
        self.events.append(line)
        self._pending_events.append(line)

    def _start_long_c(self) -> None:
        if self.long_c is None:
            self.long_c = self.procs.worker(LONG_C, "long,imports", 2)
            self.event(f"started worker {LONG_C} (queues long, imports; pid "
                       f"{self.long_c.pid})")

    def act(self) -> None:
        """Do what the scenario does to running tasks, when their state says it is time."""
        from jobbers_django import services

        cancel = self.by_label["cancel"]
        rec = cancel.record
        if (not self.cancelled and rec is not None and rec.state.value == "started"
                and (rec.progress or {}).get("batch", 0) >= 3):
            self.cancelled = True
            done = services.cancel_task(cancel.task_id)
            self.event(f"cancel export_orders: services.cancel_task(id) -> {done} "
                       f"(audited; it stops at its next heartbeat)")
        sigterm = self.by_label["SIGTERM"].record
        if (self.sigtermed is None and sigterm is not None and sigterm.state.value == "started"
                and sigterm.worker == LONG_A and (sigterm.checkpoint or 0) >= ACT_AT_CHUNK):
            proc = self.workers[LONG_A]
            proc.stopped_on_purpose = True
            _signal(proc.pid, signal.SIGTERM)
            self.sigtermed = proc
            self.event(f"SIGTERM to worker {LONG_A} (pid {proc.pid}; a deploy) at checkpoint "
                       f"{sigterm.checkpoint}")
            self._start_long_c()
        sigkill = self.by_label["SIGKILL"].record
        if (self.sigkilled is None and sigkill is not None and sigkill.state.value == "started"
                and sigkill.worker == IMPORTS_B and (sigkill.checkpoint or 0) >= ACT_AT_CHUNK):
            proc = self.workers[IMPORTS_B]
            proc.stopped_on_purpose = True
            pids = group_pids(proc.pid)
            _killpg(proc.pid)
            self.sigkilled = proc
            self.event(f"SIGKILL to worker {IMPORTS_B} (pids {', '.join(map(str, pids))}: "
                       f"main process and pool child) at checkpoint {sigkill.checkpoint}")
            self._start_long_c()
        if self.sigtermed is not None and self.sigtermed.popen.poll() is not None \
                and not getattr(self.sigtermed, "_exit_noted", False):
            self.sigtermed._exit_noted = True  # type: ignore[attr-defined]
            self.event(f"worker {LONG_A} finished its warm shutdown and exited "
                       f"(status {self.sigtermed.popen.returncode})")
        status = self.jobbers.cleaner_status()
        report = status.last_report or {}
        if (report.get("stalled") or report.get("recovered_count")) \
                and report.get("at") not in self._seen_passes:
            self._seen_passes.add(report["at"])
            self.event(f"cleaner pass (beat): {report['stalled']} stalled, "
                       f"{report['recovered_count']} resubmitted, "
                       f"{report['dead_lettered_count']} dead-lettered")

    # ---------------------------------------------------------------- display
    def detail(self, row: Row) -> str:
        rec = row.record
        if rec is None:
            return ""
        state = rec.state.value
        parts = []
        if state == "scheduled" and rec.run_at is not None:
            wait = (rec.run_at.timestamp() - time.time())
            parts.append(f"runs again in {max(wait, 0):.1f} s")
        if isinstance(rec.progress, dict) and state in ("started", "cancelled", "completed",
                                                         "stalled", "submitted"):
            parts.append(" ".join(f"{k}={v}" for k, v in rec.progress.items()))
        if rec.checkpoint is not None and state in ("started", "submitted"):
            parts.append(f"checkpoint={rec.checkpoint}")
        if rec.worker and state == "started":
            parts.append(f"on {rec.worker}")
            if rec.heartbeat_at is not None:
                silent = time.time() - rec.heartbeat_at.timestamp()
                if silent >= 1.2:
                    parts.append(f"silent {silent:.1f} s")
        if rec.error is not None and state in ("failed", "scheduled"):
            parts.append(rec.error.type.rsplit(".", 1)[-1])
        elif rec.error is not None and state in ("dropped", "stalled"):
            parts.append(rec.error.message.split(";")[0].removeprefix("stalled: "))
        if state == "completed" and rec.submitted_at and rec.completed_at:
            parts.append(f"took {(rec.completed_at - rec.submitted_at).total_seconds():.1f} s")
        return "  ".join(parts)

    def table(self) -> list[str]:
        ui = self.ui
        head = f"  {'scenario':<16} {'task':<31} {'state':<10} {'try':>3}  detail"
        lines = [ui.dim(head[: ui.width - 1])]
        for row in self.rows:
            left = f"  {row.label:<16} {row.call:<31} "
            detail = self.detail(row)
            attempt = f"{row.record.attempt:>3}" if row.record is not None else "   "
            room = ui.width - 1 - len(left) - 10 - 1 - 3 - 2
            lines.append(left + ui.state(row.state, 10) + " " + attempt + "  "
                         + detail[: max(room, 0)])
        elapsed = time.monotonic() - self.t0
        settled = sum(r.settled for r in self.rows)
        lines.append(ui.dim(f"  {settled}/{len(self.rows)} settled, {elapsed:.1f} s"))
        return lines

    def draw(self) -> None:
        ui = self.ui
        if ui.tty:
            buf = []
            if self._drawn:
                buf.append(f"\x1b[{self._drawn}F\x1b[J")
            buf += [e[: ui.width - 1] + "\n" for e in self._pending_events]
            lines = self.table()
            buf += [line + "\x1b[K\n" for line in lines]
            sys.stdout.write("".join(buf))
            sys.stdout.flush()
            self._drawn = len(lines)
        else:
            for e in self._pending_events:
                print(e, flush=True)
            for row in self.rows:
                line = f"{row.state:<10} attempt {row.record.attempt if row.record else '-'}"
                detail = self.detail(row)
                if line != self._last_lines.get(row.label):
                    self._last_lines[row.label] = line
                    print(f"+{time.monotonic() - self.t0:5.1f}s  {row.call:<31} {line}"
                          + (f"  {detail}" if detail else ""), flush=True)
        self._pending_events = []

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        self.t0 = time.monotonic()
        for row in self.rows:
            row.task_id = row.submit().id
        self.event(f"submitted {len(self.rows)} tasks")
        deadline = self.t0 + self.timeout
        while True:
            for row in self.rows:
                row.record = self.jobbers.get(row.task_id)
            self.act()
            self.draw()
            if all(r.settled for r in self.rows):
                break
            self.procs.check_alive()
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{r.call} ({r.state})" for r in self.rows
                                    if not r.settled)
                raise Failed(f"timed out after {self.timeout:.0f} s; not settled: {waiting}")
            time.sleep(0.2)
        for row in self.rows:
            row.history = self.jobbers.history(row.task_id)
            row.record = self.jobbers.get(row.task_id)
        self.check()

    def check(self) -> None:
        """Did every task take its path? (Problems are reported, and make the exit 1.)"""
        for row in self.rows:
            if row.state != row.expect:
                row.problems.append(f"ended {row.state}, expected {row.expect}")
        moves = {r.label: [(t.from_state.value, t.to_state.value) for t in r.history]
                 for r in self.rows}
        retry = self.by_label["retry+backoff"]
        if moves["retry+backoff"].count(("started", "scheduled")) != 2:
            retry.problems.append("expected 2 delayed retries")
        for label, how in (("SIGTERM", ("started", "unsubmitted")),
                           ("SIGKILL", ("started", "stalled"))):
            row = self.by_label[label]
            if how not in moves[label]:
                row.problems.append(f"no {how[0]} -> {how[1]} in its history")
            rec = row.record
            if rec is not None and rec.state.value == "completed":
                resumed = (rec.progress or {}).get("resumed_from", 0)
                if not resumed:
                    row.problems.append("did not resume from a checkpoint")
                if rec.worker != LONG_C:
                    row.problems.append(f"completed on {rec.worker}, expected {LONG_C}")
        deferred = sum(moves[f"max_concurrent {n}"].count(("submitted", "scheduled"))
                       for n in (1, 2, 3))
        if deferred == 0:
            self.by_label["max_concurrent 1"].problems.append("no run was deferred")


# ---------------------------------------------------------------------- summary
def clock(at: Any, t0: Any) -> str:
    return f"{(at - t0).total_seconds():5.2f}"


def print_summary(ui: UI, sc: Scenario, entries: list[Any], groups: list[Any]) -> None:
    ui.out(ui.bold("What happened") + ui.dim("  (each task's transitions, seconds after its "
                                             "submission, by the Redis clock)"))
    for row in sc.rows:
        mark = ui.paint("✗", "31") if row.problems else ui.paint("✓", "32")
        ui.out(f"  {mark} {ui.bold(row.call)}  {ui.state(row.state)}  "
               f"{ui.dim(row.task_id)}")
        for line in textwrap.wrap(row.explain, ui.width - 8):
            ui.out(ui.dim(f"      {line}"))
        if row.history:
            t0 = row.history[0].at
            steps = [f"{t.to_state.value} {clock(t.at, t0).strip()}" for t in row.history]
            path = " → ".join([row.history[0].from_state.value, *steps])
            for line in textwrap.wrap(path, ui.width - 8, break_on_hyphens=False):
                ui.out(f"      {line}")
            notable = [t for t in row.history if t.to_state.value in (
                "unsubmitted", "stalled", "dropped", "cancelled", "failed")
                or (t.from_state.value, t.to_state.value) in (("stalled", "submitted"),)]
            for t in notable:
                who = f" [{t.worker}]" if t.worker else ""
                text = f"{t.from_state.value} -> {t.to_state.value}{who}: {t.reason or ''}"
                for n, line in enumerate(textwrap.wrap(text, ui.width - 10)):
                    ui.out(ui.dim(("      · " if n == 0 else "        ") + line))
        rec = row.record
        if rec is not None and row.label in ("SIGTERM", "SIGKILL") and rec.progress:
            ui.out(ui.dim(f"      · attempt {rec.attempt} on {rec.worker} resumed after "
                          f"chunk {rec.progress.get('resumed_from')} (its checkpoint)"))
        for problem in row.problems:
            ui.out(ui.paint(f"      ! {problem}", "31"))

    ui.out()
    ui.out(ui.bold("Dead-letter queue") + ui.dim(
        f"  (jobbers_django.sink.DjangoDeadLetterSink wrote {len(entries)} entries of this run "
        "to the database)"))
    for e in entries:
        exc = (e.exception_type or "").rsplit(".", 1)[-1]
        msg = f"{exc}: {e.exception_message}" if exc else e.exception_message
        ui.out(f"  {ui.state(e.reason, 8)} {e.task_name:<26} {e.fingerprint[:10]}  "
               + msg[: max(ui.width - 50, 20)])
    if groups:
        ui.out()
        ui.out(ui.bold("Failure groups") + ui.dim("  (same task, exception and code path = "
                                                   "same fingerprint: one bug, one row)"))
        for g in groups:
            exc = (g.exception_type or "").rsplit(".", 1)[-1] or "-"
            ui.out(f"  {g.fingerprint[:10]}  {g.failures:>2} failure(s), {g.dead:>2} dead  "
                   f"{g.task_name:<26} {exc}  {ui.dim(g.frame)}")


def print_links(ui: UI, base: str, password: str, sc: Scenario, api_note: str) -> None:
    from django.urls import NoReverseMatch, reverse

    def admin_url(name: str, *args: str) -> str | None:
        try:
            return base + reverse(name, args=args)
        except NoReverseMatch:
            return None

    bug = sc.by_label["bug"].task_id
    retry = sc.by_label["retry+backoff"].task_id
    ui.out()
    ui.out(ui.bold("Admin") + f"  {base}/admin/   user {ui.bold('admin')}   password "
           f"{ui.bold(password)}")
    for title, url in (
        ("dead letters", admin_url("admin:jobbers_deadletterentry_changelist")),
        ("failure groups", admin_url("admin:jobbers_failuregroup_changelist")),
        ("live tasks", admin_url("admin:jobbers_live")),
        ("one task", admin_url("admin:jobbers_task", retry)),
        ("audit", admin_url("admin:jobbers_deadletteraudit_changelist")),
    ):
        if url:
            ui.out(f"  {title:<15} {url}")
    auth = f"-u admin:{password}"
    api = f"{base}/jobbers"
    ui.out()
    ui.out(ui.bold("API") + f"  {api}/   (OpenAPI schema: {api}/schema){api_note}")
    for comment, cmd in (
        ("the DLQ, filtered", (f"curl {auth} '{api}/dead-letter-queue?task_name="
                              "shop.import_supplier_feed'")),
        ("one task's failures", f"curl {auth} {api}/dead-letter-queue/{bug}/history"),
        ("what a resubmit would do", (f"curl {auth} -H 'Content-Type: application/json' "
                                     f"-d '{{\"task_name\": \"shop.import_supplier_feed\", "
                                     f"\"dry_run\": true}}' {api}/dead-letter-queue/resubmit")),
        ("a task and its transitions", f"curl {auth} {api}/tasks/{retry}"),
        ("delayed retries waiting", f"curl {auth} {api}/scheduled-tasks"),
    ):
        ui.out(ui.dim(f"  # {comment}"))
        ui.out(f"  {cmd}")


def probe_api(base: str, password: str) -> str:
    """GET the DLQ through the API once: a line saying whether it answers."""
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(f"{base}/jobbers/dead-letter-queue?limit=1",
                                     headers={"Authorization": f"Basic {token}",
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return f"\n  (checked: GET /jobbers/dead-letter-queue answered {response.status})"
    except urllib.error.HTTPError as exc:
        return f"\n  (checked: GET /jobbers/dead-letter-queue answered {exc.code})"
    except OSError as exc:
        return f"\n  (GET /jobbers/dead-letter-queue failed: {exc})"


# ---------------------------------------------------------------------- setup steps
#: Used when redis-server is not installed but a Redis answers on the standard port; a
#: database of its own keeps the example's queues apart from an application's on db 0.
LOCAL_REDIS = os.environ.get("EXAMPLE_FALLBACK_REDIS_URL", "redis://127.0.0.1:6379/15")


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(ui: UI, procs: Processes, notes: list[str]) -> tuple[str, Proc | None]:
    import redis

    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        try:
            info = redis.Redis.from_url(url, socket_connect_timeout=3).info("server")
        except (redis.RedisError, ValueError) as exc:
            raise SetupError(
                f"REDIS_URL={url} does not answer ({exc}).\n"
                "Start that Redis, or unset REDIS_URL to let the example start its own "
                "redis-server.") from None
        notes.append(f"using REDIS_URL={url} (Redis {info.get('redis_version')}); keys under "
                     "'jobbers-example', queues celery, long, imports")
        return url, None
    binary = shutil.which("redis-server")
    if binary is None and _answers(LOCAL_REDIS):
        # No redis-server to start, but one is reachable: use it, in a database of its own
        notes.append(f"redis-server is not installed; using the Redis that answers at "
                     f"{LOCAL_REDIS} (keys under 'jobbers-example'; REDIS_URL picks another)")
        return LOCAL_REDIS, None
    if binary is None:
        raise SetupError(
            "No Redis: REDIS_URL is not set and redis-server is not installed.\n"
            "Either install redis-server (the example then starts a private one):\n"
            "    sudo apt-get install redis-server        # Debian, Ubuntu\n"
            "    sudo dnf install redis                   # Fedora\n"
            "    brew install redis                       # macOS\n"
            "or point the example at a Redis you run:\n"
            "    docker run -d -p 6379:6379 redis:7\n"
            "    REDIS_URL=redis://127.0.0.1:6379/0 scripts/example")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="jobbers-example-redis-")
    proc = procs.start("redis-server", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                        "--save", "", "--appendonly", "no", "--dir", workdir],
                       "redis.log")
    proc.workdir = workdir  # type: ignore[attr-defined]
    client = redis.Redis(port=port, socket_connect_timeout=1)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    ui.status(f"waiting for redis-server on 127.0.0.1:{port}")
    wait_until("redis-server to answer", up, 15, procs)
    version = client.info("server").get("redis_version")
    client.close()
    notes.append(f"started a private redis-server {version} on 127.0.0.1:{port} (pid "
                 f"{proc.pid}); no persistence: its data goes when the example stops")
    return f"redis://127.0.0.1:{port}/0", proc


class MigrationProgress:
    """A file-like object for ``migrate``'s output that turns it into a progress line."""

    def __init__(self, ui: UI, total: int) -> None:
        self.ui = ui
        self.total = total
        self.done = 0

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip().startswith("Applying "):
                self.done += 1
                name = line.strip()[len("Applying "):].split("...")[0]
                self.ui.status(f"applying migration {self.done}/{self.total}: {name}")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def migrate(ui: UI, notes: list[str]) -> None:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import DatabaseError, connection
    from django.db.migrations.executor import MigrationExecutor

    db = settings.DATABASES["default"]
    where = (f"SQLite {db['NAME']}" if "sqlite" in db["ENGINE"] else
             f"PostgreSQL {db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:"
             f"{db.get('PORT') or 5432}/{db['NAME']}")
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        progress = MigrationProgress(ui, len(plan))
        call_command("migrate", interactive=False, verbosity=1, stdout=progress)
    except DatabaseError as exc:
        raise SetupError(f"cannot use the database ({where}): {exc}\n"
                         "Check DATABASE_URL (postgres://user:password@host:port/dbname), "
                         "or unset it to use SQLite.") from None
    notes.append(f"database: {where}; " + (f"applied {len(plan)} migrations" if plan
                                           else "migrations already applied"))


def admin_user(var: Path, notes: list[str]) -> str:
    from django.contrib.auth import get_user_model

    password = os.environ.get("EXAMPLE_ADMIN_PASSWORD", "")
    saved = var / "admin-password"
    if not password and saved.exists():
        password = saved.read_text().strip()
    if not password:
        password = secrets.token_urlsafe(9)
    saved.write_text(password + "\n")
    saved.chmod(0o600)
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username="admin", defaults={"email": "admin@example.invalid"})
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    notes.append(f"{'created' if created else 'updated'} superuser 'admin' with password "
                 f"{password}  (kept in {saved}; EXAMPLE_ADMIN_PASSWORD sets another)")
    return password


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def start_services(ui: UI, procs: Processes, app: Any, jobbers: Any, port: int,
                   var: Path, notes: list[str]) -> dict[str, Proc]:
    workers = {
        MAIN: procs.worker(MAIN, "celery", 4),
        LONG_A: procs.worker(LONG_A, "long", 1),
        IMPORTS_B: procs.worker(IMPORTS_B, "imports", 1),
    }
    beat = procs.celery("celery beat", ["beat", "-l", "INFO", "-s",
                                        str(var / "celerybeat-schedule")], "beat.log")
    web = procs.start("web server", [sys.executable, "manage.py", "runserver",
                                     f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
                      "web.log")
    ready: dict[str, bool] = {}
    started = time.monotonic()
    before = jobbers.cleaner_status().last_run_at

    def check() -> bool:
        missing = [w for w in workers if not ready.get(w)]
        if missing:
            for reply in app.control.ping(destination=missing, timeout=0.3) or []:
                for name in reply:
                    ready[name] = True
        if not ready.get("web") and http_ok(f"http://127.0.0.1:{port}/admin/login/"):
            ready["web"] = True
        if not ready.get("beat"):
            last = jobbers.cleaner_status().last_run_at
            ready["beat"] = last is not None and last != before
        names = [*workers, "beat", "web"]
        shown = "  ".join(f"{n.split('@')[0]} {'✓' if ready.get(n) else '…'}" for n in names)
        ui.status(f"{shown}   ({time.monotonic() - started:.0f} s)")
        return all(ready.get(n) for n in names)

    wait_until("the workers, beat and the web server (logs: " + str(procs.log_dir) + ")",
               check, 90, procs, interval=0.2)
    notes.append(f"workers: {MAIN} (queue celery, 4 processes), {LONG_A} (queue long), "
                 f"{IMPORTS_B} (queue imports); pids {', '.join(str(w.pid) for w in workers.values())}")
    notes.append(f"celery beat (pid {beat.pid}): the jobbers cleaner every 1 s")
    notes.append(f"web server (pid {web.pid}): http://127.0.0.1:{port}/admin/")
    notes.append(f"logs: {procs.log_dir}/")
    return workers


def dead_letters_of(rows: list[Row], timeout: float = 10) -> tuple[list[Any], list[Any]]:
    """This run's DLQ entries and their failure groups, once the sink wrote them all."""
    from jobbers_django.models import DeadLetterEntry, FailureGroup

    ids = [r.task_id for r in rows]
    want = {r.task_id for r in rows if r.dead_letter}
    deadline = time.monotonic() + timeout
    while True:
        entries = list(DeadLetterEntry.objects.filter(task_id__in=ids)
                       .order_by("first_failed_at"))
        if want <= {e.task_id for e in entries} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for row in rows:
        if row.dead_letter and row.task_id not in {e.task_id for e in entries}:
            row.problems.append("no dead-letter entry in the database")
    groups = list(FailureGroup.objects.filter(
        fingerprint__in={e.fingerprint for e in entries}).order_by("-failures", "task_name"))
    return entries, groups


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/example", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-serve", action="store_true",
                        help="stop everything and exit after the summary (CI)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds the scenario may take to settle (default 60)")
    parser.add_argument("--port", type=int, default=8000,
                        help="web server port (default 8000; a free one if taken)")
    parser.add_argument("--var-dir", type=Path, default=None,
                        help="where the SQLite database, logs and beat schedule go "
                             "(default: $EXAMPLE_VAR_DIR or example_project/var)")
    parser.add_argument("--report", type=Path, default=None,
                        help="write what happened (states, pids) to this JSON file")
    args = parser.parse_args(argv)

    ui = UI()
    report = Report(args.report)
    var = (args.var_dir or Path(os.environ.get("EXAMPLE_VAR_DIR") or HERE / "var")).resolve()
    (var / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EXAMPLE_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1",
           "DJANGO_SETTINGS_MODULE": "example.settings"}
    procs = Processes(var / "logs", env, report)

    def stop(signum: int, _frame: Any) -> None:
        raise Stop(signal.Signals(signum).name)

    # Ctrl-C raises KeyboardInterrupt even when this was started with SIGINT ignored
    # (a background job of a script); SIGTERM and SIGHUP unwind the same way
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    redis_proc: Proc | None = None
    status = 1
    t_start = time.monotonic()
    try:
        status = run(args, ui, procs, env, var, report)
    except SetupError as exc:
        ui.out(ui.paint(f"\nexample: {exc}", "31"))
        status = 2
    except Failed as exc:
        ui.out(ui.paint(f"\nexample: {exc}", "31"))
        status = 1
    except (KeyboardInterrupt, Stop) as exc:
        ui.out(f"\n{'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else exc}: stopping "
               "everything this command started")
        status = 130
    finally:
        # a second Ctrl-C must not leave processes behind: ignore it while stopping
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        redis_proc = next((p for p in procs.procs if p.name == "redis-server"), None)
        if procs.procs:
            ui.out(ui.bold("Stopping") + ui.dim(" (workers get SIGTERM: a warm shutdown)"))
            t_stop = time.monotonic()
            procs.stop_all(ui, keep_last=redis_proc)
            report.data["timings"]["stop_s"] = round(time.monotonic() - t_stop, 2)
        if redis_proc is not None:
            shutil.rmtree(getattr(redis_proc, "workdir", ""), ignore_errors=True)
        report.data["exit_status"] = status
        report.data["timings"]["total_s"] = round(time.monotonic() - t_start, 2)
        report.write()
    return status


def run(args: argparse.Namespace, ui: UI, procs: Processes, env: dict[str, str], var: Path,
        report: Report) -> int:
    timings = report.data["timings"]
    t0 = time.monotonic()
    ui.out(ui.bold("jobbers example") + ui.dim(
        "  a Django shop whose Celery tasks take every path: success, retries, the "
        "dead-letter queue, freezes, cancellation, versions, SIGTERM and SIGKILL"))
    with ui.step("Environment") as notes:
        import celery
        import django

        import jobbers_celery

        port = args.port
        if not port_is_free(port):
            taken, port = port, free_port()
            notes.append(f"port {taken} is taken: the web server uses {port}")
        notes.append(f"Python {sys.version.split()[0]} ({sys.prefix}), Django "
                     f"{django.get_version()}, Celery {celery.__version__}, jobbers "
                     f"{jobbers_celery.__version__}")
        notes.append(f"project {HERE}; runtime files in {var}")

    with ui.step("Redis") as notes:
        url, _ = start_redis(ui, procs, notes)
        os.environ["REDIS_URL"] = env["REDIS_URL"] = url
        os.environ["EXAMPLE_VAR_DIR"] = str(var)
        os.environ["DJANGO_SETTINGS_MODULE"] = "example.settings"

    with ui.step("Database") as notes:
        import django

        ui.status("loading the Django project")
        django.setup()
        # the project logs at INFO (workers, web server); this terminal shows only problems
        logging.getLogger().setLevel(logging.WARNING)
        migrate(ui, notes)
        password = admin_user(var, notes)
        notes.append(f"log in at http://127.0.0.1:{port}/admin/ as admin / {password}")

    from example.celery import app, jobbers
    from shop import tasks

    with ui.step("Workers, beat and web server") as notes:
        workers = start_services(ui, procs, app, jobbers, port, var, notes)
    timings["setup_s"] = round(time.monotonic() - t0, 2)

    ui.header("Scenario", "  (live: each task's state as jobbers.get(task_id) reads it "
                          "from Redis)")
    sc = Scenario(ui, procs, jobbers, tasks, args.timeout)
    sc.workers = workers
    t_sc = time.monotonic()
    try:
        sc.run()
    finally:
        timings["scenario_s"] = round(time.monotonic() - t_sc, 2)
        report.data["tasks"] = [{
            "label": r.label, "call": r.call, "task_id": r.task_id, "expect": r.expect,
            "state": r.state, "attempt": r.record.attempt if r.record else None,
            "worker": r.record.worker if r.record else None,
            "progress": r.record.progress if r.record else None,
            "transitions": [[t.from_state.value, t.to_state.value, t.reason]
                            for t in r.history],
            "problems": r.problems} for r in sc.rows]
        report.write()

    ui.header("Summary")
    entries, groups = dead_letters_of(sc.rows)
    base = f"http://127.0.0.1:{port}"
    print_summary(ui, sc, entries, groups)
    print_links(ui, base, password, sc, probe_api(base, password))
    ok = not any(r.problems for r in sc.rows)
    report.data["ok"] = ok
    report.data["tasks"] = [{**t, "problems": r.problems}
                            for t, r in zip(report.data["tasks"], sc.rows, strict=True)]
    report.data["dead_letters"] = [{"task_id": e.task_id, "task_name": e.task_name,
                                    "reason": e.reason, "fingerprint": e.fingerprint}
                                   for e in entries]
    report.write()
    ui.out()
    if ok:
        ui.out(ui.paint(f"Every task took its path ({time.monotonic() - t0:.0f} s in all).",
                        "32"))
    else:
        ui.out(ui.paint("Some tasks did not take their expected path: see the ! lines above "
                        f"and the logs in {procs.log_dir}/.", "31"))
    if args.no_serve:
        return 0 if ok else 1
    ui.out()
    ui.out(ui.bold("Serving") + f": the admin ({base}/admin/, admin / {password}), the API, "
           "the workers and beat keep running. Resubmit or discard dead letters in the "
           "admin and watch the workers pick them up. " + ui.bold("Ctrl-C") +
           " stops everything this command started.")
    try:
        while True:
            procs.check_alive()
            time.sleep(1)
    except (KeyboardInterrupt, Stop) as exc:
        why = exc if isinstance(exc, Stop) else "Ctrl-C"
        ui.out(f"\n{why}: stopping everything this command started")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
