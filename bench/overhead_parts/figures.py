"""A run's figures: per task, CPU of every process and of the machine, Redis commands,
script time and requests, throughput, enqueue rate and serial latency; and the time of the
commands that scripts ran, estimated so that it is not counted twice."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from _common import NCPU

#: Commands only this script sends; left out of the totals.
OWN_COMMANDS = frozenset({"info", "flushall", "ping"})
EVAL_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})


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
