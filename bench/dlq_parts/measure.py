"""The operator's session and the measuring tools: requests through Django's test
``Client`` as a logged-in staff user (URL routing, middleware, session and user lookups,
permissions, the view and its serializer: everything but an HTTP server), timed; every SQL
statement of one request with its time; ``EXPLAIN ANALYZE`` of those on the jobbers tables."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from _common import Load, PrivateRedis


class QueryLog:
    """Every SQL statement of the wrapped block, with its time (``execute_wrapper``)."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, Any, float]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append((sql, params, time.perf_counter() - t0))

    @contextlib.contextmanager
    def capture(self) -> Iterator[QueryLog]:
        from django.db import connection

        with connection.execute_wrapper(self):
            yield self

    @property
    def seconds(self) -> float:
        return sum(q[2] for q in self.queries)


def explain(sql: str, params: Any) -> list[str]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        return [r[0] for r in cur.fetchall()]


def require_route(path: str) -> str:
    """``path`` if the project routes it (the endpoints come from ``jobbers_django.urls``)."""
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        raise RuntimeError(f"{path} is not routed: is jobbers_django up to date?") from None
    return path


def items_of(body: Any) -> list[Any] | None:
    """The entries of a list response, whatever its envelope."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        for key in ("results", "entries", "items", "data"):
            if isinstance(body.get(key), list):
                return list(body[key])
    return None


def timed(fn: Callable[[], Any], n: int) -> tuple[list[float], Any]:
    out: list[float] = []
    last = None
    for _ in range(n):
        t0 = time.perf_counter()
        last = fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out, last


def explain_jobbers(qlog: QueryLog) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE of each statement on the jobbers tables (one run of each)."""
    out = []
    for sql, params, t in qlog.queries:
        if '"jobbers_' not in sql or not sql.lstrip().upper().startswith("SELECT"):
            continue
        out.append({"sql": sql, "params": params, "ms": 1000 * t,
                    "plan": explain(sql, params)})
    return out


class Session:
    """A run's state: the options, the private Redis, the results so far, the operator's
    logged-in client, the other load per phase, the entries resubmitted (restored at the
    end)."""

    def __init__(self, args: argparse.Namespace, srv: PrivateRedis) -> None:
        from django.db import connection
        from django.test import Client

        self.args = args
        self.srv = srv
        self.res: dict[str, Any] = {}
        self.user = self.operator()
        self.client = Client()
        self.client.force_login(self.user)
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            backend = int(cur.fetchone()[0])
        self.load = Load([srv.proc.pid, backend])
        self.touched: list[str] = []  # entries this run resubmitted (restored at the end)

    @staticmethod
    def operator() -> Any:
        """Staff with the jobbers view permissions and ``resubmit_deadletter``."""
        from django.contrib.auth.models import Permission, User

        user, _ = User.objects.get_or_create(username="bench-operator",
                                             defaults={"is_staff": True})
        user.user_permissions.set(Permission.objects.filter(
            content_type__app_label="jobbers",
            codename__in=["view_deadletterentry", "view_deadletterfailure",
                          "view_failuregroup", "view_deadletteraudit",
                          "resubmit_deadletter", "cancel_task"]))
        return user

    def getter(self, url: str, params: dict[str, Any] | None = None) -> Callable[[], Any]:
        """A GET of ``url`` (with ``params``) as the operator; anything but 200 fails."""
        def get() -> Any:
            resp = self.client.get(url, params)
            if resp.status_code != 200:
                what = f"{url} {params}" if params else url
                raise RuntimeError(f"GET {what}: {resp.status_code} {resp.content[:300]!r}")
            return resp
        return get

    def warm_then_time(self, fn: Callable[[], Any], warm: int, n: int, phase: str
                       ) -> tuple[list[float], Any]:
        """``warm`` untimed calls (connection, caches, imports), then ``n`` timed ones
        counted in ``phase``'s other load."""
        for _ in range(warm):
            fn()
        with self.load.span(phase):
            return timed(fn, n)
