"""The reads an operator makes: the list endpoint filtered by task name (newest first, page
of 50) with the hard case's what-if, the admin's failure groups page, and, for comparison
only, the admin's entry list filtered by task name."""

from __future__ import annotations

import time
from typing import Any

from _common import distribution

from dlq_parts import ENTRIES_ADMIN_URL, GROUPS_URL, LIST_URL
from dlq_parts.measure import QueryLog, Session, explain, explain_jobbers, items_of, require_route


def list_phase(s: Session, names: dict[str, str]) -> None:
    args = s.args
    url = require_route(LIST_URL)
    cases: list[tuple[str, dict[str, str]]] = [
        (label, {"task_name": name}) for label, name in names.items()]
    cases.append(("unfiltered", {}))
    out: dict[str, Any] = {}
    for label, filters in cases:
        fn = s.getter(url, {**filters, "limit": 50})
        n = args.list_requests if label != "unfiltered" else max(20, args.list_requests // 4)
        times, last = s.warm_then_time(fn, 10, n, "list")
        rows = check_list(last, filters)
        with QueryLog().capture() as qlog:
            t0 = time.perf_counter()
            fn()
            one = time.perf_counter() - t0
        out[label] = {"filters": filters, "ms": distribution(times), "rows": rows,
                      "queries": len(qlog.queries), "db_ms": 1000 * qlog.seconds,
                      "instrumented_ms": 1000 * one,
                      "sql": [(sql, 1000 * t) for sql, _p, t in qlog.queries],
                      "explain": explain_jobbers(qlog)}
        d = out[label]["ms"]
        print(f"  {label:<10} {filters or '(no filter)'}: {n} requests, p50 {d['p50']:.1f} "
              f"ms, p95 {d['p95']:.1f} ms, p99 {d['p99']:.1f} ms, max {d['max']:.1f} ms; "
              f"{rows} rows; {len(qlog.queries)} queries, "
              f"{1000 * qlog.seconds:.1f} ms in SQL", flush=True)
    s.res["list"] = out
    if "incident" in names:
        what_if_list(s, "incident", names["incident"])


def what_if_list(s: Session, label: str, name: str) -> None:
    """The hard case's page query (a) as the endpoint runs it, (b) the same with an index
    that matches its whole ORDER BY, (c) ids first through that index (an index-only
    scan), then the rows by primary key. EXPLAIN ANALYZE, in a rolled-back transaction."""
    from django.db import connection, transaction

    from jobbers_django.models import DeadLetterEntry

    page = next((e for e in s.res["list"][label]["explain"] if "ORDER BY" in e["sql"]),
                None)
    if page is None:
        return
    newest = ("-last_failed_at", "-pk")
    inner = DeadLetterEntry.objects.filter(task_name=name).order_by(*newest) \
        .values("pk")[:51]
    ids_first = DeadLetterEntry.objects.filter(pk__in=inner).order_by(*newest) \
        .defer("traceback")
    sql2, params2 = ids_first.query.sql_with_params()

    def run(sql: str, params: Any) -> dict[str, Any]:
        plan = explain(sql, params)
        ms = next(float(ln.split(":")[1].split()[0]) for ln in plan
                  if ln.startswith("Execution Time"))
        scans = [ln.strip().lstrip("-> ").split(" (")[0] for ln in plan
                 if " using " in ln or "Seq Scan" in ln]
        return {"ms": ms, "scans": scans, "plan": plan}

    out: dict[str, Any] = {"task_name": name, "now": run(page["sql"], page["params"])}
    with transaction.atomic(), connection.cursor() as cur:
        t0 = time.perf_counter()
        cur.execute("CREATE INDEX bench_whatif_name ON jobbers_deadletterentry "
                    "(task_name, last_failed_at DESC, id DESC)")
        out["create_index_s"] = time.perf_counter() - t0
        out["with_index"] = run(page["sql"], page["params"])
        out["ids_first"] = run(sql2, params2)
        out["ids_first_sql"] = sql2
        transaction.set_rollback(True)
    s.res["what_if_list"] = out
    print(f"  what-if ({label}): page query now {out['now']['ms']:.1f} ms "
          f"({'; '.join(out['now']['scans'])}); with an index (task_name, last_failed_at "
          f"DESC, id DESC): {out['with_index']['ms']:.1f} ms "
          f"({'; '.join(out['with_index']['scans'])}); ids first through it: "
          f"{out['ids_first']['ms']:.2f} ms ({'; '.join(out['ids_first']['scans'])})",
          flush=True)


def check_list(last: Any, filters: dict[str, str]) -> int:
    body = last.json()
    rows = items_of(body)
    if rows is None:
        raise RuntimeError(f"unexpected list response: {str(body)[:300]}")
    names = {r.get("task_name") for r in rows if isinstance(r, dict)}
    if "task_name" in filters and names - {filters["task_name"]}:
        raise RuntimeError(f"list filtered by {filters} returned {names}")
    if len(rows) != 50:
        raise RuntimeError(f"list {filters}: {len(rows)} rows, expected a page of 50")
    return len(rows)


def groups_phase(s: Session) -> None:
    args = s.args
    fn = s.getter(require_route(GROUPS_URL))
    times, last = s.warm_then_time(fn, 5, args.group_requests, "groups")
    size = len(last.content)
    with QueryLog().capture() as qlog:
        fn()
    s.res["groups"] = {"ms": distribution(times), "queries": len(qlog.queries),
                       "db_ms": 1000 * qlog.seconds, "size": size,
                       "sql": [(sql, 1000 * t) for sql, _p, t in qlog.queries],
                       "explain": explain_jobbers(qlog)}
    d = s.res["groups"]["ms"]
    print(f"  {args.group_requests} requests: p50 {d['p50']:.1f} ms, p95 {d['p95']:.1f} ms, "
          f"max {d['max']:.1f} ms; {len(qlog.queries)} queries, "
          f"{1000 * qlog.seconds:.1f} ms in SQL; "
          f"{size:,} B of HTML", flush=True)


def admin_entries_phase(s: Session, names: dict[str, str]) -> None:
    """Not a target of the issue, for comparison: the admin's entry list filtered by
    task name (same table, same indexes as the API list)."""
    from django.contrib import admin

    from jobbers_django.models import DeadLetterEntry

    if not admin.site.is_registered(DeadLetterEntry):
        return
    out = {}
    n = max(10, s.args.group_requests // 2)
    for label in ("popular", "incident"):
        if label not in names:
            continue
        fn = s.getter(ENTRIES_ADMIN_URL, {"task_name": names[label]})
        times, _last = s.warm_then_time(fn, 3, n, "groups")
        with QueryLog().capture() as qlog:
            fn()
        out[label] = {"task_name": names[label], "ms": distribution(times),
                      "queries": len(qlog.queries), "db_ms": 1000 * qlog.seconds}
        d = out[label]["ms"]
        print(f"  admin entry list ?task_name= ({label}): {n} requests, p50 {d['p50']:.1f} "
              f"ms, p95 {d['p95']:.1f} ms; {len(qlog.queries)} queries, "
              f"{1000 * qlog.seconds:.1f} ms in SQL", flush=True)
    s.res["admin_entries"] = out
