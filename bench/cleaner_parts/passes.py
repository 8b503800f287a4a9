"""The measured passes: the real ``Cleaner.run()``, timed as a whole and part by part (store
calls wrapped on the instance), with the round trips it sends, the time Redis spent in
scripts and the server's CPU; each checked against what it had to do."""

from __future__ import annotations

import copy
import statistics
import threading
import time
from typing import Any

from _common import CallTimes, Load, distribution, proc_cpu

from cleaner_parts.loader import Loader
from cleaner_parts.scenario import BATCH, FETCH, Scene, Stalls

#: The store calls of a pass timed as its parts.
PARTS = ("cleaner_due", "worker_tasks", "fields", "stall", "tidy_cancelling", "record_pass",
         "confirm_published")


class RoundTrips:
    """Requests this process's main thread sends to Redis (pipelines and scripts count 1)."""

    def __init__(self) -> None:
        from redis.connection import AbstractConnection

        self.count = 0
        main = threading.get_ident()
        original = AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> Any:
            if threading.get_ident() == main:
                self.count += 1
            return original(conn, command, check_health)  # type: ignore[no-untyped-call]

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


class Passes:
    """Cleaner passes with none stalled and with ``--stalled`` fresh stalled tasks."""

    def __init__(self, scene: Scene, loader: Loader, stalls: Stalls, load: Load) -> None:
        self.scene = scene
        self.loader = loader
        self.stalls = stalls
        self.load = load
        self.rt = RoundTrips()

    def timed_pass(self) -> dict[str, Any]:
        """One real pass, with the time of each part (store calls wrapped on the instance)."""
        from jobbers_celery.lifecycle.cleaner import Cleaner

        scene = self.scene
        j = scene.jobbers
        cleaner = Cleaner(j.store, j.config, j.recorder, j.publisher)
        times = CallTimes()
        store = scene.store
        originals = {m: getattr(store, m) for m in PARTS}
        for m, fn in originals.items():
            setattr(store, m, times.wrap(m, fn))
        cleaner._publish = times.wrap("publish", cleaner._publish)  # type: ignore[method-assign]
        recorder = cleaner.recorder = copy.copy(j.recorder)  # dead letters: timed on a copy
        recorder.dead_letter_stalled = times.wrap(  # type: ignore[method-assign]
            "dead_letter", recorder.dead_letter_stalled)
        cmd0 = scene.client.info("commandstats")
        rt0 = self.rt.count
        cpu0 = sum(proc_cpu(scene.srv.proc.pid))
        try:
            with self.load.span():
                t0 = time.perf_counter()
                report = cleaner.run(by="bench")
                wall = (time.perf_counter() - t0) * 1000
        finally:
            for m in originals:
                delattr(store, m)  # back to the class's methods
        rts = self.rt.count - rt0
        redis_cpu = sum(proc_cpu(scene.srv.proc.pid)) - cpu0
        cmd1 = scene.client.info("commandstats")
        evalsha = {k: (int(v["calls"]) - int(cmd0.get(k, {}).get("calls", 0)),
                       int(v["usec"]) - int(cmd0.get(k, {}).get("usec", 0)))
                   for k, v in cmd1.items() if k in ("cmdstat_evalsha", "cmdstat_eval")}
        parts = {label: 1000 * times.seconds(label) for label in times.calls}
        parts["publish"] = parts.get("publish", 0.0) - parts.pop("confirm_published", 0.0)
        stall_ms = [1000 * s for s in times.calls.get("stall", [])]
        return {
            "wall_ms": wall, "duration_ms": report.duration_ms, "examined": report.examined,
            "stalled": report.stalled, "recovered": len(report.recovered),
            "dead_lettered": len(report.dead_lettered), "kept": report.kept,
            "resumed_at": report.resumed_at.isoformat() if report.resumed_at else None,
            "parts_ms": parts, "stall_calls": len(stall_ms),
            "stall_call_max_ms": max(stall_ms, default=0.0), "round_trips": rts,
            "redis_cpu_ms": redis_cpu * 1000,
            "script_usec": sum(u for _, u in evalsha.values()),
        }

    def none_pass(self) -> dict[str, Any]:
        """One pass with none stalled (it must judge nothing)."""
        r = self.timed_pass()
        if r["examined"] or r["stalled"] or r["kept"]:
            raise RuntimeError(f"a pass with none stalled judged something: {r}")
        time.sleep(0.02)
        return r

    def stalled_pass(self, variant: str, recover: bool) -> dict[str, Any]:
        """One measured pass with ``--stalled`` fresh stalled tasks, checked; then the
        running tasks are topped up and one more (unmeasured) pass must judge nothing."""
        scene = self.scene
        client, store = scene.client, scene.store
        k = scene.keys  # global: the dead letters of the default Redis sink
        ids, dead_wid = self.stalls.prepare(variant, recover)
        dlq0 = client.hlen(k.dead_letters)
        queue = "io" if variant == "hb" else "celery"
        q0 = client.llen(queue)
        r = self.timed_pass()
        n = scene.args.stalled
        want_rec, want_dlq = (n, 0) if recover else (0, n)
        r["dlq_entries_written"] = client.hlen(k.dead_letters) - dlq0
        r["published_by_pass"] = client.llen(queue) - q0
        # what the pass handed over (its publish budget ran out) goes out with the
        # workers' scheduler polls, as it would in a real deployment: not timed here
        scheduler = scene.jobbers.scheduler("bench-scheduler")
        while scheduler.run_once()[0]:
            pass
        r["messages_published"] = client.llen(queue) - q0
        states = {st for (st,) in store.fields(ids, ("state",))}
        r["states_after"] = sorted(s or "missing" for s in states)
        ok = (r["examined"] == n and r["stalled"] == n and r["recovered"] == want_rec
              and r["dead_lettered"] == want_dlq and r["kept"] == 0
              and r["dlq_entries_written"] == want_dlq
              and r["messages_published"] == want_rec
              and r["states_after"] == ["submitted" if recover else "stalled"])
        if dead_wid is not None:
            # forgotten in every shard's copy of the workers set
            pipe = client.pipeline(transaction=False)
            for sk in store.shards.keys:
                pipe.zscore(sk.workers, dead_wid)
            r["dead_worker_forgotten"] = all(x is None for x in pipe.execute())
            ok = ok and r["dead_worker_forgotten"]
        if not ok:
            raise RuntimeError(f"{variant} pass did not do what was expected: {r}")
        # Back to --running live tasks: the stalled ones are terminal (or resubmitted) now.
        self.loader.load("running", n, names=(FETCH if variant == "hb" else BATCH,))
        after = self.timed_pass()  # and the next pass is clean again
        if after["examined"] or after["stalled"]:
            raise RuntimeError(f"the pass after a {variant} pass judged something: {after}")
        return r


def none_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"passes": runs, "wall_ms": distribution([r["wall_ms"] for r in runs]),
            "round_trips": statistics.median(r["round_trips"] for r in runs)}


def stalled_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"passes": runs, "wall_ms": distribution([r["wall_ms"] for r in runs])}
