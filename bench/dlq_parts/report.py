"""The DLQ benchmark's targets and report: data, list, groups page, charts, resubmits (with
where their time goes), the verdicts; and the short report of ``--only charts``."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from _common import banner, verdict

from dlq_parts import ENTRIES_ADMIN_URL, GROUPS_URL, LIST_URL, RESUBMIT_URL

#: Targets of the issue.
TARGET_LIST_P95_MS = 50.0
TARGET_GROUPS_MS = 200.0
TARGET_RESUBMIT_S = 2.0


def print_plan(title: str, ex: dict[str, Any]) -> None:
    print(f"    {title} ({ex['ms']:.2f} ms as run):")
    sql = " ".join(ex["sql"].split())
    print(f"      {sql[:400]}{' ...' if len(sql) > 400 else ''}")
    for line in ex["plan"]:
        print(f"      | {line}")


def print_charts(res: dict[str, Any]) -> None:
    c = res.get("charts")
    if not c:
        return
    print()
    print("  charts (no target; the groups page above includes its sparkline query):")
    for label in ("recent", "busiest"):
        m = c[label]["ms"]
        print(f"    sparkline query, {label} page of {c[label]['groups']} groups "
              f"({c[label]['failures_24h']:,} failures in the last 24 h): p50 {m['p50']:.1f} ms, "
              f"p95 {m['p95']:.1f} ms, max {m['max']:.1f} ms")
        print_plan(f"sparkline query ({label} page)", c[label]["explain"])
    for key, title in (
            ("groups_page_busiest", f"groups page sorted by failures, GET {GROUPS_URL}?o=-3"),
            ("groups_page_busiest_without_charts", "the same without its sparklines"),
            ("live_page", (f"live page, {c['live_page']['samples']} count samples in Redis, "
                           f"GET {ENTRIES_ADMIN_URL}live/"))):
        m = c[key]["ms"]
        print(f"    {title}: p50 {m['p50']:.1f} ms, p95 {m['p95']:.1f} ms, "
              f"max {m['max']:.1f} ms")


def report(res: dict[str, Any], args: argparse.Namespace) -> bool:
    width = 100
    d = res["data"]
    banner(width,
           f"SUMMARY  {d['entries']:,} entries ({d['dead']:,} dead) over {d['task_names']} task "
           f"names, {d['failures']:,} failure rows, {d['groups']:,} groups; "
           f"{os.cpu_count()} CPUs",
           "  other load (CPU of processes outside the benchmark, share of the machine): "
           + ", ".join(f"{k} {100 * v:.0f}%" for k, v in res["other_load_phases"].items())
           + " (above ~10% the figures are noisy)",
           f"  code: {res['code']}")
    for t, (tbl, idx) in d["sizes"].items():
        print(f"  {t:<28} table {tbl / 2**20:8,.0f} MB   indexes {idx / 2**20:6,.0f} MB")
    per = d["per_name"]
    print(f"  entries per task name: most {per[0][1]:,} ({per[0][0]}), median "
          f"{per[len(per) // 2][1]:,}, least {per[-1][1]:,} ({per[-1][0]})")
    print()
    lst = res["list"]
    via = "GET " + LIST_URL + "?task_name=...&limit=50 (test Client, staff user)"
    print(f"  list, newest first, page of 50: {via}")
    print(f"    {'case':<12}{'n':>5}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}  queries  SQL ms")
    for label, c in lst.items():
        m = c["ms"]
        print(f"    {label:<12}{m['n']:>5}{m['p50']:8.1f}{m['p95']:8.1f}{m['p99']:8.1f}"
              f"{m['max']:8.1f}  {c['queries']:>7}  {c['db_ms']:6.1f}")
    for label in (k for k in lst if k != "unfiltered"):
        for i, ex in enumerate(lst[label]["explain"]):
            print_plan(f"{label} query {i + 1}", ex)
    w = res.get("what_if_list")
    if w:
        print(f"    what-if for {w['task_name']} (EXPLAIN ANALYZE, rolled back):")
        for key, title in (("now", "page query as the endpoint runs it"),
                           ("with_index",
                            "same, with an index (task_name, last_failed_at DESC, id DESC)"),
                           ("ids_first", "ids first through that index, rows by pk")):
            print(f"      {title:<72} {w[key]['ms']:8.2f} ms  {'; '.join(w[key]['scans'])}")
    g = res["groups"]
    print()
    print(f"  groups page: GET {GROUPS_URL} (admin changelist, staff user)")
    m = g["ms"]
    print(f"    {m['n']} requests: p50 {m['p50']:.1f} ms, p95 {m['p95']:.1f} ms, "
          f"p99 {m['p99']:.1f} ms, max {m['max']:.1f} ms; {g['queries']} queries, "
          f"{g['db_ms']:.1f} ms in SQL")
    for i, ex in enumerate(g["explain"]):
        print_plan(f"groups query {i + 1}", ex)
    print_charts(res)
    for label, a in res.get("admin_entries", {}).items():
        m = a["ms"]
        print(f"  for comparison, no target: admin entry list ?task_name={a['task_name']} "
              f"({label}): p50 {m['p50']:.1f} ms, p95 {m['p95']:.1f} ms; {a['queries']} "
              f"queries, {a['db_ms']:.1f} ms in SQL")
    print()
    rs = res["resubmit"]
    print(f"  bulk resubmit of {args.batch:,} dead entries, request to response, POST "
          f"{RESUBMIT_URL}:")
    for kind, runs in rs.items():
        s = [r["seconds"] for r in runs]
        what = ("task_ids (random dead entries over the table)" if kind == "ids"
                else f"task_name={res['resubmit_filter']} (newest dead first), "
                f"limit {args.batch}")
        print(f"    {kind:<7} min {min(s):.3f} s, median {statistics.median(s):.3f} s, "
              f"max {max(s):.3f} s   ({len(s)} runs; {what})")
    for kind, b in res["breakdown"].items():
        print(f"    where the time goes (one more run of the {kind} kind, instrumented, "
              f"{b['seconds']:.3f} s):")
        sql_total = sum(t for _n, t in b["sql"].values())
        print(f"      jobbers step (EVALSHA) {b['step_s']:.3f} s in {b['step_calls']} calls "
              f"({1000 * b['step_s'] / max(1, b['step_calls']):.2f} ms each); Celery publish "
              f"{b['publish_s']:.3f} s in {b['publish_calls']} calls "
              f"({1000 * b['publish_s'] / max(1, b['publish_calls']):.2f} ms each); SQL "
              f"{sql_total:.3f} s in {sum(n for n, _t in b['sql'].values())} statements; "
              f"rest {b['seconds'] - b['step_s'] - b['publish_s'] - sql_total:.3f} s")
        for k, (n, t) in sorted(b["sql"].items(), key=lambda kv: -kv[1][1]):
            print(f"        {k:<42} {n:>5} x  {1000 * t:8.1f} ms")
        print("      slowest statements:")
        for ms, sql in b["slowest_sql"][:3]:
            print(f"        {ms:7.1f} ms  {' '.join(sql.split())[:150]}")
        if b.get("claim_plan"):
            print("      the claim query, explained afterwards on the next entries (rolled back):")
            for line in b["claim_plan"]:
                if "Buffers" not in line and "Planning" not in line:
                    print(f"        | {line}")
    u = res.get("update_cost")
    if u:
        print(f"    the two UPDATEs of {u['claim']['rows']:,} random dead entries (EXPLAIN "
              f"ANALYZE, rolled back; the table has {u['indexes']} indexes, the updates are "
              "not HOT):")
        for label in ("claim", "published"):
            c = u[label]
            print(f"      {label:<10} {c['ms']:7.1f} ms, WAL {c['wal_records']:,} records "
                  f"({c['wal_fpi']:,} full pages, {c['wal_bytes'] / 2**20:.1f} MB), "
                  f"{c['read']:,} blocks read from outside shared_buffers, "
                  f"{c['dirtied']:,} dirtied")
    if res.get("profile"):
        print(f"    cProfile of one more run ({res['profile']['seconds']:.3f} s under the "
              f"profiler): {res['profile']['file']}")
        print("\n".join("      " + ln for ln in res["profile"]["top"].splitlines()[:45]))
    print()
    worst_list = max(c["ms"]["p95"] for k, c in lst.items() if k != "unfiltered")
    ok_list = worst_list < TARGET_LIST_P95_MS
    ok_groups = g["ms"]["p95"] < TARGET_GROUPS_MS
    all_runs = [r["seconds"] for runs in rs.values() for r in runs]
    med = max(statistics.median([r["seconds"] for r in runs]) for runs in rs.values())
    ok_res = med < TARGET_RESUBMIT_S
    print(f"  target: list p95 < {TARGET_LIST_P95_MS:.0f} ms (worst task-name filter): "
          f"{worst_list:.1f} ms  {verdict(ok_list)}")
    print(f"  target: groups page < {TARGET_GROUPS_MS:.0f} ms (p95): {g['ms']['p95']:.1f} ms  "
          f"{verdict(ok_groups)}")
    print(f"  target: {args.batch:,} resubmits < {TARGET_RESUBMIT_S:.0f} s (median, worst "
          f"selection): {med:.3f} s  {verdict(ok_res)}  (max of all runs {max(all_runs):.3f} s)")
    if d["entries"] != 1_000_000 or args.batch != 1000:
        print("  (not the issue's sizes: 1,000,000 entries, 1,000 resubmits)")
    print(f"  failure groups whose dead/failures counters disagree with the entries: "
          f"{res['groups_inconsistent_after_resubmits']} after the resubmits, "
          f"{res['groups_inconsistent_after_restore']} after restoring them")
    return ok_list and ok_groups and ok_res


def print_charts_only(res: dict[str, Any], args: argparse.Namespace) -> None:
    d = res["data"]
    print("=" * 78)
    print(f"  {d['entries']:,} entries, {d['failures']:,} failure rows, {d['groups']:,} groups "
          f"(database {args.db})")
    g = res["groups"]["ms"]
    print(f"  groups page (default order, with its sparklines): GET {GROUPS_URL}: p50 "
          f"{g['p50']:.1f} ms, p95 {g['p95']:.1f} ms; {res['groups']['queries']} queries")
    print_charts(res)
