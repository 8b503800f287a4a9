#!/usr/bin/env python
"""What does ``base=JobbersTask`` cost a user, against plain Celery?

One run measures, on a private ``redis-server`` (Redis broker on db 0, result backend on
db 1), a no-op task in four variants:

- ``plain``: plain Celery in an app **without** jobbers (``bench_plain.py``);
- ``track_started``: the same with ``task_track_started=True``;
- ``jobbers``: ``base=JobbersTask`` with jobbers' defaults (its records on the broker's db 0,
  Celery's results on db 1: jobbers' ``completed`` and Celery's result are two writes);
- ``jobbers_folded``: ``jobbers_redis_url`` on the result db, so ``completed`` carries
  Celery's result write (one script call instead of Celery's GET + MULTI/EXEC);
- ``jobbers_sharded`` (on request, ``--variants``): ``jobbers`` with
  ``jobbers_store_shards=16``, the sharded layout (a cluster's default) on this one server,
  to compare it with the one-tag layout (``jobbers``: one shard, the default on one server)
  in the same run;

on a prefork ``-c 2`` worker and on a solo worker (``--pool``). Every round starts, for each
(pool, variant) in turn (order rotated from round to round), a fresh worker and a fresh
client process; the client publishes N tasks with ``.delay()`` in a loop, then ``.get()``s
every result. Measured per round: throughput from the first publish to the last result the
client received, the client's enqueue rate, CPU per task of every process (client, worker
main process, pool children including reaped ones, redis-server) from ``/proc``, Redis
commands and script time per task (``INFO commandstats`` deltas), Redis requests per task
(counted in redis-py in every process), the CPU used by other processes on the machine
(foreign CPU), then the serial round-trip latency (one task at a time). Prints medians with
min-max over the rounds, the ratios to ``plain`` and a verdict against jobbers' cost targets.

    .venv/bin/python bench/overhead.py             # 3000 tasks x 4 rounds, both pools (~7 min)
    .venv/bin/python bench/overhead.py --quick     # smoke run (~1.5 min)
    .venv/bin/python bench/overhead.py --pool solo --rounds 6 --json out.json

Exit code 0 if every target is met, 2 if one is missed, 1 if the benchmark failed.
See bench/README.md for the method and how to read the output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (  # bench/ is on sys.path (the script's directory)
    BENCH_DIR,
    NCPU,
    PrivateRedis,
    Spread,
    Worker,
    child_pids,
    commandstats,
    machine_busy,
    ping,
    proc_cpu,
    subprocess_env,
    verdict,
    wait_for,
)

#: Commands only this script sends; left out of the totals.
OWN_COMMANDS = frozenset({"info", "flushall", "ping"})
EVAL_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
POOLS = ("prefork", "solo")
#: Issue 12, point 2: JobbersTask against plain Celery.
TARGET_THROUGHPUT = 0.90
TARGET_CPU = 1.15
TARGET_REDIS = 2.5


@dataclass(frozen=True)
class Variant:
    name: str
    module: str
    env: dict[str, str]
    what: str


def variants(result_url: str) -> dict[str, Variant]:
    return {v.name: v for v in (
        Variant("plain", "bench_plain", {}, "plain Celery, no jobbers in the app"),
        Variant("track_started", "bench_plain", {"BENCH_TRACK_STARTED": "1"},
                "plain Celery, task_track_started=True"),
        Variant("jobbers", "bench_app", {},
                "JobbersTask, defaults (jobbers on db 0, results on db 1; one shard)"),
        Variant("jobbers_sharded", "bench_app",
                {"BENCH_SHARDS": "16", "BENCH_KEY_PREFIX": "jb16"},
                "JobbersTask, jobbers_store_shards=16 (the sharded layout on one server)"),
        Variant("jobbers_folded", "bench_app", {"BENCH_JOBBERS_URL": result_url},
                "JobbersTask, jobbers_redis_url on the result db (write folded)"),
        Variant("plain_installed", "bench_app", {"BENCH_PLAIN_TASK": "1"},
                "a plain task in an app with jobbers installed (the old baseline)"),
    )}


#: Issue 16: the sharded layout no worse than the one-tag layout by more than 5 %.
LAYOUT_SLACK = 0.05


# =========================================================================== measurements
def read_worker_round_trips(directory: Path) -> dict[int, tuple[str, int]]:
    out = {}
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["pid"])] = (str(data["role"]), int(data["round_trips"]))
    return out


# =========================================================================== one round
class Client:
    """``overhead_client.py``: a fresh process per round, driven line by line."""

    def __init__(self, module: str, tasks: int, serial: int, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / "overhead_client.py"), module, str(tasks),
             str(serial)],
            cwd=BENCH_DIR, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, start_new_session=True)
        self.pid = self.proc.pid

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client exited ({self.proc.wait()})")
        return dict(json.loads(line))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@dataclass
class Snapshot:
    t: float
    worker_main: float
    worker_reaped: float
    children: dict[int, float]
    redis: float
    own: float
    machine: float
    stats: dict[str, tuple[int, int]]
    worker_rt: dict[int, tuple[str, int]] = field(default_factory=dict)


@dataclass
class Run:
    """One (pool, variant) in one round; CPU in seconds, counts in totals."""

    round: int
    pool: str
    variant: str
    tasks: int
    elapsed: float
    publish_s: float
    wall: float
    client_cpu: float
    client_cpu_publish: float
    worker_main_cpu: float
    worker_children_cpu: float
    redis_cpu: float
    own_cpu: float
    machine_cpu: float
    commands: dict[str, int]
    usec: dict[str, int]
    rt_client: int
    rt_client_publish: int
    rt_worker_main: int
    rt_worker_children: int
    latencies: list[float]
    lifecycle: str
    #: usec of the commands scripts ran (estimated, see ``estimate_inner_usec``)
    inner_usec: float = 0.0

    def per_task(self, value: float) -> float:
        return value / self.tasks

    def metrics(self) -> dict[str, float]:
        n = self.tasks
        worker = self.worker_main_cpu + self.worker_children_cpu
        total = worker + self.client_cpu + self.redis_cpu
        ours = total + self.own_cpu
        evals = sum(c for k, c in self.commands.items() if k in EVAL_COMMANDS)
        eval_usec = sum(u for k, u in self.usec.items() if k in EVAL_COMMANDS)
        return {
            "throughput": n / self.elapsed,
            "enqueue_rate": n / self.publish_s,
            "cpu_all_ms": 1000 * total / n,
            "cpu_client_ms": 1000 * self.client_cpu / n,
            "cpu_client_publish_ms": 1000 * self.client_cpu_publish / n,
            "cpu_worker_ms": 1000 * worker / n,
            "cpu_worker_main_ms": 1000 * self.worker_main_cpu / n,
            "cpu_worker_children_ms": 1000 * self.worker_children_cpu / n,
            "cpu_redis_us": 1e6 * self.redis_cpu / n,
            "redis_commands": sum(self.commands.values()) / n,
            "redis_script_calls": evals / n,
            "redis_script_us": eval_usec / n,
            "redis_cmd_us": (sum(self.usec.values()) - self.inner_usec) / n,
            "redis_requests": (self.rt_client + self.rt_worker_main
                               + self.rt_worker_children) / n,
            "redis_requests_client": self.rt_client / n,
            "redis_requests_publish": self.rt_client_publish / n,
            "redis_requests_worker_main": self.rt_worker_main / n,
            "redis_requests_worker_children": self.rt_worker_children / n,
            "latency_ms": 1000 * statistics.median(self.latencies) if self.latencies else 0.0,
            "busy": self.machine_cpu / (self.wall * NCPU),
            "foreign": max(0.0, self.machine_cpu - ours) / (self.wall * NCPU),
        }


class Bench:
    def __init__(self, args: argparse.Namespace, redis_srv: PrivateRedis, stats: Any,
                 work: Path) -> None:
        self.args = args
        self.redis = redis_srv
        self.stats = stats
        self.work = work
        self.broker_url = f"redis://127.0.0.1:{redis_srv.port}/0"
        self.result_url = f"redis://127.0.0.1:{redis_srv.port}/1"
        self.variants = variants(self.result_url)
        self.base_env = subprocess_env(
            BENCH_BROKER_URL=self.broker_url, BENCH_RESULT_URL=self.result_url,
            BENCH_STORE_MODE=args.store_mode)
        self.seq = 0

    def snapshot(self, worker: Worker) -> Snapshot:
        t = time.perf_counter()
        main, reaped = proc_cpu(worker.pid)
        children = {pid: proc_cpu(pid)[0] for pid in child_pids(worker.pid)}
        own = os.times()
        return Snapshot(t=t, worker_main=main, worker_reaped=reaped, children=children,
                        redis=proc_cpu(self.redis.proc.pid)[0], own=own.user + own.system,
                        machine=machine_busy(), stats=commandstats(self.stats))

    def run(self, rnd: int, pool: str, variant: Variant, tasks: int, serial: int) -> Run:
        self.seq += 1
        tag = f"{self.seq:03d}-{pool}-{variant.name}"
        count_dir = self.work / f"rt-{tag}"
        count_dir.mkdir()
        ready = self.work / f"ready-{tag}"
        env = {**self.base_env, **variant.env, "BENCH_COUNT_DIR": str(count_dir),
               "BENCH_READY_FILE": str(ready)}
        self.stats.flushall()  # every round starts from empty databases
        worker = Worker(variant.module, pool, self.args.concurrency, env,
                        self.work / f"worker-{tag}.log", ready)
        client_env = {k: v for k, v in env.items() if k != "BENCH_COUNT_DIR"}
        client = Client(variant.module, tasks, serial, client_env)
        try:
            worker.wait_ready()
            client.read()  # imported, connected nothing yet
            time.sleep(0.3)  # settle; the workers' request counts are fresh
            a = self.snapshot(worker)
            a.worker_rt = read_worker_round_trips(count_dir)
            client.send("go")
            res = client.read()
            b = self.snapshot(worker)
            worker.check_alive()
            time.sleep(0.3)  # every worker process writes its count once more
            b.worker_rt = read_worker_round_trips(count_dir)
            client.send("serial")
            tail = client.read()
        finally:
            client.stop()
            worker.stop()
        children = sum(cpu - a.children.get(pid, 0.0) for pid, cpu in b.children.items())
        rt_main = rt_children = 0
        for pid, (role, count) in b.worker_rt.items():
            delta = count - a.worker_rt.get(pid, (role, 0))[1]
            if role == "worker-main":
                rt_main += delta
            else:
                rt_children += delta
        calls: dict[str, int] = {}
        usec: dict[str, int] = {}
        for cmd, (c, u) in b.stats.items():
            c0, u0 = a.stats.get(cmd, (0, 0))
            if cmd not in OWN_COMMANDS and c > c0:
                calls[cmd], usec[cmd] = c - c0, u - u0
        lifecycle = "-"
        if "counts" in tail and self.args.store_mode != "real":
            lifecycle = "not checked (store mode)"
        elif "counts" in tail:
            expected = tasks + serial
            done = int(tail["counts"].get("completed", 0))
            others = {k: v for k, v in tail["counts"].items() if k != "completed"}
            ok = done == expected and not others and not tail["refused"]
            lifecycle = "ok" if ok else (f"FAILED: {done}/{expected} completed, others "
                                         f"{others}, refused {tail['refused']}")
            if not ok:
                raise RuntimeError(f"{tag}: lifecycle check {lifecycle}")
        return Run(
            round=rnd, pool=pool, variant=variant.name, tasks=tasks,
            elapsed=float(res["elapsed"]), publish_s=float(res["publish_s"]), wall=b.t - a.t,
            client_cpu=float(res["cpu"]), client_cpu_publish=float(res["cpu_publish"]),
            worker_main_cpu=b.worker_main - a.worker_main,
            worker_children_cpu=children + (b.worker_reaped - a.worker_reaped),
            redis_cpu=b.redis - a.redis, own_cpu=b.own - a.own,
            machine_cpu=b.machine - a.machine, commands=calls, usec=usec,
            rt_client=int(res["round_trips"]), rt_client_publish=int(res["round_trips_publish"]),
            rt_worker_main=rt_main, rt_worker_children=rt_children,
            latencies=[float(x) for x in tail["latencies"]], lifecycle=lifecycle,
        )


def estimate_inner_usec(runs: list[Run]) -> None:
    """Set ``inner_usec`` of every run that called scripts.

    ``INFO commandstats`` counts a command a Lua script runs under its own name **and** in
    the script's EVALSHA ``usec``: summing every row counts script work twice. The commands
    a script ran are estimated per name as the calls above those of ``plain`` in the same
    round and pool (Celery's and kombu's own commands are the same in every variant), at
    that command's mean ``usec`` in this run.
    """
    plain = {(r.round, r.pool): r for r in runs if r.variant == "plain"}
    for r in runs:
        base = plain.get((r.round, r.pool))
        if base is None or not any(k in EVAL_COMMANDS for k in r.commands):
            continue
        inner = 0.0
        for cmd, calls in r.commands.items():
            if cmd in EVAL_COMMANDS:
                continue
            extra = calls - base.commands.get(cmd, 0) * r.tasks / base.tasks
            if extra > 0:
                inner += extra * r.usec[cmd] / calls
        r.inner_usec = inner


def print_run(r: Run) -> None:
    m = r.metrics()
    print(f"  r{r.round} {r.pool:<7} {r.variant:<14} {m['throughput']:6.0f} tasks/s "
          f"enqueue {m['enqueue_rate']:6.0f}/s | CPU ms/task all {m['cpu_all_ms']:5.2f} "
          f"(client {m['cpu_client_ms']:4.2f} worker {m['cpu_worker_ms']:4.2f} "
          f"redis {m['cpu_redis_us'] / 1000:4.2f}) | cmds {m['redis_commands']:5.1f} "
          f"{m['redis_cmd_us']:4.0f} us "
          f"req {m['redis_requests']:5.2f} | serial {m['latency_ms']:5.2f} ms | "
          f"foreign {100 * m['foreign']:3.0f}% {r.lifecycle}", flush=True)


# =========================================================================== report
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
        print()
        print("=" * width)
        print(f"{pool_desc}: {args.rounds} rounds x {args.tasks} tasks, median [min-max]")
        print("=" * width)
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


# =========================================================================== main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
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
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    ap.add_argument("--store-mode", choices=("real", "trivial-lua", "noop"), default="real",
                    help="diagnostics for the jobbers variants: trivial-lua sends each step's "
                         "EVALSHA to a script that returns at once; noop makes no jobbers "
                         "Redis call (see bench_app.py); records are not written")
    ap.add_argument("--redis-server", default="redis-server", help="redis-server binary")
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
            pools = args.pools if rnd % 2 else args.pools[::-1]
            for pool in pools:
                shift = (rnd - 1) % len(names)
                for name in names[shift:] + names[:shift]:
                    r = bench.run(rnd, pool, bench.variants[name], args.tasks, args.serial)
                    runs.append(r)
                    print_run(r)
        estimate_inner_usec(runs)
        summary = summarise(runs, args.pools, names)
        print_report(summary, names, args)
        met, rows = judge(summary, names)
        print(f"\ntotal wall time {time.monotonic() - started:.0f}s; load average now "
              f"{os.getloadavg()[0]:.2f}")
        if args.json:
            settings = {k: v for k, v in vars(args).items()}
            Path(args.json).write_text(json.dumps(
                {"settings": settings, "summary": summary, "verdict": rows,
                 "runs": [{**asdict(r), "metrics": r.metrics()} for r in runs]},
                indent=2, default=lambda o: asdict(o) if isinstance(o, Spread) else str(o)))
            print(f"results written to {args.json}")
        return 0 if met else 2
    except RuntimeError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        redis_srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
