"""Bulk resubmits through the API, as an operator makes them: by random ids and by task
name, timed from request to response and checked (the audit row, the broker's messages, the
task records, the rows); one more of each split into its parts (SQL, the jobbers step,
Celery's publish), the claim's two ``UPDATE``s explained, an optional cProfile; and the
entries resubmitted made dead again at the end."""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import pstats
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import CallTimes

from dlq_parts import RESUBMIT_URL
from dlq_parts.data import QUEUES
from dlq_parts.measure import QueryLog, Session, explain, require_route


class Resubmits:
    """The resubmit phase of a session, through ``bench/dlq_app.py`` (jobbers installed,
    the Django sink, nobody consuming) on the private Redis."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def pick_ids(self, n: int) -> list[str]:
        """``n`` dead entries spread over the whole table (random primary keys)."""
        from django.db import connection

        rng = random.Random()
        with connection.cursor() as cur:
            cur.execute("SELECT min(id), max(id) FROM jobbers_deadletterentry")
            lo, hi = cur.fetchone()
            ids: list[str] = []
            seen = set(self.s.touched)
            while len(ids) < n:
                cur.execute("SELECT task_id FROM jobbers_deadletterentry "
                            "WHERE id = ANY(%s) AND status = 'dead'",
                            [[rng.randint(lo, hi) for _ in range(2 * n)]])
                for (tid,) in cur.fetchall():
                    if tid not in seen and len(ids) < n:
                        seen.add(tid)
                        ids.append(tid)
        return ids

    def resubmit_once(self, kind: str, task_name: str, n: int,
                      around: Callable[[], Any] | None = None) -> dict[str, Any]:
        """One bulk resubmit, timed from request to response, then checked: one message
        per entry in the broker, the task records ``submitted``, the rows resubmitted.
        ``around``: a context manager factory wrapping the request only (instruments)."""
        from jobbers_django.models import DeadLetterAudit, DeadLetterEntry, Status

        url = require_route(RESUBMIT_URL)
        if kind == "ids":
            ids = self.pick_ids(n)
            body: dict[str, Any] = {"task_ids": ids}
        else:
            ids = []
            body = {"task_name": task_name, "limit": n}
        before = self.redis_counts()
        last_audit = DeadLetterAudit.objects.order_by("-id").values_list("id", flat=True).first()
        with around() if around is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            resp = self.s.client.post(url, data=json.dumps(body), content_type="application/json")
            seconds = time.perf_counter() - t0
        if resp.status_code != 200:
            raise RuntimeError(f"POST {url}: {resp.status_code} {resp.content[:500]!r}")
        answer: Any = resp.json()
        # which entries were resubmitted: the audit row the request wrote
        audits = list(DeadLetterAudit.objects.filter(id__gt=last_audit or 0))
        if len(audits) != 1:
            raise RuntimeError(f"{len(audits)} audit rows written by one resubmit request")
        acted = list(audits[0].acted_ids)
        if kind == "ids" and set(acted) != set(ids):
            raise RuntimeError(f"resubmitted {len(acted)} of the {len(ids)} ids asked for "
                               f"(answer: {str(answer)[:300]})")
        if len(acted) != n:
            raise RuntimeError(f"{kind}: resubmitted {len(acted)} entries, expected {n} "
                               f"(answer: {str(answer)[:300]})")
        self.s.touched += acted
        published_answer = answer.get("published") if isinstance(answer, dict) else None
        if published_answer is not None and sorted(published_answer) != sorted(acted):
            raise RuntimeError(f"the answer lists {len(published_answer)} published of "
                               f"{len(acted)} resubmitted")
        # the broker: one message per entry, with its id, in its queue's list
        published: list[str] = []
        for q in QUEUES:
            for raw in self.redis.lrange(q, 0, -1):
                published.append(json.loads(raw)["headers"]["id"])
            self.redis.delete(q)
        states = [s for (s,) in self.jobbers.store.fields(acted, ("state",))]
        ok_rows = DeadLetterEntry.objects.filter(
            task_id__in=acted, status=Status.RESUBMITTED, publish_pending=False).count()
        after = self.redis_counts()
        check = {
            "messages": len(published),
            "messages_match": sorted(published) == sorted(acted),
            "submitted_records": states.count("submitted"),
            "submitted_delta": after.get("submitted", 0) - before.get("submitted", 0),
            "rows_resubmitted": ok_rows,
        }
        if not (check["messages_match"] and check["submitted_records"] == n
                and check["rows_resubmitted"] == n and check["submitted_delta"] == n):
            raise RuntimeError(f"{kind} resubmit did not do what was expected: {check}")
        return {"kind": kind, "seconds": seconds, "n": n,
                "answer_keys": sorted(answer) if isinstance(answer, dict) else None, **check}

    def redis_counts(self) -> dict[str, int]:
        return {s.value: c for s, c in self.jobbers.counts().items()}

    def resubmit_phase(self, task_name: str) -> None:
        import dlq_app
        import redis

        args = self.s.args
        self.s.res["resubmit_filter"] = task_name
        self.jobbers = dlq_app.jobbers
        self.redis = redis.Redis.from_url(self.s.srv.url)
        # warm up (not timed): Lua scripts loaded, Celery's producer pool and connections
        self.resubmit_once("ids", task_name, 20)
        runs: dict[str, list[dict[str, Any]]] = {"ids": [], "filter": []}
        for i in range(args.rounds):
            for kind in ("ids", "filter"):
                with self.s.load.span("resubmit"):
                    run = self.resubmit_once(kind, task_name, args.batch)
                runs[kind].append(run)
                print(f"  round {i + 1} {kind:<6}: {run['seconds']:.3f} s "
                      f"({run['messages']} messages, {run['submitted_records']} records "
                      f"submitted)", flush=True)
        self.s.res["resubmit"] = runs
        for kind in ("ids", "filter"):
            self.breakdown(kind, task_name)
        self.update_cost()
        if args.profile:
            self.profile(task_name)

    def breakdown(self, kind: str, task_name: str) -> None:
        """One more resubmit of each kind (not counted above), instrumented: time in SQL,
        in the jobbers step (one EVALSHA per task), in Celery's publish, and the rest."""
        from jobbers_celery.lifecycle import payload

        jobbers = self.jobbers
        times = CallTimes()
        original_step, original_publish = jobbers.store.step, payload.republish
        qlog = QueryLog()
        jobbers.store.step = times.wrap("step", original_step)
        payload.republish = times.wrap("publish", original_publish)
        try:
            run = self.resubmit_once(kind, task_name, self.s.args.batch, around=qlog.capture)
        finally:
            del jobbers.store.step
            payload.republish = original_publish
        by_kind: dict[str, list[float]] = {}
        for sql, _p, t in qlog.queries:
            head = sql.lstrip().split(None, 1)[0].upper()
            table = next((tb for tb in ("jobbers_deadletterentry", "jobbers_failuregroup",
                                        "jobbers_deadletteraudit", "django_session",
                                        "auth_user", "auth_permission") if tb in sql), "other")
            by_kind.setdefault(f"{head} {table}", []).append(t)
        self.s.res.setdefault("breakdown", {})[kind] = {
            "seconds": run["seconds"], "step_s": times.seconds("step"),
            "step_calls": times.count("step"), "publish_s": times.seconds("publish"),
            "publish_calls": times.count("publish"),
            "sql": {k: (len(v), sum(v)) for k, v in by_kind.items()},
            "slowest_sql": sorted(((1000 * t, s[:300]) for s, _p, t in qlog.queries),
                                  reverse=True)[:5],
        }
        # the claim (SELECT ... FOR UPDATE SKIP LOCKED), explained now on the next dead
        # entries of the same selection (rolled back)
        from django.db import transaction

        claim = next(((q, p) for q, p, _t in qlog.queries if "FOR UPDATE" in q), None)
        if claim is not None and kind == "filter":
            with transaction.atomic():
                plan = explain(*claim)
                transaction.set_rollback(True)
            self.s.res["breakdown"][kind]["claim_plan"] = plan

    def profile(self, task_name: str) -> None:
        prof = cProfile.Profile()

        @contextlib.contextmanager
        def profiled() -> Iterator[None]:
            prof.enable()
            try:
                yield
            finally:
                prof.disable()

        run = self.resubmit_once("ids", task_name, self.s.args.batch, around=profiled)
        path = Path(self.s.args.profile)
        path.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(path / "resubmit.prof")
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        buf2 = io.StringIO()
        pstats.Stats(prof, stream=buf2).sort_stats("cumulative").print_stats(30)
        self.s.res["profile"] = {"seconds": run["seconds"], "file": str(path / "resubmit.prof"),
                               "top": buf.getvalue(), "cumulative": buf2.getvalue()}

    def update_cost(self) -> None:
        """EXPLAIN (ANALYZE, WAL) of the service's two UPDATEs of a resubmit (claim: status,
        counters, publish_pending; after the publish: publish_pending off) on 1,000 random
        dead entries, in a transaction that is rolled back."""
        from django.db import connection, transaction

        from jobbers_django.models import DeadLetterEntry

        ids = self.pick_ids(self.s.args.batch)
        pks = list(DeadLetterEntry.objects.filter(task_id__in=ids).values_list("pk", flat=True))
        out = {}
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_index WHERE indrelid = "
                        "'jobbers_deadletterentry'::regclass")
            out["indexes"] = int(cur.fetchone()[0])
            for label, sets in (
                ("claim", ("status = 'resubmitted', resubmit_count = resubmit_count + 1, "
                           "resubmitted_at = now(), publish_pending = true")),
                ("published", "publish_pending = false"),
            ):
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) UPDATE "
                            f"jobbers_deadletterentry SET {sets} WHERE id = ANY(%s)", [pks])
                raw = cur.fetchone()[0]
                doc = (json.loads(raw) if isinstance(raw, str) else raw)[0]
                plan = doc["Plan"]
                out[label] = {"ms": doc["Execution Time"], "rows": len(pks),
                              "wal_records": plan.get("WAL Records"),
                              "wal_fpi": plan.get("WAL FPI"),
                              "wal_bytes": plan.get("WAL Bytes"),
                              "read": plan.get("Shared Read Blocks"),
                              "dirtied": plan.get("Shared Dirtied Blocks")}
            transaction.set_rollback(True)
        self.s.res["update_cost"] = out


def restore(s: Session) -> None:
    """Entries this run resubmitted are dead again (and their groups' counters), so the
    next run measures the same data."""
    from django.db import connection, transaction

    if not s.touched:
        return
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("""
            WITH r AS (
                UPDATE jobbers_deadletterentry SET status = 'dead', resubmit_count = 0,
                       resubmitted_at = NULL, publish_pending = false
                WHERE task_id = ANY(%s) AND status = 'resubmitted' RETURNING fingerprint)
            UPDATE jobbers_failuregroup g SET dead = g.dead + c.n
            FROM (SELECT fingerprint, count(*) AS n FROM r GROUP BY fingerprint) c
            WHERE g.fingerprint = c.fingerprint""", [s.touched])
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE jobbers_deadletterentry")
        cur.execute("VACUUM ANALYZE jobbers_failuregroup")
