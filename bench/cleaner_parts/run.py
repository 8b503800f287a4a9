"""One layout's whole run, in order: setup (the deployment's clocks, the ticker, templates,
fidelity check, loading), the measured passes, then the what-if loads and the last figures.
A layout driven by ``--compare-shards`` runs the same steps one command at a time."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from _common import Load, PrivateRedis, code_version

from cleaner_parts.loader import Loader
from cleaner_parts.memory import Memory
from cleaner_parts.passes import Passes, none_summary, stalled_summary
from cleaner_parts.scenario import STALLED_VARIANTS, Scene, Stalls, Ticker
from cleaner_parts.templates import TemplateMaker


class Bench:
    """One layout's benchmark: the scene, its loader, memory and passes; the results."""

    def __init__(self, args: argparse.Namespace, srv: PrivateRedis) -> None:
        self.args = args
        self.srv = srv
        self.scene = Scene(args, srv)
        self.app = self.scene.app
        self.stalls = Stalls(self.scene)
        self.workers = self.scene.make_workers()
        self.loader = Loader(self.scene, self.stalls, self.workers)
        self.load = Load([srv.proc.pid])
        self.memory = Memory(self.loader, self.load)
        self.passes = Passes(self.scene, self.loader, self.stalls, self.load)
        self.ticker: Ticker | None = None
        self.results: dict[str, Any] = {"args": vars(args)}

    def setup(self) -> dict[str, Any]:
        """Everything before the measured passes: templates, fidelity check, loading."""
        args = self.args
        res = self.results
        store = self.scene.store
        print(f"private redis-server on port {self.srv.port} (pid {self.srv.proc.pid}); "
              f"{args.records:,} records, {args.running:,} running on {args.workers} live "
              f"workers, {args.stalled:,} stalled; {os.cpu_count()} CPUs", flush=True)
        res["shards"] = shards = store.shards.count
        print(f"store layout: {shards} shard{'s' if shards > 1 else ''}"
              + (" (the library default for a new dataset)" if args.shards is None else ""))
        res["code"] = code = code_version("jobbers_celery")
        print(f"jobbers_celery at {code}")
        # the cleaner writes a pass's dead letters in one batch when the dispatcher can
        res["dead_letters_batched"] = hasattr(type(self.scene.jobbers.dead_letters),
                                              "send_many")
        print("dead letters of a pass written "
              + ("in one batch (send_many)" if res["dead_letters_batched"] else "one by one"))
        self.scene.up_for_a_day()
        self.ticker = Ticker(self.scene.jobbers, self.workers)
        self.ticker.start()
        self.loader.templates = TemplateMaker(self.scene).make(self.workers[0])
        print("templates (real code) and a loader copy of each with the template's times:")
        for line in self.loader.check_fidelity():
            print("  " + line)
        completed = args.records - args.running
        print(f"loading {completed:,} completed records ...", flush=True)
        res["completed"] = c = self.memory.load_phase("completed", completed)
        print(f"  {c['seconds']:.1f} s ({c['records_per_s']:,.0f} records/s), "
              f"{c['bytes_per_record']:.0f} B/record", flush=True)
        print(f"loading {args.running:,} running records ...", flush=True)
        res["running"] = r = self.memory.load_phase("running", args.running)
        print(f"  {r['seconds']:.1f} s ({r['records_per_s']:,.0f} records/s), "
              f"{r['bytes_per_record']:.0f} B/record", flush=True)
        res["counts"] = {s.value: n for s, n in store.counts().items() if n}
        res["dbsize"] = self.scene.client.dbsize()
        print(f"  state counts {res['counts']}, {res['dbsize']:,} keys", flush=True)
        return res

    def none_pass(self) -> dict[str, Any]:
        return self.passes.none_pass()

    def stalled_pass(self, variant: str, recover: bool) -> dict[str, Any]:
        return self.passes.stalled_pass(variant, recover)

    def finish(self) -> dict[str, Any]:
        """After the measured passes: the what-if loads, and the run's last figures."""
        res = self.results
        if self.args.what_if:
            print(f"what-if: {self.args.what_if:,} completed records per variant ...",
                  flush=True)
            res["what_if"] = self.memory.what_if(self.args.what_if)
        res["other_load"] = self.load.share
        res["ticker_errors"] = self.ticker.errors if self.ticker else 0
        res["used_memory_end"] = self.memory.used_memory()
        return res

    def run(self) -> dict[str, Any]:
        args = self.args
        res = self.setup()
        print(f"{args.passes} passes with none stalled ...", flush=True)
        res["none"] = none_summary([self.none_pass() for _ in range(args.passes)])
        w = res["none"]["wall_ms"]
        print(f"  median {w['median']:.2f} ms, p95 {w['p95']:.2f} ms, max {w['max']:.2f} ms",
              flush=True)
        res["stalled"] = {}
        for variant, recover, label in STALLED_VARIANTS:
            print(f"{args.reps} passes with {args.stalled:,} stalled ({label}) ...",
                  flush=True)
            res["stalled"][label] = v = stalled_summary(
                [self.stalled_pass(variant, recover) for _ in range(args.reps)])
            print("  " + ", ".join(f"{p['wall_ms']:.1f} ms" for p in v["passes"]),
                  flush=True)
        return self.finish()


def shut_down(bench: Bench | None, srv: PrivateRedis) -> None:
    """Stop the ticker and the app of ``bench`` (if it got that far) and its Redis."""
    if bench is not None:
        if bench.ticker is not None:
            bench.ticker.stop()
        with contextlib.suppress(Exception):
            bench.app.close()
    srv.stop()
