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
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# the parts of this command, by purpose (example_project/runner/): after sys.path
from runner.errors import Failed, SetupError, Stop
from runner.processes import Proc, Processes, free_port, port_is_free
from runner.report import Report, dead_letters_of, print_links, print_summary, probe_api
from runner.scenario import Scenario
from runner.setup_steps import admin_user, migrate, start_redis, start_services
from runner.ui import UI


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
