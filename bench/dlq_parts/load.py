"""The load, server-side: ``INSERT ... SELECT`` over ``generate_series`` of the entries,
their per-attempt failure rows and the groups' counters, with the migration's indexes and
constraints dropped for the load and rebuilt, then ``VACUUM ANALYZE``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from dlq_parts import TABLES
from dlq_parts.data import DAYS, make_groups

#: Bump when the generated data changes: a database loaded by another version is reloaded.
LOADER_VERSION = 4


class Phase:
    """Prints how long each loading step took."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        print(f"  {label} ...", end="", flush=True)
        t0 = time.monotonic()
        yield
        dt = self.times[label] = time.monotonic() - t0
        print(f" {dt:.1f} s", flush=True)


ENTRY_SQL = """
WITH th AS (
    SELECT array_agg(cum ORDER BY idx) AS a FROM bench_groups
    WHERE idx < (SELECT max(idx) FROM bench_groups)
), x AS MATERIALIZED (
    SELECT width_bucket(random(), th.a) AS gi, random() AS rt, random() AS rf,
           random() AS rs, random() AS rv, random() AS rc,
           (1 + floor(random() * 100000))::int AS n, (1 + floor(random() * 20))::int AS w
    FROM generate_series(1, %(n)s), th
), y AS MATERIALIZED (
    SELECT x.*,
           now() - (1 - (g.win_a + (g.win_b - g.win_a) * x.rt)) * %(days)s
               * interval '1 day' AS last_at,
           CASE WHEN g.reason <> 'failed' THEN 1
                WHEN x.rf < 0.60 THEN 1 WHEN x.rf < 0.75 THEN 2 WHEN x.rf < 0.85 THEN 3
                ELSE 4 END AS fc
    FROM x JOIN bench_groups g ON g.idx = x.gi
    ORDER BY last_at
)
INSERT INTO jobbers_deadletterentry (
    task_id, task_name, task_version, queue, args, kwargs, options, checkpoint, reason,
    exception_type, exception_message, traceback, failure_count, first_failed_at,
    last_failed_at, worker, attempt, retry_attempt, fingerprint, status, resubmit_count,
    resubmitted_at, discarded_at, publish_pending)
SELECT gen_random_uuid()::text, z.task_name,
       CASE WHEN z.version IS NULL THEN NULL
            WHEN z.rv < 0.2 THEN greatest(1, z.version - 1) ELSE z.version END,
       z.queue,
       jsonb_build_array('catalog-' || z.n, z.n %% 500),
       jsonb_build_object('region', CASE WHEN z.rv < 0.5 THEN 'eu' ELSE 'us' END,
                          'page', z.n %% 977, 'api_token', 'tok_' || md5(z.n::text)),
       jsonb_build_object('queue', z.queue),
       CASE WHEN z.rc < 0.3 THEN jsonb_build_object('row', z.n, 'page', z.n %% 977) END,
       z.reason, z.exception_type, z.msg,
       CASE WHEN z.traceback = '' THEN '' ELSE z.traceback || z.exception_type || ': ' || z.msg
            || E'\\n' END,
       z.fc, z.last_at - (z.fc - 1) * z.retry_s * interval '1 second', z.last_at,
       'celery@worker-' || z.w || '.prod.example.internal', z.fc, z.fc - 1, z.fingerprint,
       CASE WHEN z.rs < 0.07 THEN 'resubmitted' WHEN z.rs > 0.97 THEN 'discarded'
            ELSE 'dead' END,
       CASE WHEN z.rs < 0.07 THEN 1 ELSE 0 END,
       CASE WHEN z.rs < 0.07 THEN least(now(), z.last_at + interval '3 hours') END,
       CASE WHEN z.rs > 0.97 THEN least(now(), z.last_at + interval '5 hours') END,
       false
FROM (SELECT y.*, g.*, replace(replace(g.template, '{n}', y.n::text), '{uuid}',
                               gen_random_uuid()::text) AS msg
      FROM y JOIN bench_groups g ON g.idx = y.gi) z
"""

FAILURE_SQL = """
INSERT INTO jobbers_deadletterfailure (
    entry_id, task_id, attempt, retry_attempt, reason, exception_type, exception_message,
    traceback, worker, failed_at, fingerprint)
SELECT e.id, e.task_id, a, a - 1, e.reason, e.exception_type, e.exception_message,
       e.traceback, e.worker,
       e.last_failed_at - (e.failure_count - a) * (e.last_failed_at - e.first_failed_at)
           / greatest(1, e.failure_count - 1),
       e.fingerprint
FROM jobbers_deadletterentry e CROSS JOIN LATERAL generate_series(1, e.failure_count) a
"""

GROUP_SQL = """
INSERT INTO jobbers_failuregroup (fingerprint, task_name, exception_type, message, frame,
                                  failures, dead, first_seen, last_seen)
SELECT g.fingerprint, g.task_name, g.exception_type, g.message, g.frame, s.failures, s.dead,
       s.first_seen, s.last_seen
FROM (SELECT fingerprint, sum(failure_count) AS failures,
             count(*) FILTER (WHERE status = 'dead') AS dead,
             min(first_failed_at) AS first_seen, max(last_failed_at) AS last_seen
      FROM jobbers_deadletterentry GROUP BY fingerprint) s
JOIN bench_groups g USING (fingerprint)
ORDER BY s.first_seen
"""


def load(entries: int) -> dict[str, Any]:
    """Fill the (migrated, empty) jobbers tables; returns timings and sizes."""
    from django.db import connection

    phase = Phase()
    groups = make_groups()
    total = sum(g.weight for g in groups)
    cum, acc = [], 0.0
    for g in groups:
        acc += g.weight / total
        cum.append(acc)
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        cur.execute("SET work_mem = '256MB'")
        cur.execute("SET maintenance_work_mem = '1GB'")
        for t in TABLES:
            cur.execute(f"TRUNCATE {t} CASCADE")
        # Indexes and unique/foreign-key constraints are built once at the end (much faster
        # than maintaining them row by row); their definitions come from the migration.
        cur.execute("""
            SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
            FROM pg_constraint WHERE conrelid = ANY(%s::regclass[]) AND contype IN ('u', 'f')
            ORDER BY contype DESC""", [list(TABLES)])
        constraints = cur.fetchall()
        cur.execute("""
            SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
            WHERE indrelid = ANY(%s::regclass[]) AND NOT indisprimary
              AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conindid <> 0)
            """, [list(TABLES)])
        indexes = cur.fetchall()
        for table, name, _kind, _def in sorted(constraints, key=lambda c: c[2] != "f"):
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for name, _def in indexes:
            cur.execute(f"DROP INDEX {name}")
        cur.execute("""CREATE TEMP TABLE bench_groups (
            idx int PRIMARY KEY, task_name text, queue text, version int, reason text,
            exception_type text, template text, traceback text, fingerprint text, message text,
            frame text, cum float8, win_a float8, win_b float8, retry_s int)""")
        cur.executemany(
            "INSERT INTO bench_groups VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s)",
            [(g.idx, g.task_name, g.queue, g.version, g.reason, g.exception_type, g.template,
              g.traceback, g.fingerprint, g.message, g.frame, c, g.win_a, g.win_b, g.retry_s)
             for g, c in zip(groups, cum, strict=True)])
        cur.execute("ANALYZE bench_groups")
        with phase(f"{entries:,} entries (INSERT ... SELECT generate_series)"):
            cur.execute(ENTRY_SQL, {"n": entries, "days": DAYS})
        with phase("per-attempt failure rows"):
            cur.execute(FAILURE_SQL)
            failures = cur.rowcount
        with phase("failure groups (counters from the entries)"):
            cur.execute(GROUP_SQL)
            n_groups = cur.rowcount
        with phase(f"{len(indexes)} indexes, {len(constraints)} unique/foreign-key constraints"):
            for _name, definition in indexes:
                cur.execute(definition)
            for table, name, _kind, definition in constraints:  # unique before foreign keys
                cur.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        with phase("VACUUM ANALYZE"):
            for t in TABLES:
                cur.execute(f"VACUUM ANALYZE {t}")
        cur.execute("CREATE TABLE bench_meta (key text PRIMARY KEY, value text)")
        cur.executemany("INSERT INTO bench_meta VALUES (%s, %s)", [
            ("loader_version", str(LOADER_VERSION)), ("entries", str(entries)),
            ("failures", str(failures)), ("groups", str(n_groups)),
            ("loaded_at", time.strftime("%Y-%m-%d %H:%M:%S")),
            ("load_seconds", f"{sum(phase.times.values()):.1f}")])
    return {"seconds": phase.times, "failures": failures, "groups": n_groups}
