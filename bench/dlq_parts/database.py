"""The benchmark's own PostgreSQL database: created, reused when an earlier load matches,
dropped; what is in it, and whether the failure groups' counters agree with the entries."""

from __future__ import annotations

from typing import Any

from _common import ROOT

from dlq_parts import TABLES

PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
#: Databases this script never creates, loads or drops.
PROTECTED = frozenset({"test", "jobbers", "test_jobbers", "postgres", "root", "template0",
                       "template1"})


def pg_connect(dbname: str) -> Any:
    import psycopg

    return psycopg.connect(dbname=dbname, autocommit=True, **PG)  # type: ignore[arg-type]


def loaded_meta(dbname: str) -> dict[str, str] | None:
    """The meta of a complete earlier load of ``dbname``, or None."""
    import psycopg

    try:
        with pg_connect(dbname) as conn:
            if conn.execute("SELECT to_regclass('bench_meta')").fetchone()[0] is None:
                return None
            meta = dict(conn.execute("SELECT key, value FROM bench_meta").fetchall())
            meta["rows_now"] = str(conn.execute(
                "SELECT count(*) FROM jobbers_deadletterentry").fetchone()[0])
            applied = {r[0] for r in conn.execute(
                "SELECT name FROM django_migrations WHERE app = 'jobbers'").fetchall()}
            # a migration applied here that is no longer in the checkout (renamed, dropped
            # while someone worked on it): its schema may be stale, load again
            meta["stale_migrations"] = ",".join(sorted(applied - jobbers_migrations()))
            return meta
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc):
            return None
        raise


def jobbers_migrations() -> set[str]:
    return {p.stem for p in (ROOT / "jobbers_django" / "migrations").glob("[0-9]*.py")}


def recreate_database(dbname: str) -> None:
    if dbname in PROTECTED:
        raise SystemExit(f"refusing to touch database {dbname!r}")
    with pg_connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')


def drop_database(dbname: str) -> None:
    if dbname in PROTECTED:
        raise SystemExit(f"refusing to touch database {dbname!r}")
    with pg_connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def data_summary() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("""SELECT count(*), count(*) FILTER (WHERE status = 'dead'),
                              count(DISTINCT task_name), min(last_failed_at), max(last_failed_at)
                       FROM jobbers_deadletterentry""")
        n, dead, names, oldest, newest = cur.fetchone()
        cur.execute("SELECT count(*) FROM jobbers_deadletterfailure")
        failures = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM jobbers_failuregroup")
        groups = cur.fetchone()[0]
        cur.execute("""SELECT task_name, count(*), max(last_failed_at) FROM jobbers_deadletterentry
                       GROUP BY task_name ORDER BY 2 DESC""")
        per_name = cur.fetchall()
        sizes = {}
        for t in TABLES:
            cur.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", [t, t])
            sizes[t] = cur.fetchone()
    return {"entries": n, "dead": dead, "task_names": names, "failures": failures,
            "groups": groups, "oldest": oldest, "newest": newest, "per_name": per_name,
            "sizes": sizes}


def groups_consistent() -> int:
    """Groups whose ``dead``/``failures`` counters disagree with the entries (should be 0)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("""
            SELECT count(*) FROM jobbers_failuregroup g
            LEFT JOIN (SELECT fingerprint, sum(failure_count) AS failures,
                              count(*) FILTER (WHERE status = 'dead') AS dead
                       FROM jobbers_deadletterentry GROUP BY fingerprint) s USING (fingerprint)
            WHERE g.dead IS DISTINCT FROM s.dead OR g.failures IS DISTINCT FROM s.failures""")
        return int(cur.fetchone()[0])
