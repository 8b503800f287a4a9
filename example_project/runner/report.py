"""What ``run.py`` reports: the ``--report`` JSON file, written as it goes, and the summary
printed at the end (each task's transitions, the dead-letter queue as stored in the
database, its failure groups, links to the admin and the API)."""

from __future__ import annotations

import base64
import json
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.processes import Proc
    from runner.scenario import Row, Scenario
    from runner.ui import UI


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

