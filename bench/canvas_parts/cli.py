"""``canvas.py``'s options and ``main``: a private Redis, one warm-up run per variant, then
the rounds, each (canvas, variant) in a fresh client process, the variant order rotated
from round to round; the report and the verdict."""

from __future__ import annotations

import argparse
import os
import time

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

from canvas_parts.client import CANVASES
from canvas_parts.report import TARGET_RATIO, print_report, print_run, summarise
from canvas_parts.rounds import VARIANTS, Bench

METHOD = """\
method: a private redis-server (broker db 0, results db 1, jobbers' store on the broker's
db); per round, per canvas, plain Celery and JobbersTask (order rotated each round), each in
a fresh client process that builds the canvas, then times apply_async() alone (no worker
runs: the messages stay queued, and the queue is checked); chunks and starmap, which publish
in 0.1 s or less, are published 10 and 40 times in that process and timed together. CPU: the client's own
(process_time) and the redis-server's (/proc) over the publish; foreign: the rest of the
machine's share of all CPUs meanwhile. After each jobbers run of a group or chord, every
member's record must exist, 'submitted'. Ratio: jobbers' rate / plain's of the same round."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Enqueue rate of a canvas of N members, plain "
                                             "Celery vs JobbersTask.")
    ap.add_argument("--members", type=int, default=10_000, help="members (default 10000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--canvases", default="group,chunks,starmap,chord",
                    help=f"comma-separated subset of {','.join(CANVASES)}")
    ap.add_argument("--batch", type=int, default=None,
                    help="jobbers_publish_batch for the jobbers client (default: jobbers')")
    ap.add_argument("--cut-bytes", type=int, default=None,
                    help="diagnostics: payload bytes that cut a bulk publish's batch in the "
                         "jobbers client (default: jobbers' CUT_BYTES; 0: by count only)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2000 members x 2 rounds, group and chunks")
    common_options(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.members, args.rounds, args.canvases = 2000, 2, "group,chunks"
    args.canvas_list = [c.strip() for c in args.canvases.split(",") if c.strip()]
    if unknown := [c for c in args.canvas_list if c not in CANVASES]:
        ap.error(f"unknown canvases {unknown}; choose from {CANVASES}")
    if args.rounds < 1 or args.members < 1:
        ap.error("--rounds and --members must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    redis_srv = PrivateRedis(args.redis_server)
    try:
        import redis

        stats = redis.Redis(host="127.0.0.1", port=redis_srv.port)
        wait_for(lambda: ping(stats), 10, "redis-server to answer")
        bench = Bench(redis_srv, stats, args.batch, args.cut_bytes)
        print(METHOD)
        print(f"\nprivate redis-server on port {redis_srv.port}; {NCPU} CPUs; load average "
              f"{os.getloadavg()[0]:.2f}; canvases {args.canvas_list}; {args.rounds} rounds x "
              f"{args.members} members; jobbers_publish_batch "
              f"{'default' if args.batch is None else args.batch}"
              f"{'' if args.cut_bytes is None else f'; cut bytes {args.cut_bytes}'}; target ratio "
              f">= {TARGET_RATIO}", flush=True)
        for variant in VARIANTS:  # the file cache and bytecode warm; not measured
            bench.run(0, "group", variant, 100)
        runs = []
        for rnd in range(1, args.rounds + 1):
            for canvas in args.canvas_list:
                for variant in rotated(list(VARIANTS), rnd - 1):
                    r = bench.run(rnd, canvas, variant, args.members)
                    runs.append(r)
                    print_run(r)
        summary = summarise(runs, args.canvas_list)
        met = print_report(summary)
        print(f"\ntotal wall time {time.monotonic() - started:.0f}s; load average now "
              f"{os.getloadavg()[0]:.2f}")
        write_json(args.json, {"settings": vars(args), "summary": summary,
                               "runs": [vars(r) for r in runs]}, indent="",
                   default=lambda o: vars(o) if isinstance(o, Spread) else str(o))
        return exit_code(met)
    except RuntimeError as exc:
        return failed(exc)
    finally:
        redis_srv.stop()
