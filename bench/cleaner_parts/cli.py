"""The cleaner benchmark's options and ``main``: one layout in this process, or two
(``--compare-shards``) each in its own, or one layout driven by the parent (``--child``)."""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

from _common import PrivateRedis, common_options, exit_code, failed, write_json

from cleaner_parts.layouts import child_main, compare_layouts
from cleaner_parts.report import print_comparison, print_report
from cleaner_parts.run import Bench, shut_down

DESCRIPTION = ("How long does one cleaner pass take over a large store, and what does a "
               "record cost in Redis?")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000,
                    help="tracked records in all, running included (default 1,000,000)")
    ap.add_argument("--running", type=int, default=100_000,
                    help="of which started (default 100,000)")
    ap.add_argument("--stalled", type=int, default=1000,
                    help="stalled tasks per measured pass (default 1,000; a pass judges at "
                         "most PASS_LIMIT = 1,000 in all)")
    ap.add_argument("--workers", type=int, default=20, help="live worker incarnations (20)")
    ap.add_argument("--passes", type=int, default=20, help="passes with none stalled (20)")
    ap.add_argument("--reps", type=int, default=5,
                    help="passes per stalled variant, each with fresh stalled tasks (5)")
    ap.add_argument("--lost-after", type=float, default=60.0,
                    help="jobbers_worker_lost_after (default 60, the library default)")
    ap.add_argument("--batch", type=int, default=1000, help="records per loader call (1000)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 100,000 records, 10,000 running, 1,000 stalled, "
                         "10 passes, 2 per variant")
    ap.add_argument("--what-if", type=int, default=0, metavar="N",
                    help="also measure memory per completed record without the all index, "
                         "without all and name:*, and with a 50-character worker hostname "
                         "(N records each, own database; e.g. 100000)")
    ap.add_argument("--shards", type=int, default=None, metavar="N",
                    help="jobbers_store_shards of the bench app (default: unset: the "
                         "library's default for a new dataset on one Redis server)")
    ap.add_argument("--compare-shards", metavar="A,B", default=None,
                    help="run the whole benchmark for both layouts (e.g. 1,16), each in its "
                         "own process with its own redis-server, the measured passes "
                         "interleaved, and print them side by side with the ratios B/A")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    common_options(ap)
    ap.add_argument("--seed", type=int, default=None, help="random seed (times, sampling)")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.running, args.stalled = 100_000, 10_000, 1000
        args.passes, args.reps = 10, 2
    if not 0 < args.running < args.records:
        ap.error("--running must be between 0 and --records")
    if not 0 < args.stalled <= min(1000, args.running // 4):
        ap.error("--stalled must be 1 .. min(1000, running/4)")
    if args.workers < 1 or args.passes < 1 or args.reps < 1 or args.batch < 1:
        ap.error("--workers, --passes, --reps and --batch must be positive")
    from jobbers_celery.core.config import MAX_SHARDS

    if args.shards is not None and not 1 <= args.shards <= MAX_SHARDS:
        ap.error(f"--shards must be 1 .. {MAX_SHARDS}")
    args.compare = None
    if args.compare_shards is not None:
        try:
            layouts = tuple(int(x) for x in args.compare_shards.split(","))
        except ValueError:
            layouts = ()
        if (len(layouts) != 2 or layouts[0] == layouts[1]
                or not all(1 <= n <= MAX_SHARDS for n in layouts)):
            ap.error(f"--compare-shards takes two different shard counts 1 .. {MAX_SHARDS}, "
                     "e.g. 1,16")
        if args.shards is not None:
            ap.error("--compare-shards sets the layouts: no --shards with it")
        args.compare = layouts
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    random.seed(args.seed)
    # the cleaner's per-pass warning ("1000 stalled task(s)") is expected here; errors still show
    logging.getLogger("jobbers.cleaner").setLevel(logging.ERROR)
    if args.child:
        return child_main(args)
    started = time.monotonic()
    if args.compare:
        try:
            results = compare_layouts(args)
        except RuntimeError as exc:
            return failed(exc)
        ok = True
        for n in args.compare:
            ok = print_report(results[n], args) and ok
        ok_cmp, cmp = print_comparison(results, args)
        print(f"  total wall time {time.monotonic() - started:.1f}s")
        write_json(args.json, {"layouts": {str(n): r for n, r in results.items()},
                               "comparison": cmp})
        return exit_code(ok and ok_cmp)
    srv = PrivateRedis(args.redis_server)
    bench: Bench | None = None
    try:
        bench = Bench(args, srv)
        res: dict[str, Any] = bench.run()
        ok = print_report(res, args)
        print(f"  total wall time {time.monotonic() - started:.1f}s")
        write_json(args.json, res)
        return exit_code(ok)
    except RuntimeError as exc:
        return failed(exc)
    finally:
        shut_down(bench, srv)
