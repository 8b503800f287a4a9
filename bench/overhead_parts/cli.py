"""``overhead.py``'s options and ``main``: a private Redis, one warm-up run per app, then
the rounds, each (pool, variant) with fresh processes, the orders rotated from round to
round; the report and the verdict."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from _common import (
    NCPU,
    PrivateRedis,
    Spread,
    common_options,
    exit_code,
    failed,
    ping,
    rotated,
    wait_for,
    write_json,
)

from overhead_parts.figures import Run, estimate_inner_usec
from overhead_parts.report import judge, print_report, print_run, summarise
from overhead_parts.rounds import Bench
from overhead_parts.variants import POOLS, Variant

DESCRIPTION = "What does ``base=JobbersTask`` cost a user, against plain Celery?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=3000, help="tasks per round (default 3000)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (default 4)")
    ap.add_argument("--serial", type=int, default=100,
                    help="tasks run one at a time per round for the latency (default 100)")
    ap.add_argument("--pool", choices=("both", *POOLS), default="both",
                    help="worker pool(s) (default both)")
    ap.add_argument("--concurrency", type=int, default=2, help="prefork pool size (default 2)")
    ap.add_argument("--variants", default="plain,track_started,jobbers,jobbers_folded",
                    help="comma-separated subset (plain is always measured); also "
                         "plain_installed: a plain task in the jobbers app (the old baseline)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 300 tasks x 2 rounds, 20 serial")
    ap.add_argument("--store-mode", choices=("real", "trivial-lua", "noop"), default="real",
                    help="diagnostics for the jobbers variants: trivial-lua sends each step's "
                         "EVALSHA to a script that returns at once; noop makes no jobbers "
                         "Redis call (see bench_app.py); records are not written")
    common_options(ap, json_help="also write every figure as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds, args.serial = 300, 2, 20
    if args.rounds < 1 or args.tasks < 1 or args.serial < 1:
        ap.error("--rounds, --tasks and --serial must be positive")
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    known = ("plain", "track_started", "jobbers", "jobbers_sharded", "jobbers_folded",
             "plain_installed")
    if unknown := [n for n in names if n not in known]:
        ap.error(f"unknown variants {unknown}; choose from {known}")
    args.variant_names = ["plain", *[n for n in known if n in names and n != "plain"]]
    args.pools = list(POOLS) if args.pool == "both" else [args.pool]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    names: list[str] = args.variant_names
    redis_srv = PrivateRedis(args.redis_server)
    work = Path(tempfile.mkdtemp(prefix="jobbers-bench-"))
    runs: list[Run] = []
    try:
        import redis

        stats = redis.Redis(host="127.0.0.1", port=redis_srv.port)
        wait_for(lambda: ping(stats), 10, "redis-server to answer")
        bench = Bench(args, redis_srv, stats, work)
        print(f"private redis-server on port {redis_srv.port} (pid {redis_srv.proc.pid}); "
              f"{NCPU} CPUs; load average {os.getloadavg()[0]:.2f}; pools {args.pools}; "
              f"variants {names}; {args.rounds} rounds x {args.tasks} tasks "
              f"(+{args.serial} serial)", flush=True)
        if args.store_mode != "real":
            print(f"DIAGNOSTIC store mode {args.store_mode!r}: jobbers records are NOT written")
        # warm the file cache and bytecode once; not measured
        for module in ("bench_plain", "bench_app"):
            bench.run(0, args.pools[0], Variant("warmup", module, {}, ""), 100, 1)
        for rnd in range(1, args.rounds + 1):
            # the pool order alternates, the variant order is rotated by one every round
            for pool in rotated(args.pools, rnd - 1):
                for name in rotated(names, rnd - 1):
                    r = bench.run(rnd, pool, bench.variants[name], args.tasks, args.serial)
                    runs.append(r)
                    print_run(r)
        estimate_inner_usec(runs)
        summary = summarise(runs, args.pools, names)
        print_report(summary, names, args)
        met, rows = judge(summary, names)
        print(f"\ntotal wall time {time.monotonic() - started:.0f}s; load average now "
              f"{os.getloadavg()[0]:.2f}")
        settings = {k: v for k, v in vars(args).items()}
        write_json(args.json, {"settings": settings, "summary": summary, "verdict": rows,
                               "runs": [{**asdict(r), "metrics": r.metrics()} for r in runs]},
                   indent="", default=lambda o: asdict(o) if isinstance(o, Spread) else str(o))
        return exit_code(met)
    except RuntimeError as exc:
        return failed(exc)
    finally:
        redis_srv.stop()
        shutil.rmtree(work, ignore_errors=True)
