"""The records of paced resubmits (``run_claim.lua``, ``run_settle.lua``,
``run_control.lua``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.store.scripts import to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["active_runs", "claim_run", "control_run", "create_run", "run", "run_fields",
           "run_keys", "run_unsettled", "runs", "settle_run"]

log = escaped_logger("jobbers.store")

_RUN_PARTS = ("pending", "unsettled", "claiming", "window", "notes", "log")


def run_keys(s: Sharded, run_id: int) -> list[str]:
    """The keys of one paced resubmit, in the order the ``run_*.lua`` scripts take them
    (the last one, the set of runs to drive, is shared)."""
    k = s.keys
    return [k.resubmit_run(run_id),
            *(k.resubmit_run_part(run_id, part) for part in _RUN_PARTS),
            k.resubmit_runs_active]


def create_run(s: Sharded, fields: Mapping[str, str | int | float], members: Sequence[str],
               event: str) -> int:
    """A new run (id from a counter) with ``members`` pending, in one MULTI; returns
    its id. Finished runs older than the retention period leave the index here."""
    k = s.keys
    run_id = int(s.client.incr(k.resubmit_run_seq))
    now = s.now_ms()
    keys = run_keys(s, run_id)
    pipe = s.client.pipeline(transaction=True)
    pipe.hset(keys[0], mapping={"id": str(run_id), "created_at": str(now)})
    pipe.hset(keys[0], mapping=dict(fields.items()))
    for i in range(0, len(members), 1000):
        pipe.rpush(keys[1], *members[i:i + 1000])
    pipe.rpush(keys[6], event)
    pipe.zadd(k.resubmit_runs, {str(run_id): now})
    pipe.zremrangebyscore(k.resubmit_runs, 0, now - s.retention_s * 1000)
    pipe.sadd(k.resubmit_runs_active, str(run_id))
    pipe.execute()
    return run_id


def active_runs(s: Sharded, limit: int) -> list[int]:
    """Up to ``limit`` runs to drive, in a random order (``SRANDMEMBER``: with more
    runs than one pass takes, every run still gets passes)."""
    raw = cast("list[str]", s.client.srandmember(s.keys.resubmit_runs_active, limit))
    return [int(r) for r in raw or ()]


def runs(s: Sharded, limit: int) -> list[int]:
    """Run ids, newest first."""
    raw = cast("list[str]", s.client.zrevrange(s.keys.resubmit_runs, 0, limit - 1))
    return [int(r) for r in raw]


def run(s: Sharded, run_id: int
        ) -> tuple[dict[str, str], int, int, list[str], dict[str, str]] | None:
    """A run's hash, its pending and unsettled counts, its log and its notes (member ->
    ``code|why`` of the entries it skipped or could not publish), in one round trip;
    ``None`` if there is no such run (or it expired)."""
    keys = run_keys(s, run_id)
    pipe = s.client.pipeline(transaction=False)
    pipe.hgetall(keys[0])
    pipe.llen(keys[1])
    pipe.zcard(keys[2])
    pipe.lrange(keys[6], 0, -1)
    pipe.hgetall(keys[5])
    fields, pending, unsettled, events, notes = pipe.execute()
    if not fields:
        return None
    return fields, int(pending), int(unsettled), list(events), dict(notes)


def run_fields(s: Sharded, run_id: int, names: Sequence[str]) -> list[str | None]:
    return cast("list[str | None]", s.client.hmget(s.keys.resubmit_run(run_id),
                                                      list(names)))


def claim_run(s: Sharded, run_id: int, most: int) -> list[str]:
    """Claim what the run's pace allows now (run_claim.lua): each member once, ever."""
    return [str(m) for m in s._run_scripts["run_claim"](
        keys=run_keys(s, run_id)[:4], args=[int(most)])]


def run_unsettled(s: Sharded, run_id: int, limit: int) -> tuple[list[str], dict[str, int]]:
    """The oldest ``limit`` claimed members whose outcome is unknown, and of those,
    the ones whose publish is not confirmed yet (member -> claim ms)."""
    keys = run_keys(s, run_id)
    unsettled = cast("list[str]", s.client.zrange(keys[2], 0, limit - 1))
    if not unsettled:
        return [], {}
    scores = s.client.zmscore(keys[3], unsettled)
    return unsettled, {m: int(score) for m, score in zip(unsettled, scores, strict=True)
                       if score is not None}


def settle_run(s: Sharded, run_id: int, outcomes: Sequence[tuple[str, str, str]],
               window: int) -> tuple[str, str]:
    """Record outcomes, apply the stop rule, see if done (run_settle.lua); the run's
    status and what changed (``""``: nothing)."""
    status, changed = s._run_scripts["run_settle"](
        keys=run_keys(s, run_id),
        args=[to_json([list(o) for o in outcomes]) if outcomes else "[]", int(window),
              s.retention_s * 1000, str(run_id)])
    return str(status), str(changed)


def control_run(s: Sharded, run_id: int, action: str, by: str) -> tuple[bool, str]:
    """Pause, resume or cancel (run_control.lua): whether it moved, and the status now
    (``""``: no such run)."""
    moved, status = s._run_scripts["run_control"](
        keys=run_keys(s, run_id), args=[action, by, s.retention_s * 1000])
    return bool(moved), str(status)
