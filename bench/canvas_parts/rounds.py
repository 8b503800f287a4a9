"""One run of ``canvas.py``: the private Redis emptied, a fresh client process for one
(canvas, variant), every process's CPU read around its ``apply_async()`` (the client's own,
the redis-server's from ``/proc``, the rest of the machine's as foreign load), then the
broker's queue and the records checked."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from _common import BENCH_DIR, LineProcess, Load, PrivateRedis, proc_cpu, subprocess_env

VARIANTS = ("plain", "jobbers")


@dataclass
class Run:
    round: int
    canvas: str
    variant: str
    members: int
    messages: int
    wall: float  # s, apply_async() alone
    client_cpu: float  # s
    redis_cpu: float  # s
    foreign: float  # share of the machine's CPUs used by other processes meanwhile
    queued: int  # messages the broker's queue holds after it
    records: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Members enqueued per second."""
        return self.members / self.wall

    @property
    def cpu_per_member_us(self) -> float:
        return (self.client_cpu + self.redis_cpu) / self.members * 1e6


def expected_records(canvas: str, members: int, messages: int) -> int | None:
    """``submitted`` records a jobbers run must leave: one per member of a group or a chord's
    header; ``None`` for chunks and starmap (their ``celery.starmap`` messages are Celery's
    builtin task: whether and how they are recorded is not this benchmark's rule)."""
    return members if canvas in ("group", "chord") else None


class Bench:
    def __init__(self, redis_srv: PrivateRedis, stats: Any, batch: int | None,
                 cut_bytes: int | None = None) -> None:
        self.redis = redis_srv
        self.stats = stats  # a redis client on db 0
        extra = {} if batch is None else {"BENCH_PUBLISH_BATCH": str(batch)}
        if cut_bytes is not None:
            extra["BENCH_CUT_BYTES"] = str(cut_bytes)
        self.env = subprocess_env(BENCH_BROKER_URL=redis_srv.url,
                                  BENCH_RESULT_URL=redis_srv.url[:-1] + "1", **extra)

    def run(self, rnd: int, canvas: str, variant: str, members: int) -> Run:
        self.stats.flushall()
        client = LineProcess([sys.executable, str(BENCH_DIR / "canvas_parts" / "client.py"),
                              variant, canvas, str(members)], cwd=BENCH_DIR, env=self.env)
        try:
            ready = client.reply()
            if not ready or not ready.get("ready"):
                raise RuntimeError(f"the {variant} client did not start ({client.proc.wait()})")
            before = self.stats.llen("celery")
            load = Load([client.pid, self.redis.proc.pid])
            with load.span():
                r0 = sum(proc_cpu(self.redis.proc.pid))
                client.send("go")
                out = client.reply()
                r1 = sum(proc_cpu(self.redis.proc.pid))
            if out is None:
                raise RuntimeError(f"the {variant} client exited ({client.proc.wait()})")
        finally:
            if client.proc.poll() is None:
                client.proc.kill()
            client.proc.wait()
        run = Run(rnd, canvas, variant, int(out["members"]), int(out["messages"]),
                  float(out["wall"]), float(out["cpu"]), r1 - r0, load.share,
                  int(self.stats.llen("celery")) - before, dict(out["records"]))
        if run.queued != run.messages:
            run.problems.append(f"the broker's queue got {run.queued} messages, not "
                                f"{run.messages}")
        want = expected_records(canvas, members, run.messages)
        if variant == "jobbers" and want is not None and run.records != {"submitted": want}:
            run.problems.append(f"records {run.records}, not {{'submitted': {want}}}")
        return run
