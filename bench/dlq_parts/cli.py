"""The DLQ benchmark's options and ``main``: the private Redis, the database (reused or
loaded), Django in this process, then the phases in order and the report."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from _common import PrivateRedis, code_version, common_options, exit_code, failed, write_json

from dlq_parts.charts import charts_phase
from dlq_parts.data import INCIDENT_RANK, STOPPED_RANKS, task_names
from dlq_parts.database import (
    PG,
    PROTECTED,
    data_summary,
    drop_database,
    groups_consistent,
    loaded_meta,
    recreate_database,
)
from dlq_parts.load import LOADER_VERSION, load
from dlq_parts.measure import Session
from dlq_parts.reads import admin_entries_phase, groups_phase, list_phase
from dlq_parts.report import print_charts_only, report
from dlq_parts.resubmit import Resubmits, restore

DESCRIPTION = "The Django dead-letter queue at scale: 1,000,000 entries in PostgreSQL."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1_000_000, help="DLQ entries (1,000,000)")
    ap.add_argument("--db", default=None,
                    help="database name (jobbers_bench; jobbers_bench_quick with --quick)")
    ap.add_argument("--reload", action="store_true",
                    help="drop the database and load it again even if it matches")
    ap.add_argument("--drop", action="store_true", help="drop the database at the end")
    ap.add_argument("--list-requests", type=int, default=300,
                    help="timed requests per list case (300)")
    ap.add_argument("--group-requests", type=int, default=100,
                    help="timed requests of the groups page (100)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="resubmit runs per selection kind, each on fresh dead entries (5)")
    ap.add_argument("--batch", type=int, default=1000, help="entries per resubmit (1000)")
    ap.add_argument("--profile", metavar="DIR",
                    help="also run one resubmit under cProfile; DIR/resubmit.prof")
    ap.add_argument("--quick", action="store_true",
                    help="100,000 entries (own database), fewer requests, 2 rounds")
    ap.add_argument("--only", choices=("all", "charts"), default="all",
                    help="charts: only the groups page and the admin's charts (no list, "
                    "no resubmits)")
    common_options(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.entries = min(args.entries, 100_000)
        args.list_requests, args.group_requests, args.rounds = 100, 30, 2
    args.db = args.db or ("jobbers_bench_quick" if args.quick else "jobbers_bench")
    if args.db in PROTECTED:
        ap.error(f"--db {args.db}: that database is not the benchmark's")
    if not 1 <= args.batch <= 1000:
        ap.error("--batch must be 1 .. 1000 (the API's limit)")
    if args.entries < 50_000 or args.rounds < 1:
        ap.error("--entries must be at least 50,000 and --rounds at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    srv = PrivateRedis(args.redis_server)
    os.environ["BENCH_REDIS_URL"] = srv.url
    os.environ["BENCH_DLQ_DB"] = args.db
    os.environ["DJANGO_SETTINGS_MODULE"] = "dlq_settings"
    bench: Session | None = None
    res: dict[str, Any] = {}
    try:
        print(f"private redis-server on port {srv.port}; PostgreSQL database {args.db!r} on "
              f"{PG['host']}:{PG['port']}; {os.cpu_count()} CPUs", flush=True)
        meta = None if args.reload else loaded_meta(args.db)
        reuse = (meta is not None and meta.get("loader_version") == str(LOADER_VERSION)
                 and meta.get("entries") == str(args.entries)
                 and meta.get("rows_now") == str(args.entries)
                 and not meta.get("stale_migrations"))
        if not reuse:
            why = ("--reload" if args.reload else "no complete earlier load" if meta is None
                   else f"earlier load does not match ({meta})")
            print(f"(re)creating {args.db} ({why})", flush=True)
            recreate_database(args.db)
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        if reuse:
            print(f"reusing the load of {meta['loaded_at']} ({int(meta['entries']):,} entries, "
                  f"loaded in {meta['load_seconds']} s; --reload to load again)", flush=True)
            res["load"] = {"reused": True, **meta}
        else:
            print(f"loading {args.entries:,} entries ...", flush=True)
            t0 = time.monotonic()
            res["load"] = {"reused": False, **load(args.entries)}
            res["load"]["total_s"] = time.monotonic() - t0
            print(f"  loaded in {res['load']['total_s']:.1f} s", flush=True)
        res["code"] = code_version()
        print(f"code: {res['code']}")
        res["data"] = data = data_summary()
        per = data["per_name"]
        names = task_names()
        count = {p[0]: p[1] for p in per}
        cases = {"popular": names[0], "rare": per[-1][0], "incident": names[INCIDENT_RANK],
                 "stopped": names[STOPPED_RANKS[0]]}
        bench = Session(args, srv)
        bench.res.update(res)
        res = bench.res
        print("list endpoint, newest first, page of 50 ("
              + "; ".join(f"{k} {v}: {count.get(v, 0):,} entries" for k, v in cases.items())
              + ") ...", flush=True)
        target = cases["incident"]  # resubmitted by filter: everything of the fixed task
        if args.only == "charts":
            print("groups page ...", flush=True)
            groups_phase(bench)
            print("charts ...", flush=True)
            charts_phase(bench)
            print_charts_only(bench.res, args)
            return 0
        list_phase(bench, cases)
        print("groups page ...", flush=True)
        groups_phase(bench)
        print("charts ...", flush=True)
        charts_phase(bench)
        admin_entries_phase(bench, cases)
        print(f"bulk resubmit, {args.rounds} runs per selection kind (filter: task_name="
              f"{target}) ...", flush=True)
        Resubmits(bench).resubmit_phase(target)
        res["groups_inconsistent_after_resubmits"] = groups_consistent()
        restore(bench)
        bench.touched = []
        res["groups_inconsistent_after_restore"] = groups_consistent()
        res["other_load"] = bench.load.share
        res["other_load_phases"] = {k: bench.load.phase_share(k)
                                    for k in ("list", "groups", "resubmit")}
        ok = report(res, args)
        print(f"  total wall time {time.monotonic() - started:.1f} s")
        write_json(args.json, res)
        return exit_code(ok)
    except RuntimeError as exc:
        return failed(exc)
    finally:
        if bench is not None:
            with contextlib.suppress(Exception):
                restore(bench)
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if args.drop:
            drop_database(args.db)
        srv.stop()
