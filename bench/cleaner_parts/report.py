"""The cleaner benchmark's targets and report: memory per record, the passes with none and
with ``--stalled`` stalled, part by part, the verdicts; and, for ``--compare-shards``, both
layouts side by side with their ratios."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from _common import Spread, banner, verdict

from cleaner_parts.scenario import STALLED_VARIANTS

#: Targets of issue 3, point 10.
TARGET_NONE_MS = 50.0
TARGET_STALLED_MS = 500.0
TARGET_COMPLETED_BYTES = 1024.0
#: Target of the sharded layout (issue: shards): cleaner passes no more than 5 % slower than
#: with one shard (ratio of the medians); memory per completed record as above.
TARGET_SHARDED_RATIO = 1.05


def print_report(res: dict[str, Any], args: argparse.Namespace) -> bool:
    width = 100
    c, r = res["completed"], res["running"]
    none = res["none"]["wall_ms"]
    shards = res.get("shards", 1)
    banner(width,
           f"SUMMARY  {args.records:,} records ({args.records - args.running:,} completed, "
           f"{args.running:,} running on {args.workers} workers), {args.stalled:,} stalled; "
           f"{shards} shard{'s' if shards > 1 else ''}; "
           f"{os.cpu_count()} CPUs; other load {100 * res['other_load']:.0f}% of the machine")
    print(f"  load   completed {c['seconds']:6.1f} s ({c['records_per_s']:>9,.0f}/s)   "
          f"running {r['seconds']:6.1f} s ({r['records_per_s']:>9,.0f}/s)")
    print("  memory per record (INFO used_memory delta / records; parts from MEMORY USAGE):")
    print(f"    {'':<12}{'total':>8}{'hash':>8}{'indexes':>9}{'other':>8}"
          f"   hash encoding (of 200 sampled); index bytes by key")
    for label, m in (("completed", c), ("running", r)):
        idx = ", ".join(f"{key} {v:.0f}" for key, v in sorted(m["index_bytes_by_key"].items()))
        print(f"    {label:<12}{m['bytes_per_record']:8.0f}{m['hash_bytes']:8.0f}"
              f"{m['index_bytes']:9.0f}{m['other_bytes']:8.0f}   "
              f"{m['hash_encodings']}; {idx}")
    print("  other = what MEMORY USAGE leaves out: the expires entry (completed records), "
          "keyspace hash-table buckets, allocator rounding")
    if res.get("what_if"):
        print("  what-if, memory per completed record (each variant loaded on its own):")
        for label, v in res["what_if"].items():
            print(f"    {label:<48}{v['bytes_per_record']:8.0f} B   hash {v['hash_encoding']}, "
                  f"worker {v['worker']}")
    ok_mem = c["bytes_per_record"] < TARGET_COMPLETED_BYTES
    ok_none = none["median"] < TARGET_NONE_MS
    print()
    print(f"  pass, none stalled ({none['n']} passes): median {none['median']:.2f} ms, "
          f"p95 {none['p95']:.2f} ms, max {none['max']:.2f} ms; "
          f"{res['none']['round_trips']:.0f} round trips")
    print(f"  pass, {args.stalled:,} stalled ({args.reps} passes each; wall time of "
          "Cleaner.run(), then the median of its parts):")
    print(f"    {'variant':<16}{'median':>9}{'max':>9}  {'due':>6}{'wtasks':>7}{'fields':>7}"
          f"{'stall':>7}{'calls':>6}{'max':>6}{'publish':>8}{'DLQ':>7}{'record':>7}  {'RTs':>5}"
          f"{'Lua ms':>7}{'redis CPU':>10}")
    ok_stalled = True
    for label, v in res["stalled"].items():
        w = v["wall_ms"]
        ok_stalled = ok_stalled and w["median"] < TARGET_STALLED_MS
        parts = v["passes"]

        def med(key: str, ps: list[dict[str, Any]] = parts) -> float:
            return statistics.median(p["parts_ms"].get(key, 0.0) for p in ps)

        print(f"    {label:<16}{w['median']:9.1f}{w['max']:9.1f}  {med('cleaner_due'):6.1f}"
              f"{med('worker_tasks'):7.1f}{med('fields'):7.1f}{med('stall'):7.1f}"
              f"{statistics.median(p['stall_calls'] for p in parts):6.0f}"
              f"{statistics.median(p['stall_call_max_ms'] for p in parts):6.1f}"
              f"{med('publish'):8.1f}{med('dead_letter'):7.1f}{med('record_pass'):7.1f}  "
              f"{statistics.median(p['round_trips'] for p in parts):5.0f}"
              f"{statistics.median(p['script_usec'] for p in parts) / 1000:7.1f}"
              f"{statistics.median(p['redis_cpu_ms'] for p in parts):10.0f}")
    print()
    print(f"  target: pass with none stalled < {TARGET_NONE_MS:.0f} ms (median): "
          f"{none['median']:.2f} ms  {verdict(ok_none)}")
    worst = max(v["wall_ms"]["median"] for v in res["stalled"].values())
    print(f"  target: pass with {args.stalled:,} stalled < {TARGET_STALLED_MS:.0f} ms "
          f"(median, worst variant): {worst:.1f} ms  {verdict(ok_stalled)}")
    print(f"  target: completed record < {TARGET_COMPLETED_BYTES:.0f} B: "
          f"{c['bytes_per_record']:.0f} B  {verdict(ok_mem)}")
    if args.stalled != 1000 or args.records != 1_000_000 or args.running != 100_000:
        print("  (not the issue's sizes: 1,000,000 records, 100,000 running, 1,000 stalled)")
    return ok_none and ok_stalled and ok_mem


def print_comparison(results: dict[int, dict[str, Any]], args: argparse.Namespace
                     ) -> tuple[bool, dict[str, Any]]:
    """Both layouts side by side, the ratios (second / first), and the verdicts."""
    a, b = args.compare
    ra, rb = results[a], results[b]
    width = 100
    banner(width,
           f"COMPARISON  S={b} vs S={a} shards: {args.records:,} records, {args.stalled:,} "
           "stalled; each layout in its own process and redis-server, passes interleaved")
    out: dict[str, Any] = {"baseline": a, "compared": b}

    def paired(pa: list[dict[str, Any]], pb: list[dict[str, Any]]) -> Spread:
        return Spread.of([y["wall_ms"] / x["wall_ms"] for x, y in zip(pa, pb, strict=True)])

    def row(label: str, x: float | None = None, y: float | None = None, fmt: str = ".0f",
            ratio: bool = False, spread: Spread | None = None) -> None:
        if x is None or y is None:
            print(f"  {label}")
            return
        cells = f"  {label:<36}{x:10{fmt}}{y:10{fmt}}"
        if ratio:
            cells += f"{y / x:8.3f}"
        if spread is not None:
            cells += f"   {spread.cell('.2f')}"
        print(cells)

    print(f"  {'':<36}{f'S={a}':>10}{f'S={b}':>10}{'ratio':>8}   paired ratios, "
          "median [min-max]")
    row("memory per record (B)")
    for key in ("completed", "running"):
        x, y = ra[key]["bytes_per_record"], rb[key]["bytes_per_record"]
        out[f"{key}_bytes"] = {"a": x, "b": y, "ratio": y / x}
        row(f"  {key}", x, y, ratio=True)
        if key == "completed":
            row("    of which indexes", ra[key]["index_bytes"], rb[key]["index_bytes"])
            row("    of which other", ra[key]["other_bytes"], rb[key]["other_bytes"])
    na, nb = ra["none"], rb["none"]
    x, y = na["wall_ms"]["median"], nb["wall_ms"]["median"]
    sp = paired(na["passes"], nb["passes"])
    out["none"] = {"a": x, "b": y, "ratio": y / x, "paired": vars(sp)}
    ok_none = y / x <= TARGET_SHARDED_RATIO
    row(f"pass, none stalled ({args.passes} each, ms)")
    row("  median", x, y, ".2f", ratio=True, spread=sp)
    row("  p95", na["wall_ms"]["p95"], nb["wall_ms"]["p95"], ".2f")
    row("  max", na["wall_ms"]["max"], nb["wall_ms"]["max"], ".2f")

    def part(res: dict[str, Any], key: str) -> float:
        return statistics.median(p["parts_ms"].get(key, 0.0) for p in res["passes"])

    row("  part cleaner_due (median)", part(na, "cleaner_due"), part(nb, "cleaner_due"), ".2f")
    row("  part record_pass (median)", part(na, "record_pass"), part(nb, "record_pass"), ".2f")
    row("  round trips", na["round_trips"], nb["round_trips"])
    ok_stalled = {}
    row(f"pass, {args.stalled:,} stalled ({args.reps} each, median ms)")
    for _, _, label in STALLED_VARIANTS:
        va, vb = ra["stalled"][label], rb["stalled"][label]
        x, y = va["wall_ms"]["median"], vb["wall_ms"]["median"]
        sp = paired(va["passes"], vb["passes"])
        out[label] = {"a": x, "b": y, "ratio": y / x, "paired": vars(sp)}
        ok_stalled[label] = y / x <= TARGET_SHARDED_RATIO
        row(f"  {label}", x, y, ".1f", ratio=True, spread=sp)
    calls = [statistics.median(p["stall_calls"] for p in r["stalled"]["hb-dlq"]["passes"])
             for r in (ra, rb)]
    row("  stall.lua calls per pass", calls[0], calls[1])
    row("other load (% of the machine)", 100 * ra["other_load"], 100 * rb["other_load"])
    print()
    slack = f"{100 * (TARGET_SHARDED_RATIO - 1):.0f} %"
    r = out["none"]["ratio"]
    print(f"  target: S={b} pass with none stalled at most {slack} slower than S={a} "
          f"(ratio of medians): {r:.3f}  {verdict(ok_none)}")
    for _, _, label in STALLED_VARIANTS:
        r = out[label]["ratio"]
        print(f"  target: S={b} pass with {args.stalled:,} stalled ({label}) at most {slack} "
              f"slower than S={a}: {r:.3f}  {verdict(ok_stalled[label])}")
    x, y = ra["completed"]["bytes_per_record"], rb["completed"]["bytes_per_record"]
    ok_mem = y < TARGET_COMPLETED_BYTES
    print(f"  target: S={b} completed record < {TARGET_COMPLETED_BYTES:.0f} B: {y:.0f} B "
          f"(S={a}: {x:.0f} B, {y - x:+.0f} B)  {verdict(ok_mem)}")
    if args.stalled != 1000 or args.records != 1_000_000 or args.running != 100_000:
        print("  (not the issue's sizes: 1,000,000 records, 100,000 running, 1,000 stalled)")
    out["met"] = ok = ok_none and all(ok_stalled.values()) and ok_mem
    return ok, out
