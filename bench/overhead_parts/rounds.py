"""One (pool, variant) of one round: empty databases, a fresh worker and a fresh client
process; every process's CPU (client, worker main process, pool children, reaped ones,
redis-server, the whole machine) and ``INFO commandstats`` read around the client's
publish-and-get, the Redis requests each process counted; then the serial latency and the
records' lifecycle check."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DIR,
    LineProcess,
    PrivateRedis,
    Worker,
    child_pids,
    commandstats,
    machine_busy,
    proc_cpu,
    subprocess_env,
)

from overhead_parts.figures import OWN_COMMANDS, Run
from overhead_parts.variants import Variant, variants


def read_worker_round_trips(directory: Path) -> dict[int, tuple[str, int]]:
    out = {}
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["pid"])] = (str(data["role"]), int(data["round_trips"]))
    return out


class Client(LineProcess):
    """``overhead_client.py``: a fresh process per round, driven line by line."""

    def __init__(self, module: str, tasks: int, serial: int, env: dict[str, str]) -> None:
        super().__init__(
            [sys.executable, str(BENCH_DIR / "overhead_client.py"), module, str(tasks),
             str(serial)],
            cwd=BENCH_DIR, env=env, start_new_session=True)

    def read(self) -> dict[str, Any]:
        msg = self.reply()
        if msg is None:
            raise RuntimeError(f"the client exited ({self.proc.wait()})")
        return dict(msg)

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


class Bench:
    """Runs one (pool, variant) at a time on the private Redis, from ``work``."""

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
