"""The admin's charts (no target): each group's failures per hour of the last 24 h, the
groups page sorted by failures with and without its sparklines, and the live page with a
full count history in Redis."""

from __future__ import annotations

import json
from typing import Any

from _common import distribution

from dlq_parts import ENTRIES_ADMIN_URL, GROUPS_URL
from dlq_parts.measure import QueryLog, Session, explain, require_route


def charts_phase(s: Session) -> None:
    """The pictures of the admin: each group's failures per hour of the last 24 h (ONE
    ``GROUP BY fingerprint, hour`` query over the groups of the page, index
    ``jobbers_failure_fp_at``), for the default page (most recently seen groups) and the
    worst page (the groups with the most failures); the groups page sorted that way;
    and the live page with a full count history in Redis (its chart reads at most 60
    samples, whatever the number of tasks)."""
    from django.utils import timezone

    from jobbers_django import conf, services
    from jobbers_django.admin import charts
    from jobbers_django.models import FailureGroup

    n = max(10, s.args.group_requests)
    out: dict[str, Any] = {}
    pages = {
        "recent": FailureGroup.objects.order_by("-last_seen", "-id"),
        "busiest": FailureGroup.objects.order_by("-failures", "-id"),
    }
    for label, qs in pages.items():
        fps = list(qs.values_list("fingerprint", flat=True)[:conf.DEFAULT_PAGE_SIZE])
        now = timezone.now()
        # warmed once, as a busy admin would
        times, hourly = s.warm_then_time(
            lambda fps=fps, now=now: charts.hourly_failures(fps, now), 1, n, "charts")
        with QueryLog().capture() as qlog:
            charts.hourly_failures(fps, now)
        [(sql, params, _t)] = qlog.queries
        out[label] = {"ms": distribution(times), "groups": len(fps),
                      "failures_24h": sum(sum(v) for v in hourly.values()),
                      "explain": {"sql": sql, "params": params, "ms": 1000 * _t,
                                  "plan": explain(sql, params)}}
        d = out[label]["ms"]
        print(f"  sparkline query, {label} page ({len(fps)} groups, "
              f"{out[label]['failures_24h']:,} failures in 24 h): p50 {d['p50']:.1f} ms, "
              f"p95 {d['p95']:.1f} ms", flush=True)

    busiest = s.getter(require_route(GROUPS_URL) + "?o=-3")  # sorted by failures, most first
    times, _last = s.warm_then_time(busiest, 3, n, "charts")
    out["groups_page_busiest"] = {"ms": distribution(times)}
    # for comparison: the same page without its sparklines (their cost is the difference)
    real = charts.hourly_failures
    charts.hourly_failures = lambda fps, now, hours=charts.HOURS: {}  # type: ignore[assignment]
    try:
        times, _last = s.warm_then_time(busiest, 3, n, "charts")
    finally:
        charts.hourly_failures = real  # type: ignore[assignment]
    out["groups_page_busiest_without_charts"] = {"ms": distribution(times)}
    # the live page with the count history full (the cap) in the private Redis
    jobbers = services.get_jobbers()
    store = jobbers.store
    now_ms = store.now_ms()
    minute = now_ms - now_ms % 60_000
    store.client.zadd(store.keys.count_history, {
        json.dumps({"at": minute - m * 60_000, "counts": {
            "submitted": m % 17, "started": 8, "completed": 1000 * m, "failed": m}}):
        minute - m * 60_000 for m in range(120)})
    times, last = s.warm_then_time(s.getter(ENTRIES_ADMIN_URL + "live/"), 3, n, "charts")
    if b"<polyline" not in last.content:
        raise RuntimeError("the live page drew no chart")
    out["live_page"] = {"ms": distribution(times), "samples": 120}
    s.res["charts"] = out
    for key in ("groups_page_busiest", "groups_page_busiest_without_charts", "live_page"):
        d = out[key]["ms"]
        print(f"  {key.replace('_', ' ')}: {n} requests, p50 {d['p50']:.1f} ms, "
              f"p95 {d['p95']:.1f} ms", flush=True)
