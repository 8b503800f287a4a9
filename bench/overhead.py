#!/usr/bin/env python
"""What does ``base=JobbersTask`` cost over a plain Celery task?

Starts a private ``redis-server`` (free port, no persistence) and one real ``celery worker``
(prefork, ``-c 2``) running ``bench/bench_app.py``, then alternates rounds of N no-op tasks:
plain, jobbers, plain, jobbers, ... after a warmup of each kind. Tasks are published with
``.delay()`` from this process and their results awaited with ``.get()``, as a user would.

Per kind it reports throughput (first publish to last result), CPU per task of the worker
(main process + pool children), of this process and of redis-server, Redis commands per task
(``INFO commandstats``; this counts the commands Lua scripts run too), EVAL/EVALSHA calls per
task and Redis round trips per task (requests actually sent, counted inside redis-py in every
process). Then the jobbers/plain ratios and the extra commands and round trips per task.

    .venv/bin/python bench/overhead.py            # default: 2000 tasks x 5 rounds per kind
    .venv/bin/python bench/overhead.py --quick    # smoke test, well under a minute

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import glob
import json
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
KINDS = ("plain", "jobbers")
#: Commands only this script sends (on its own, uncounted connection); left out of the totals.
OWN_COMMANDS = frozenset({"info"})
EVAL_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})


# =========================================================================== processes
def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:  # never the machine's shared Redis
            return port


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class PrivateRedis:
    """A ``redis-server`` of our own on a free loopback port, persistence off."""

    def __init__(self, binary: str) -> None:
        path = shutil.which(binary)
        if path is None:
            raise SystemExit(f"{binary} not found: install redis-server (apt-get install "
                             "redis-server) or pass --redis-server PATH")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="jobbers-bench-redis-")
        self.proc = subprocess.Popen(
            [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    """``celery -A bench_app worker -P prefork -c N`` in its own session."""

    def __init__(self, concurrency: int, env: dict[str, str], log_path: Path) -> None:
        self.name = f"bench-{os.getpid()}-{time.monotonic_ns() % 10**6}@localhost"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "celery", "-A", "bench_app", "worker",
               "-P", "prefork", "-c", str(concurrency), "-n", self.name, "-l", "WARNING",
               "--without-mingle", "--without-gossip", "--without-heartbeat"]
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, app: Any, timeout: float = 60) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early ({self.proc.returncode}):\n"
                                   + self.log_tail())
            return bool(app.control.ping(destination=[self.name], timeout=0.5))

        wait_for(ready, timeout, "the worker to answer ping", interval=0.1)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker died ({self.proc.returncode}):\n" + self.log_tail())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10)


# =========================================================================== measurements
def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 (state) on


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own user+sys seconds, reaped children's user+sys seconds) of ``pid``."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0, 0.0
    # stat fields 14-17: utime stime cutime cstime; f[0] is field 3
    return (int(f[11]) + int(f[12])) / CLK_TCK, (int(f[13]) + int(f[14])) / CLK_TCK


def child_pids(ppid: int) -> list[int]:
    out = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        pid = int(path.split("/")[2])
        f = _stat_fields(pid)
        if f is not None and int(f[1]) == ppid:
            out.append(pid)
    return out


@dataclass
class Snapshot:
    t: float
    worker_main: float
    worker_reaped: float
    children: dict[int, float]
    client: float
    redis: float
    commands: dict[str, int]
    eval_usec: int
    machine: float
    client_rt: int
    worker_rt: dict[int, tuple[str, int]] = field(default_factory=dict)


def commandstats(client: Any) -> tuple[dict[str, int], int]:
    """Calls per command name, and the microseconds Redis spent in EVAL/EVALSHA."""
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    usec = sum(int(v["usec"]) for k, v in stats.items()
               if k.removeprefix("cmdstat_") in EVAL_COMMANDS)
    return calls, usec


def machine_busy() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (/proc/stat)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def read_worker_round_trips(directory: str) -> dict[int, tuple[str, int]]:
    out = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        out[int(data["pid"])] = (str(data["role"]), int(data["round_trips"]))
    return out


@dataclass
class Round:
    kind: str
    tasks: int
    elapsed: float
    publish_s: float
    worker_main_cpu: float
    worker_children_cpu: float
    client_cpu: float
    redis_cpu: float
    commands: dict[str, int]
    eval_usec: int
    machine_cpu: float
    rt_client: int
    rt_worker_main: int
    rt_worker_children: int

    @property
    def throughput(self) -> float:
        return self.tasks / self.elapsed

    @property
    def worker_cpu(self) -> float:
        return self.worker_main_cpu + self.worker_children_cpu

    @property
    def total_cpu(self) -> float:
        return self.worker_cpu + self.client_cpu + self.redis_cpu

    @property
    def total_commands(self) -> int:
        return sum(n for c, n in self.commands.items() if c not in OWN_COMMANDS)

    @property
    def evals(self) -> int:
        return sum(n for c, n in self.commands.items() if c in EVAL_COMMANDS)

    @property
    def other_load(self) -> float:
        """Share of the machine's CPUs busy with processes outside the benchmark."""
        foreign = max(0.0, self.machine_cpu - self.total_cpu)
        return foreign / (self.elapsed * (os.cpu_count() or 1))

    @property
    def round_trips(self) -> int:
        return self.rt_client + self.rt_worker_main + self.rt_worker_children


class Bench:
    def __init__(self, args: argparse.Namespace, redis_srv: PrivateRedis, count_dir: str,
                 worker: Worker, app_module: Any, stats_client: Any) -> None:
        self.args = args
        self.redis = redis_srv
        self.count_dir = count_dir
        self.worker = worker
        self.mod = app_module
        self.stats = stats_client

    def snapshot(self, with_worker_rt: bool) -> Snapshot:
        t = time.perf_counter()
        main, reaped = proc_cpu(self.worker.pid)
        children = {pid: proc_cpu(pid)[0] for pid in child_pids(self.worker.pid)}
        times = os.times()
        calls, eval_usec = commandstats(self.stats)
        snap = Snapshot(
            t=t, worker_main=main, worker_reaped=reaped, children=children,
            client=times.user + times.system, redis=proc_cpu(self.redis.proc.pid)[0],
            commands=calls, eval_usec=eval_usec, machine=machine_busy(),
            client_rt=self.mod.round_trips(),
        )
        if with_worker_rt:
            snap.worker_rt = read_worker_round_trips(self.count_dir)
        return snap

    def run_round(self, kind: str, n: int) -> Round:
        task = self.mod.TASKS[kind]
        timeout = max(60.0, n / 20)
        self.worker.check_alive()
        time.sleep(0.35)  # quiet, and the workers' round-trip files are fresh
        a = self.snapshot(with_worker_rt=True)
        t0 = time.perf_counter()
        results = [task.delay() for _ in range(n)]
        t_pub = time.perf_counter()
        for r in results:
            r.get(timeout=timeout)
        b = self.snapshot(with_worker_rt=False)
        time.sleep(0.35)  # let every worker process write its count once more
        b.worker_rt = read_worker_round_trips(self.count_dir)
        children = sum(cpu - a.children.get(pid, 0.0) for pid, cpu in b.children.items())
        rt_main = rt_children = 0
        for pid, (role, count) in b.worker_rt.items():
            delta = count - a.worker_rt.get(pid, (role, 0))[1]
            if role == "worker-main":
                rt_main += delta
            else:
                rt_children += delta
        commands = {c: b.commands[c] - a.commands.get(c, 0) for c in b.commands}
        return Round(
            kind=kind, tasks=n, elapsed=b.t - t0, publish_s=t_pub - t0,
            worker_main_cpu=b.worker_main - a.worker_main,
            worker_children_cpu=children + (b.worker_reaped - a.worker_reaped),
            client_cpu=b.client - a.client, redis_cpu=b.redis - a.redis,
            commands={c: d for c, d in commands.items() if d},
            eval_usec=b.eval_usec - a.eval_usec, machine_cpu=b.machine - a.machine,
            rt_client=b.client_rt - a.client_rt, rt_worker_main=rt_main,
            rt_worker_children=rt_children,
        )


# =========================================================================== report
@dataclass
class KindSummary:
    kind: str
    rounds: list[Round]

    def _sum(self, attr: str) -> float:
        return float(sum(getattr(r, attr) for r in self.rounds))

    @property
    def tasks(self) -> int:
        return sum(r.tasks for r in self.rounds)

    def per_task(self, attr: str) -> float:
        return self._sum(attr) / self.tasks

    @property
    def throughputs(self) -> list[float]:
        return [r.throughput for r in self.rounds]

    @property
    def throughput(self) -> float:
        """Median of the rounds (robust to one disturbed round)."""
        return statistics.median(self.throughputs)

    @property
    def pooled_throughput(self) -> float:
        return self.tasks / self._sum("elapsed")

    def commands_per_task(self) -> dict[str, float]:
        total: dict[str, int] = {}
        for r in self.rounds:
            for c, n in r.commands.items():
                if c not in OWN_COMMANDS:
                    total[c] = total.get(c, 0) + n
        return {c: n / self.tasks for c, n in total.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "rounds": len(self.rounds),
            "throughput_median": self.throughput,
            "throughput_pooled": self.pooled_throughput,
            "throughput_rounds": self.throughputs,
            "worker_cpu_ms_per_task": 1000 * self.per_task("worker_cpu"),
            "worker_main_cpu_ms_per_task": 1000 * self.per_task("worker_main_cpu"),
            "worker_children_cpu_ms_per_task": 1000 * self.per_task("worker_children_cpu"),
            "client_cpu_ms_per_task": 1000 * self.per_task("client_cpu"),
            "redis_cpu_ms_per_task": 1000 * self.per_task("redis_cpu"),
            "total_cpu_ms_per_task": 1000 * self.per_task("total_cpu"),
            "redis_commands_per_task": self.per_task("total_commands"),
            "evals_per_task": self.per_task("evals"),
            "usec_per_eval": self._sum("eval_usec") / max(1.0, self._sum("evals")),
            "other_load": self._sum("machine_cpu") and max(
                0.0, self._sum("machine_cpu") - self._sum("total_cpu"))
            / (self._sum("elapsed") * (os.cpu_count() or 1)),
            "round_trips_per_task": self.per_task("round_trips"),
            "round_trips_client_per_task": self.per_task("rt_client"),
            "round_trips_worker_main_per_task": self.per_task("rt_worker_main"),
            "round_trips_worker_children_per_task": self.per_task("rt_worker_children"),
            "commands_per_task": self.commands_per_task(),
        }


def print_round(i: int, r: Round) -> None:
    print(f"  round {i:>2} {r.kind:<7} {r.tasks:>6} tasks {r.elapsed:6.2f}s "
          f"(publish {r.publish_s:5.2f}s) {r.throughput:7.1f} tasks/s | "
          f"CPU ms/task worker {1000 * r.worker_cpu / r.tasks:5.3f} "
          f"client {1000 * r.client_cpu / r.tasks:5.3f} "
          f"redis {1000 * r.redis_cpu / r.tasks:5.3f} | "
          f"cmds/task {r.total_commands / r.tasks:5.2f} "
          f"evals/task {r.evals / r.tasks:4.2f} "
          f"round trips/task {r.round_trips / r.tasks:5.2f} | other load "
          f"{100 * r.other_load:3.0f}%", flush=True)


def report(plain: KindSummary, jobbers: KindSummary, args: argparse.Namespace) -> dict[str, Any]:
    p, j = plain.as_dict(), jobbers.as_dict()

    def row(label: str, key: str, fmt: str, ratio: bool = False, extra: bool = False,
            scale: float = 1.0, unit: str = "") -> None:
        pv, jv = p[key] * scale, j[key] * scale
        r = f"{jv / pv:8.3f}" if ratio and pv else " " * 8
        e = f"{jv - pv:+9.3f}{unit}" if extra else ""
        print(f"  {label:<36}{pv:{fmt}}{jv:{fmt}}   {r}   {e}")

    width = 96
    print()
    print("=" * width)
    print(f"SUMMARY  ({len(plain.rounds)} rounds x {args.tasks} tasks per kind, prefork "
          f"-c {args.concurrency}, {os.cpu_count()} CPUs, Redis broker + result backend)")
    if args.store_mode != "real":
        print(f"  DIAGNOSTIC store mode {args.store_mode!r}: jobbers records are NOT written")
    print(f"  machine CPU used by other processes during the rounds: plain "
          f"{100 * p['other_load']:.0f}%, jobbers {100 * j['other_load']:.0f}% "
          f"(high values mean noisy figures)")
    print("=" * width)
    print(f"  {'':<36}{'plain':>12}{'jobbers':>12}   {'jobbers/plain':>8}   {'extra per task':>14}")
    row("throughput, median (tasks/s)", "throughput_median", "12.1f", ratio=True)
    row("throughput, pooled (tasks/s)", "throughput_pooled", "12.1f", ratio=True)
    print(f"  {'  rounds (tasks/s)':<36}"
          f"{'/'.join(f'{x:.0f}' for x in p['throughput_rounds']):>24}  |  "
          f"{'/'.join(f'{x:.0f}' for x in j['throughput_rounds'])}")
    row("worker CPU (ms/task)", "worker_cpu_ms_per_task", "12.3f", ratio=True, extra=True,
        unit=" ms")
    row("  main process", "worker_main_cpu_ms_per_task", "12.3f", ratio=True, extra=True,
        unit=" ms")
    row("  pool children", "worker_children_cpu_ms_per_task", "12.3f", ratio=True,
        extra=True, unit=" ms")
    row("client CPU (ms/task)", "client_cpu_ms_per_task", "12.3f", ratio=True, extra=True,
        unit=" ms")
    row("redis-server CPU (ms/task)", "redis_cpu_ms_per_task", "12.3f", ratio=True, extra=True,
        unit=" ms")
    row("all CPU (ms/task)", "total_cpu_ms_per_task", "12.3f", ratio=True, extra=True,
        unit=" ms")
    row("Redis commands/task (incl. in Lua)", "redis_commands_per_task", "12.2f", extra=True)
    row("  EVAL/EVALSHA calls/task", "evals_per_task", "12.2f", extra=True)
    if j["evals_per_task"] >= 0.5:
        print(f"  {'  Redis time per EVALSHA (us)':<36}{'':>12}{j['usec_per_eval']:12.1f}"
              "   (INFO commandstats, includes the commands the script runs)")
    row("Redis round trips/task", "round_trips_per_task", "12.2f", extra=True)
    row("  client (publish + results)", "round_trips_client_per_task", "12.2f", extra=True)
    row("  worker main process", "round_trips_worker_main_per_task", "12.2f", extra=True)
    row("  pool children", "round_trips_worker_children_per_task", "12.2f", extra=True)
    print("-" * width)
    pc, jc = p["commands_per_task"], j["commands_per_task"]
    names = sorted(set(pc) | set(jc), key=lambda c: (-(jc.get(c, 0) + pc.get(c, 0)), c))
    print("  Redis commands per task by name (plain -> jobbers):")
    line = []
    for c in names:
        a, b = pc.get(c, 0.0), jc.get(c, 0.0)
        if max(a, b) >= 0.005:
            line.append(f"{c} {a:.2f}->{b:.2f}")
    for i in range(0, len(line), 5):
        print("    " + ", ".join(line[i:i + 5]))
    print("-" * width)
    ratio = j["throughput_median"] / p["throughput_median"]
    extra_rt = j["round_trips_per_task"] - p["round_trips_per_task"]
    extra_cmd = j["redis_commands_per_task"] - p["redis_commands_per_task"]
    print(f"  throughput jobbers/plain = {ratio:.3f}  (target >= 0.90: "
          f"{'met' if ratio >= 0.90 else 'NOT met'})")
    print(f"  worker CPU per task jobbers/plain = "
          f"{j['worker_cpu_ms_per_task'] / p['worker_cpu_ms_per_task']:.3f}")
    print(f"  extra Redis round trips per task = {extra_rt:+.2f}  (expected: about 1 when "
          "the result write is folded into `completed`, else about 3)")
    print(f"  extra Redis commands per task = {extra_cmd:+.2f}  (EVALSHA "
          f"{j['evals_per_task'] - p['evals_per_task']:+.2f}, the rest run inside the scripts)")
    print("=" * width)
    return {"plain": p, "jobbers": j, "throughput_ratio": ratio,
            "worker_cpu_ratio": j["worker_cpu_ms_per_task"] / p["worker_cpu_ms_per_task"],
            "total_cpu_ratio": j["total_cpu_ms_per_task"] / p["total_cpu_ms_per_task"],
            "extra_round_trips_per_task": extra_rt, "extra_commands_per_task": extra_cmd,
            "settings": vars(args)}


# =========================================================================== profiling
def print_profile(title: str, paths: list[str], tasks: int, top: int) -> None:
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        print(f"  ({title}: no profile written)")
        return
    st = pstats.Stats(*paths)
    total = st.total_tt  # type: ignore[attr-defined]
    print(f"\n--- {title}: {tasks} tasks, {1000 * total / tasks:.3f} ms profiled per task "
          f"(cProfile inflates this; compare the two kinds, not to the CPU figures)")
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = filename.replace(str(ROOT) + "/", "")
        short = short.split("site-packages/")[-1]
        rows.append((ct, tt, nc, f"{short}:{line}({func})"))
    print(f"  {'cum ms/task':>11} {'own ms/task':>11} {'calls/task':>10}  function")
    shown = 0
    for ct, tt, nc, name in sorted(rows, reverse=True):
        if "jobbers_celery" in name or "bench_app" in name:
            print(f"  {1000 * ct / tasks:11.4f} {1000 * tt / tasks:11.4f} {nc / tasks:10.2f}  {name}")
            shown += 1
            if shown >= top:
                break
    print(f"  top {top} by own time (all code):")
    for ct, tt, nc, name in sorted(rows, key=lambda x: -x[1])[:top]:
        print(f"  {1000 * ct / tasks:11.4f} {1000 * tt / tasks:11.4f} {nc / tasks:10.2f}  {name}")


def profile(args: argparse.Namespace, base_env: dict[str, str], app_module: Any,
            work: Path) -> None:
    """One worker per kind with cProfile in its pool children; the client is profiled too."""
    for kind in KINDS:
        pdir = Path(args.profile) / kind
        shutil.rmtree(pdir, ignore_errors=True)
        pdir.mkdir(parents=True)
        env = {**base_env, "BENCH_PROFILE_DIR": str(pdir)}
        worker = Worker(args.concurrency, env, work / f"worker-profile-{kind}.log")
        try:
            worker.wait_ready(app_module.app)
            task = app_module.TASKS[kind]
            for r in [task.delay() for _ in range(args.warmup)]:
                r.get(timeout=60)
            (pdir / "reset").touch()  # the children start their profiles afresh
            profiler = cProfile.Profile()
            profiler.enable()
            results = [task.delay() for _ in range(args.tasks)]
            for r in results:
                r.get(timeout=max(60.0, args.tasks / 20))
            profiler.disable()
            profiler.dump_stats(str(pdir / "client.prof"))
        finally:
            worker.stop()
        children = sorted(glob.glob(str(pdir / "child-*.prof")))
        covered = sum(json.loads(Path(p[:-5] + ".json").read_text())["tasks"]
                      for p in children)
        print_profile(f"{kind}: pool children", children, covered, args.top)
        print_profile(f"{kind}: client (publish + .get())", [str(pdir / "client.prof")],
                      args.tasks, args.top)
    print(f"\nprofiles kept in {args.profile}/<kind>/ (open with python -m pstats)")


# =========================================================================== main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000, help="tasks per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="measured rounds per kind, alternating (default 5, at least 3)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="tasks per kind in the warmup round (default: tasks/4, >= 50)")
    ap.add_argument("--concurrency", type=int, default=2, help="prefork pool size (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 200 tasks x 3 rounds, warmup 50 (< 60 s)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--profile", metavar="DIR",
                    help="instead of the comparison, profile each kind with cProfile "
                         "(pool children and client) and print where the time goes")
    ap.add_argument("--top", type=int, default=25, help="rows per profile listing")
    ap.add_argument("--store-mode", choices=("real", "trivial-lua", "noop"), default="real",
                    help="diagnostics: trivial-lua sends each step's EVALSHA to a script "
                         "that returns at once; noop makes no Redis call (see README)")
    ap.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds = 200, 3
        args.warmup = 50 if args.warmup is None else args.warmup
    if args.warmup is None:
        args.warmup = max(50, args.tasks // 4)
    if args.rounds < 3 and not args.profile:
        ap.error("--rounds must be at least 3")
    if args.tasks < 1:
        ap.error("--tasks must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    redis_srv = PrivateRedis(args.redis_server)
    work = Path(tempfile.mkdtemp(prefix="jobbers-bench-"))
    count_dir = work / "round-trips"
    count_dir.mkdir()
    worker: Worker | None = None
    app_module: Any = None
    try:
        import redis
        from redis.connection import Connection

        from jobbers_celery import TaskState

        class Uncounted(Connection):  # this script's INFO calls stay out of the counts
            pass

        stats = redis.Redis(connection_pool=redis.ConnectionPool(
            host="127.0.0.1", port=redis_srv.port, connection_class=Uncounted))
        wait_for(lambda: _ping(stats), 10, "redis-server to answer")
        original_send = Connection.send_packed_command
        Uncounted.send_packed_command = original_send  # type: ignore[method-assign]

        os.environ["BENCH_REDIS_URL"] = redis_srv.url
        os.environ["BENCH_STORE_MODE"] = args.store_mode
        sys.path.insert(0, str(BENCH_DIR))
        import bench_app as app_module

        app_module.enable_round_trip_counting()
        env = {**os.environ, "BENCH_REDIS_URL": redis_srv.url,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        print(f"private redis-server on port {redis_srv.port} (pid {redis_srv.proc.pid}); "
              f"work dir {work}", flush=True)
        if args.profile:
            profile(args, env, app_module, work)
            return 0

        env["BENCH_COUNT_DIR"] = str(count_dir)
        worker = Worker(args.concurrency, env, work / "worker.log")
        worker.wait_ready(app_module.app)
        bench = Bench(args, redis_srv, str(count_dir), worker, app_module, stats)
        print(f"worker pid {worker.pid}, pool children {child_pids(worker.pid)}; "
              f"warmup {args.warmup} tasks per kind, then {args.rounds} x {args.tasks} "
              f"tasks per kind, alternating", flush=True)
        for kind in KINDS:
            r = bench.run_round(kind, args.warmup)
            print(f"  warmup   {kind:<7} {r.tasks:>6} tasks {r.elapsed:6.2f}s "
                  f"{r.throughput:7.1f} tasks/s", flush=True)
        rounds: dict[str, list[Round]] = {k: [] for k in KINDS}
        i = 0
        for _ in range(args.rounds):
            for kind in KINDS:
                i += 1
                r = bench.run_round(kind, args.tasks)
                rounds[kind].append(r)
                print_round(i, r)
        worker.check_alive()
        # Correctness: every jobbers task ended completed, nothing was refused.
        total_jobbers = args.warmup + args.rounds * args.tasks
        counts = app_module.jobbers.counts()
        refused = app_module.jobbers.store.refused_counts()
        summary = report(KindSummary("plain", rounds["plain"]),
                         KindSummary("jobbers", rounds["jobbers"]), args)
        completed = int(counts.get(TaskState.COMPLETED, 0))
        others = {s.value: n for s, n in counts.items() if n and s is not TaskState.COMPLETED}
        if args.store_mode == "real":
            ok = completed == total_jobbers and not others and not refused
            print(f"  lifecycle check: {completed}/{total_jobbers} jobbers records completed, "
                  f"other states {others or 'none'}, refused transitions "
                  f"{refused or 'none'}: {'OK' if ok else 'FAILED'}")
        else:
            ok = True
            print(f"  lifecycle check skipped (store mode {args.store_mode!r})")
        print(f"  total wall time {time.monotonic() - started:.1f}s")
        summary["lifecycle_ok"] = ok
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
            print(f"  results written to {args.json}")
        return 0 if ok else 1
    except RuntimeError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if worker is not None:
            worker.stop()
        if app_module is not None:
            with contextlib.suppress(Exception):
                app_module.app.close()
        redis_srv.stop()
        shutil.rmtree(work, ignore_errors=True)


def _ping(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


if __name__ == "__main__":
    sys.exit(main())
