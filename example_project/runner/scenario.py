"""The scenario ``run.py`` plays: the tasks it submits (one row each, with the state it must
end in), what it does to them while they run (cancel, SIGTERM, SIGKILL, a new worker), the
live table, and the check that every task took its path."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.errors import Failed
from runner.processes import Proc, Processes, group_pids, kill_group, send_signal
from runner.ui import UI

TERMINAL = ("completed", "failed", "cancelled", "stalled", "dropped")
MAIN, LONG_A, IMPORTS_B, LONG_C = ("main@example", "long-a@example", "imports-b@example",
                                   "long-c@example")
#: A long task's worker is stopped (SIGTERM) or killed (SIGKILL) once this many chunks
#: are checkpointed.
ACT_AT_CHUNK = 3


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
            "max_heartbeat_interval=2 s the cleaner declares it stalled, into the DLQ; "
            "its worker ends it, freeing the slot",
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
            send_signal(proc.pid, signal.SIGTERM)
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
            kill_group(proc.pid)
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

