"""``canvas.py``'s figures: per canvas the enqueue rate of each variant and the ratio of
jobbers' to plain Celery's (paired round by round: the two ran back to back), each as
median [min-max] over the rounds, the CPU per member, and the verdict against the target."""

from __future__ import annotations

from typing import Any

from _common import Spread, verdict

from canvas_parts.rounds import Run

#: jobbers' enqueue rate of a group, chunks or starmap, as a share of plain Celery's.
TARGET_RATIO = 0.9
JUDGED = ("group", "chunks", "starmap")


def print_run(r: Run) -> None:
    note = f"  PROBLEM: {'; '.join(r.problems)}" if r.problems else ""
    records = f" records {r.records}" if r.variant != "plain" else ""
    print(f"  round {r.round} {r.canvas:<8} {r.variant:<8} {r.rate:8.0f} members/s  "
          f"wall {r.wall:6.2f}s  CPU/member: client {r.client_cpu / r.members * 1e6:5.0f} us"
          f" redis {r.redis_cpu / r.members * 1e6:4.0f} us  foreign {r.foreign:4.0%}"
          f"{records}{note}", flush=True)


def summarise(runs: list[Run], canvases: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for canvas in canvases:
        by = {v: {r.round: r for r in runs if r.canvas == canvas and r.variant == v}
              for v in ("plain", "jobbers")}
        rounds = sorted(set(by["plain"]) & set(by["jobbers"]))
        if not rounds:
            continue
        row: dict[str, Any] = {"rounds": len(rounds)}
        for v in ("plain", "jobbers"):
            rs = [by[v][i] for i in rounds]
            row[v] = {"rate": Spread.of([r.rate for r in rs]),
                      "client_us": Spread.of([r.client_cpu / r.members * 1e6 for r in rs]),
                      "redis_us": Spread.of([r.redis_cpu / r.members * 1e6 for r in rs]),
                      "foreign": Spread.of([r.foreign for r in rs])}
        row["ratio"] = Spread.of([by["jobbers"][i].rate / by["plain"][i].rate for i in rounds])
        row["cpu_ratio"] = Spread.of([by["jobbers"][i].cpu_per_member_us
                                      / by["plain"][i].cpu_per_member_us for i in rounds])
        row["problems"] = [p for v in by.values() for r in v.values() for p in r.problems]
        out[canvas] = row
    return out


def print_report(summary: dict[str, dict[str, Any]]) -> bool:
    """The table and the verdict; True if every judged canvas met the target with its
    records complete."""
    print("\nenqueue rate (members/s), CPU per member (us; client + redis-server), median "
          "[min-max] over the rounds;\nratio: jobbers / plain of the same round")
    ok = True
    for canvas, row in summary.items():
        print(f"\n{canvas} ({row['rounds']} rounds)")
        for v in ("plain", "jobbers"):
            f = row[v]
            print(f"  {v:<8} rate {f['rate'].cell('.0f'):<24} client {f['client_us'].cell('.0f')}"
                  f"  redis {f['redis_us'].cell('.0f')}  foreign CPU {f['foreign'].cell('.0%')}")
        judged = canvas in JUDGED
        met = row["ratio"].median >= TARGET_RATIO and not row["problems"]
        ok = ok and (met or not judged)
        target = (f"target >= {TARGET_RATIO}: {verdict(met)}" if judged
                  else "(not judged)")
        print(f"  ratio    rate {row['ratio'].cell('.2f')}  CPU per member "
              f"{row['cpu_ratio'].cell('.2f')}  {target}")
        for problem in row["problems"]:
            print(f"  PROBLEM: {problem}")
    return ok
