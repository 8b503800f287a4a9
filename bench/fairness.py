#!/usr/bin/env python
"""Fair shares: how long does a small tenant wait behind a large one, and what does a fair
publish and start cost? (docs/howto/fair-shares.md)

**Wait.** On a private ``redis-server`` (broker, results and state store, one shard), a
fresh publisher process publishes ``--large`` tasks of tenant ``big`` (``--ms`` each); two
real prefork workers (``-c 2``, prefetch 1, fresh for every variant and round) running
``bench/fairness_app.py`` start on that backlog; once both are ready, another fresh
publisher publishes ``--small`` tasks of tenant ``small``. Their publish-to-start times are
read from their records (the Redis clock); the round ends when the last has completed.
Variants, interleaved round by round (A B, B A, ...):

- ``plain``: ``fair.plain``, no cap (what a queue does without fair shares);
- ``fair``: ``fair.keyed``, ``max_concurrent=--cap`` per tenant (``concurrency_key``).

With ``--group`` the large tenant's backlog is published as one ``group`` (its members
batched, see jobbers_celery/lifecycle/bulk.py), the usual shape of an import, instead of one
``delay()`` each; the small tenant's tasks are still published one by one. Each round also
reads how many messages the broker holds once the backlog is published (before any worker
runs): a fair publish holds a key's tasks past ``--cap`` back in the store.

The CPU of every process of the round is counted: the two publishers (their own), the
workers and their pool processes (``/proc``) and the redis-server (``INFO cpu``).

**Cost.** A fresh process per variant and round publishes ``--cost-tasks`` tasks (each its
own tenant: none is parked) after a warm-up, then runs their start steps as a worker would
(``store.start``), and reports the time per publish and the store calls (``evalsha``, from
``INFO commandstats``) per publish and per start: ``plain`` and ``fair``, and with
``--shards`` ``plain16`` and ``fair16`` (16 shards: the key's structures in the global
slot, one call before the step). Target: a fair publish or start costs no store call more
on one shard, at most one more on the sharded layout.

    .venv/bin/python bench/fairness.py                     # 2 rounds, 5,000 + 10 tasks
    .venv/bin/python bench/fairness.py --rounds 1 --large 2000 --shards --json out.json
    .venv/bin/python bench/fairness.py --group --cost-rounds 0   # the backlog as one group
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

from _common import (
    BENCH_DIR,
    STORE_COMMANDS,
    PrivateRedis,
    Spread,
    Worker,
    banner,
    child_pids,
    code_version,
    commands_since,
    common_options,
    exit_code,
    failed,
    on_sys_path,
    ping,
    proc_cpu,
    rotated,
    subprocess_env,
    verdict,
    wait_for,
    write_json,
)

on_sys_path()

TASKS = {"plain": "fair.plain", "fair": "fair.keyed"}


# ---------------------------------------------------------------------- child processes
def publish(variant: str, url: str, tenant: str, count: int, ms: float,
            as_group: bool = False) -> dict[str, Any]:
    """``count`` tasks of ``tenant`` from a fresh process (``as_group``: as one ``group``):
    their ids, the time it took and this process's CPU."""
    os.environ["BENCH_URL"] = url
    import fairness_app
    from celery import group
    from celery.result import GroupResult

    task = fairness_app.app.tasks[TASKS[variant]]
    started = time.perf_counter()
    if as_group:
        sent = group(task.s(tenant, ms) for _ in range(count)).apply_async()
        ids = [r.id for r in cast("GroupResult", sent).results or ()]
    else:
        ids = [task.delay(tenant, ms).id for _ in range(count)]
    return {"ids": ids, "took_s": time.perf_counter() - started, "cpu_s": time.process_time()}


def cost(variant: str, url: str, tasks: int, warmup: int) -> dict[str, Any]:
    """Publishes and start steps of one cost variant (a fresh process)."""
    import redis
    from celery import Celery

    from jobbers_celery import JobbersTask, install
    from jobbers_celery.core.fairshare import FairKey, key_digest

    shards = 16 if variant.endswith("16") else 1
    fair = variant.startswith("fair")
    app = Celery("bench_fair", broker=url, backend=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], jobbers_redis_url=url,
                    jobbers_store_shards=shards, jobbers_key_prefix=f"b{shards}")
    jobbers = install(app)
    opts: dict[str, Any] = {"max_concurrent": 2, "concurrency_key": "tenant"} if fair else {}

    @app.task(base=JobbersTask, name=f"bench.{variant}", shared=False, **opts)
    def work(tenant: str, note: str) -> None:
        return None

    note = "x" * 200
    tag = uuid.uuid4().hex[:8]
    for i in range(warmup):
        work.delay(f"w{tag}{i}", note)
    client = redis.Redis.from_url(url, decode_responses=True)

    before = client.info("commandstats")
    started = time.perf_counter()
    ids = [work.delay(f"{tag}{i}", note).id for i in range(tasks)]
    took = time.perf_counter() - started
    pub = commands_since(client, before)
    before = client.info("commandstats")
    start_began = time.perf_counter()
    for i, task_id in enumerate(ids):
        key = FairKey(key_digest(f"{tag}{i}"), 2) if fair else None
        res = jobbers.store.start(task_id, name=work.name, worker="bench", wid="bench:1",
                                  heartbeat_ms=None, cap=2 if fair else None,
                                  lease_cap_ms=60_000, defer_ms=1000, fields={}, fair=key)
        assert res.applied, res
    start_took = time.perf_counter() - start_began
    st = commands_since(client, before)
    return {"us": took / tasks * 1e6, "start_us": start_took / tasks * 1e6,
            "store_calls": sum(pub.get(c, 0) for c in STORE_COMMANDS) / tasks,
            "start_calls": sum(st.get(c, 0) for c in STORE_COMMANDS) / tasks,
            "calls": {k: round(v / tasks, 3) for k, v in sorted(pub.items()) if v}}


# ---------------------------------------------------------------------- one round
def _cpu(pids: list[int]) -> float:
    return sum(sum(proc_cpu(p)) for p in pids)


def wait_round(variant: str, url: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One variant's round: a fresh publisher publishes the large tenant's backlog; fresh
    workers start on it; once they are all ready (the backlog is at the broker, or parked,
    whatever the publisher's speed), another fresh publisher publishes the small tenant's
    tasks. Their publish-to-start times come from their records (the Redis clock)."""
    import redis
    from celery import Celery

    from jobbers_celery import TaskState, install

    client = redis.Redis.from_url(url, decode_responses=True)
    env = {"BENCH_URL": url, "BENCH_CAP": str(args.cap)}

    def publisher(tenant: str, count: int, as_group: bool = False) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, __file__, "--publish", variant, url, "--tenant", tenant,
             "--count", str(count), "--ms", str(args.ms), *(["--group"] if as_group else [])],
            capture_output=True, text=True, env=subprocess_env(**env), check=True,
            timeout=1800, cwd=BENCH_DIR)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    big = publisher("big", args.large, args.group)
    queued = int(client.llen("celery"))  # the broker's backlog, before any worker runs
    reader = Celery("fairness_reader", broker=url, backend=url, set_as_current=False)
    reader.conf.update(jobbers_redis_url=url)
    jobbers = install(reader)
    redis_cpu0 = _redis_cpu(client)
    workers = []
    for n in range(args.workers):
        ready = tmp / f"{variant}-{n}.ready"
        ready.unlink(missing_ok=True)
        workers.append(Worker("fairness_app", "prefork", args.concurrency,
                              subprocess_env(**env, BENCH_READY_FILE=str(ready)),
                              tmp / f"{variant}-{n}.log", ready))
    try:
        for w in workers:
            w.wait_ready()
        small = publisher("small", args.small)
        began = time.monotonic()

        def done() -> bool:
            for w in workers:
                w.check_alive()
            return all((r := jobbers.get(i)) is not None and r.state is TaskState.COMPLETED
                       for i in small["ids"])

        wait_for(done, args.timeout, f"the small tenant's tasks ({variant})", interval=0.2)
        took = time.monotonic() - began
        waits = []
        for r in (jobbers.get(i) for i in small["ids"]):
            if r is None or r.started_at is None or r.submitted_at is None:
                raise RuntimeError(f"a small task has no start recorded: {r}")
            waits.append((r.started_at - r.submitted_at).total_seconds())
        counts = jobbers.counts()
        worker_cpu = _cpu([p for w in workers for p in [w.pid, *child_pids(w.pid)]])
        redis_cpu = _redis_cpu(client) - redis_cpu0
        held = jobbers.fair_held()
    finally:
        for w in workers:
            w.stop()
    return {"waits": waits, "round_s": took, "publish_big_s": big["took_s"], "queued": queued,
            "big_completed": counts.get(TaskState.COMPLETED, 0) - args.small,
            "big_parked": sum(h.parked for h in held),
            "cpu": {"publishers": big["cpu_s"] + small["cpu_s"], "workers": worker_cpu,
                    "redis": redis_cpu}}


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ---------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--large", type=int, default=5000, help="the large tenant's tasks")
    ap.add_argument("--group", action="store_true",
                    help="publish the large tenant's tasks as one group")
    ap.add_argument("--small", type=int, default=10, help="the small tenant's tasks")
    ap.add_argument("--ms", type=float, default=20.0, help="each task's run time, ms")
    ap.add_argument("--cap", type=int, default=2, help="max_concurrent per tenant")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--cost-rounds", type=int, default=4)
    ap.add_argument("--cost-tasks", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--shards", action="store_true", help="cost: also the sharded layout")
    ap.add_argument("--publish", nargs=2, metavar=("VARIANT", "URL"), help=argparse.SUPPRESS)
    ap.add_argument("--tenant", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--overhead-ms", type=float, default=100.0,
                    help="the bound's allowance for a task's own overhead (dispatch, steps)")
    ap.add_argument("--cost", nargs=2, metavar=("VARIANT", "URL"), help=argparse.SUPPRESS)
    common_options(ap)
    args = ap.parse_args()
    if args.publish:
        variant, url = args.publish
        print(json.dumps(publish(variant, url, args.tenant, args.count, args.ms, args.group)))
        return 0
    if args.cost:
        variant, url = args.cost
        print(json.dumps(cost(variant, url, args.cost_tasks, args.warmup)))
        return 0
    server = PrivateRedis(args.redis_server)
    waits: list[dict[str, dict[str, Any]]] = []
    costs: list[dict[str, dict[str, Any]]] = []
    cost_variants = ["plain", "fair", *(["plain16", "fair16"] if args.shards else [])]
    try:
        import redis
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: ping(client), 10, "the private redis-server")
        with tempfile.TemporaryDirectory(prefix="jobbers-fair-") as tmp:
            for i in range(args.rounds):
                got: dict[str, dict[str, Any]] = {}
                for variant in rotated(["plain", "fair"], i):
                    client.flushall()
                    got[variant] = wait_round(variant, server.url, args, Path(tmp))
                    w = got[variant]["waits"]
                    print(f"  round {i + 1} {variant}: small tenant publish-to-start "
                          f"{min(w):.2f}-{max(w):.2f} s, all done {got[variant]['round_s']:.1f}"
                          f" s after its publish; broker held {got[variant]['queued']}",
                          flush=True)
                waits.append(got)
        for i in range(args.cost_rounds):
            got = {}
            for variant in rotated(cost_variants, i):
                client.flushall()
                out = subprocess.run(
                    [sys.executable, __file__, "--cost", variant, server.url,
                     "--cost-tasks", str(args.cost_tasks), "--warmup", str(args.warmup)],
                    capture_output=True, text=True, env=subprocess_env(), check=True,
                    timeout=600, cwd=BENCH_DIR)
                got[variant] = json.loads(out.stdout.strip().splitlines()[-1])
            costs.append(got)
            print(f"  cost round {i + 1}: " + ", ".join(
                f"{v} {got[v]['us']:.0f} us" for v in cost_variants), flush=True)
    except Exception as exc:  # noqa: BLE001 - reported as a failed run
        return failed(exc)
    finally:
        server.stop()
    return report(args, waits, costs, cost_variants)


def report(args: argparse.Namespace, waits: list[dict[str, dict[str, Any]]],
           costs: list[dict[str, dict[str, Any]]], cost_variants: list[str]) -> int:
    out: dict[str, Any] = {"code": code_version(), "args": vars(args), "wait": {}, "cost": {}}
    slots = args.workers * args.concurrency
    banner(86, f"fair shares: {args.large} tasks of a large tenant"
               f"{' (one group)' if args.group else ''}, then {args.small} of a "
               f"small one ({args.ms:g} ms each), {args.workers} prefork workers x "
               f"{args.concurrency}, cap {args.cap} per tenant; {args.rounds} rounds, "
               "fresh processes", f"code: {out['code']}")
    ok = True
    for v in ("plain", "fair") if waits else ():  # --rounds 0: the cost only
        all_waits = [x for r in waits for x in r[v]["waits"]]
        worst = Spread.of([max(r[v]["waits"]) for r in waits])
        cpu = {k: Spread.of([r[v]["cpu"][k] for r in waits]) for k in waits[0][v]["cpu"]}
        out["wait"][v] = {"worst": worst.__dict__, "median": Spread.of(all_waits).__dict__,
                          "rounds": [r[v] for r in waits]}
        print(f"  {v:5}  small tenant publish-to-start: worst {worst.cell('.2f')} s, "
              f"median {Spread.of(all_waits).median:.2f} s; large tenant done meanwhile "
              f"{Spread.of([r[v]['big_completed'] for r in waits]).cell('.0f')}, parked "
              f"{Spread.of([r[v]['big_parked'] for r in waits]).cell('.0f')}; broker held "
              f"{Spread.of([r[v]['queued'] for r in waits]).cell('.0f')} after its publish")
        print("         CPU s: " + ", ".join(f"{k} {s.cell('.1f')}" for k, s in cpu.items()))
    # the stated bound (docs/howto/fair-shares.md): the j-th task of a key (0-based, in
    # publish order) waits at most (K x cap / S + 1) x T + floor(j / cap) x (T + P):
    # K keys with tasks on their way (here 2), S worker slots, T a task's run time plus an
    # allowance for its own overhead (--overhead-ms), P one scheduler pass (0.5 s), the
    # release's fallback when the ending worker's own release is lost.
    t, p = (args.ms + args.overhead_ms) / 1000, 0.5
    first = (2 * args.cap / slots + 1) * t
    worst_ratio = 0.0
    for r in waits:
        for j, w in enumerate(r["fair"]["waits"]):
            worst_ratio = max(worst_ratio, w / (first + (j // args.cap) * (t + p)))
    ok = worst_ratio <= 1.0
    if waits:
        firsts = Spread.of([r["fair"]["waits"][0] for r in waits])
        plain_firsts = Spread.of([r["plain"]["waits"][0] for r in waits])
        out["bound"] = {"first_s": first, "worst_ratio": worst_ratio}
        print(f"  small tenant's first task: fair {firsts.cell('.2f')} s, plain "
              f"{plain_firsts.cell('.2f')} s; bound (2 keys x cap {args.cap} / {slots} slots "
              f"+ 1) x {t:.2f} s = {first:.2f} s, its j-th task + floor(j/{args.cap}) x "
              f"{t + p:.2f} s; worst wait / bound {worst_ratio:.2f}: {verdict(ok)}")
    for v in cost_variants if costs else []:  # --cost-rounds 0: the wait only
        base = "plain16" if v.endswith("16") else "plain"
        us = Spread.of([r[v]["us"] for r in costs])
        ratio = Spread.of([r[v]["us"] / r[base]["us"] for r in costs])
        last = costs[-1]
        extra = last[v]["store_calls"] - last[base]["store_calls"]
        extra_start = last[v]["start_calls"] - last[base]["start_calls"]
        allowed = 1 if v.endswith("16") else 0
        if v.startswith("fair"):
            ok = ok and extra <= allowed + 0.01 and extra_start <= allowed + 0.01
        out["cost"][v] = {"us": us.__dict__, "ratio": ratio.__dict__,
                          "store_calls": last[v]["store_calls"],
                          "start_calls": last[v]["start_calls"], "calls": last[v]["calls"]}
        print(f"  {v:8} publish {us.cell('.0f')} us (x{ratio.cell('.2f')} of {base}); store "
              f"calls per publish {last[v]['store_calls']:.2f}, per start "
              f"{last[v]['start_calls']:.2f}"
              + (f" (+{extra:.2f}/+{extra_start:.2f}, at most {allowed}: "
                 f"{verdict(extra <= allowed + 0.01 and extra_start <= allowed + 0.01)})"
                 if v.startswith("fair") else ""))
        print(f"           commands per publish: {last[v]['calls']}")
    write_json(args.json, out)
    return exit_code(ok)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
