"""``overhead.py``'s report: one table per pool (every figure as median [min-max] per
variant, the ratios to plain, Redis commands by name), the summary table, the verdict
against jobbers' cost targets, and the sharded layout against one shard."""

from __future__ import annotations

import argparse
from typing import Any

from _common import Spread, banner, verdict

from overhead_parts.figures import Run

#: Issue 12, point 2: JobbersTask against plain Celery.
TARGET_THROUGHPUT = 0.90
TARGET_CPU = 1.15
TARGET_REDIS = 2.5
#: Issue 16: the sharded layout no worse than the one-tag layout by more than 5 %.
LAYOUT_SLACK = 0.05


def print_run(r: Run) -> None:
    m = r.metrics()
    print(f"  r{r.round} {r.pool:<7} {r.variant:<14} {m['throughput']:6.0f} tasks/s "
          f"enqueue {m['enqueue_rate']:6.0f}/s | CPU ms/task all {m['cpu_all_ms']:5.2f} "
          f"(client {m['cpu_client_ms']:4.2f} worker {m['cpu_worker_ms']:4.2f} "
          f"redis {m['cpu_redis_us'] / 1000:4.2f}) | cmds {m['redis_commands']:5.1f} "
          f"{m['redis_cmd_us']:4.0f} us "
          f"req {m['redis_requests']:5.2f} | serial {m['latency_ms']:5.2f} ms | "
          f"foreign {100 * m['foreign']:3.0f}% {r.lifecycle}", flush=True)


ROWS: tuple[tuple[str, str, str], ...] = (
    # (metric, label, format)
    ("throughput", "throughput (tasks/s)", ".0f"),
    ("enqueue_rate", "enqueue rate (tasks/s)", ".0f"),
    ("cpu_all_ms", "CPU all processes (ms/task)", ".3f"),
    ("cpu_client_ms", "  client (ms/task)", ".3f"),
    ("cpu_client_publish_ms", "    of it publishing", ".3f"),
    ("cpu_worker_ms", "  worker (ms/task)", ".3f"),
    ("cpu_worker_main_ms", "    main process", ".3f"),
    ("cpu_worker_children_ms", "    pool children", ".3f"),
    ("cpu_redis_us", "  redis-server (us/task)", ".0f"),
    ("redis_cmd_us", "Redis command time (us/task)", ".0f"),
    ("redis_script_us", "  of it in scripts", ".0f"),
    ("redis_commands", "Redis commands/task", ".2f"),
    ("redis_script_calls", "  EVALSHA calls/task", ".2f"),
    ("redis_requests", "Redis requests/task", ".2f"),
    ("redis_requests_publish", "  client, publishing", ".2f"),
    ("redis_requests_client", "  client, all", ".2f"),
    ("redis_requests_worker_main", "  worker main process", ".2f"),
    ("redis_requests_worker_children", "  pool children", ".2f"),
    ("latency_ms", "serial round trip (ms, median)", ".2f"),
    ("foreign", "foreign CPU (share of machine)", ".2f"),
    ("busy", "machine busy (share)", ".2f"),
)
RATIO_ROWS = ("throughput", "enqueue_rate", "cpu_all_ms", "cpu_client_ms", "cpu_worker_ms",
              "cpu_redis_us", "redis_cmd_us", "redis_commands", "redis_requests", "latency_ms")


def summarise(runs: list[Run], pools: list[str], names: list[str]) -> dict[str, Any]:
    """Per pool and variant: median/min/max of every metric; ratios to plain."""
    out: dict[str, Any] = {}
    for pool in pools:
        per: dict[str, dict[str, Spread]] = {}
        by_round: dict[str, dict[int, dict[str, float]]] = {}
        for name in names:
            mine = [r for r in runs if r.pool == pool and r.variant == name]
            ms = [r.metrics() for r in mine]
            per[name] = {k: Spread.of([m[k] for m in ms]) for k in ms[0]}
            by_round[name] = {r.round: m for r, m in zip(mine, ms, strict=True)}
        ratios: dict[str, dict[str, Spread]] = {}
        for name in names:
            if name == "plain":
                continue
            ratios[name] = {}
            for k in RATIO_ROWS:
                base = per["plain"][k].median
                paired = [m[k] / by_round["plain"][rnd][k]
                          for rnd, m in by_round[name].items()
                          if by_round["plain"].get(rnd, {}).get(k)]
                ratios[name][k] = Spread(per[name][k].median / base if base else 0.0,
                                       min(paired, default=0.0), max(paired, default=0.0))
        commands: dict[str, dict[str, float]] = {}
        for name in names:
            mine = [r for r in runs if r.pool == pool and r.variant == name]
            total: dict[str, int] = {}
            for r in mine:
                for c, n in r.commands.items():
                    total[c] = total.get(c, 0) + n
            tasks = sum(r.tasks for r in mine)
            commands[name] = {c: n / tasks for c, n in sorted(total.items())}
        out[pool] = {"stats": per, "ratios": ratios, "commands": commands}
    return out


def print_report(summary: dict[str, Any], names: list[str], args: argparse.Namespace) -> None:
    width = 30 + 24 * len(names)
    for pool, data in summary.items():
        per, ratios = data["stats"], data["ratios"]
        pool_desc = f"prefork -c {args.concurrency}" if pool == "prefork" else pool
        banner(width, f"{pool_desc}: {args.rounds} rounds x {args.tasks} tasks, median [min-max]")
        print(f"{'':<30}" + "".join(f"{n:>24}" for n in names))
        for key, label, fmt in ROWS:
            print(f"{label:<30}" + "".join(f"{per[n][key].cell(fmt):>24}" for n in names))
        print("-" * width)
        print(f"{'ratio to plain (paired min-max)':<30}" + f"{'':>24}"
              + "".join(f"{n:>24}" for n in names if n != "plain"))
        for key, label, _fmt in ROWS:
            if key in RATIO_ROWS:
                print(f"{label:<30}" + f"{'':>24}" + "".join(
                    f"{ratios[n][key].cell('.2f'):>24}" for n in names if n != "plain"))
        print("-" * width)
        print("Redis commands per task by name (all processes; commands run by scripts "
              "are counted too):")
        for n in names:
            cmds = data["commands"][n]
            line = ", ".join(f"{c} {v:.2f}" for c, v in sorted(cmds.items(),
                                                               key=lambda x: -x[1]) if v >= 0.005)
            print(f"  {n}: {line}")


def judge(summary: dict[str, Any], names: list[str]) -> tuple[bool, list[dict[str, Any]]]:
    rows = []
    met_all = True
    print()
    print("| pool | variant | throughput vs plain | all-process CPU/task vs plain | "
          "Redis command time/task vs plain | redis-server CPU/task vs plain | "
          "serial latency vs plain | enqueue rate vs plain | foreign CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for pool, data in summary.items():
        for n in names:
            if n == "plain":
                continue
            r = data["ratios"][n]
            foreign = data["stats"][n]["foreign"]
            print(f"| {pool} | {n} | {r['throughput'].cell('.2f')} | "
                  f"{r['cpu_all_ms'].cell('.2f')} | {r['redis_cmd_us'].cell('.2f')} | "
                  f"{r['cpu_redis_us'].cell('.2f')} | "
                  f"{r['latency_ms'].cell('.2f')} | {r['enqueue_rate'].cell('.2f')} | "
                  f"{100 * foreign.lo:.0f}-{100 * foreign.hi:.0f} % |")
            if n.startswith("jobbers"):
                checks = {
                    "throughput": r["throughput"].median >= TARGET_THROUGHPUT,
                    "cpu": r["cpu_all_ms"].median <= TARGET_CPU,
                    "redis": r["redis_cmd_us"].median <= TARGET_REDIS,
                    "redis_cpu": r["cpu_redis_us"].median <= TARGET_REDIS,
                }
                met_all = met_all and checks["throughput"] and checks["cpu"] and checks["redis"]
                rows.append({"pool": pool, "variant": n, "checks": checks,
                             "throughput_ratio": r["throughput"].median,
                             "cpu_ratio": r["cpu_all_ms"].median,
                             "redis_ratio": r["redis_cmd_us"].median,
                             "redis_cpu_ratio": r["cpu_redis_us"].median})
    print()
    print(f"Targets: throughput >= {TARGET_THROUGHPUT:.2f} x plain, "
          f"all-process CPU/task <= {TARGET_CPU:.2f} x plain, Redis server time/task "
          f"<= {TARGET_REDIS:.1f} x plain (judged on the command time of INFO commandstats; "
          "the redis-server CPU, I/O included, is shown too)")
    for row in rows:
        c = row["checks"]
        print(f"  {row['pool']:<8} {row['variant']:<15} throughput {row['throughput_ratio']:.2f} "
              f"{verdict(c['throughput'])}; CPU {row['cpu_ratio']:.2f} "
              f"{verdict(c['cpu'])}; Redis command time "
              f"{row['redis_ratio']:.2f} {verdict(c['redis'])} "
              f"(redis-server CPU {row['redis_cpu_ratio']:.2f})")
    if "jobbers_sharded" in names and "jobbers" in names:
        layout_ratios(summary)
    return met_all, rows


def layout_ratios(summary: dict[str, Any]) -> None:
    """The sharded layout (``jobbers_sharded``, 16 shards) against the one-tag layout
    (``jobbers``, one shard), same run: ratio of the medians over the rounds."""
    print()
    print(f"Sharded (16) vs one-shard layout, same run (target: throughput >= "
          f"{1 - LAYOUT_SLACK:.2f}, CPU and Redis time <= {1 + LAYOUT_SLACK:.2f}):")
    for pool, data in summary.items():
        per = data["stats"]
        cells = []
        for key, label, higher_is_better in (("throughput", "throughput", True),
                                             ("cpu_all_ms", "all-process CPU/task", False),
                                             ("cpu_redis_us", "redis-server CPU/task", False),
                                             ("redis_cmd_us", "Redis command time/task", False)):
            ratio = per["jobbers_sharded"][key].median / per["jobbers"][key].median
            ok = ratio >= 1 - LAYOUT_SLACK if higher_is_better else ratio <= 1 + LAYOUT_SLACK
            cells.append(f"{label} {ratio:.3f} {verdict(ok)}")
        print(f"  {pool:<8} " + "; ".join(cells))
