"""A step's pre-checks in the sharded layout's global slot, and what it gives back after.

On one Redis a step's own script checks everything at once. Sharded, a step's script runs
in its task's shard, and what every shard shares lives in the global slot, taken there
first, one call each: a capped start's ``max_concurrent`` lease (``conc.lua``) or its key's
fair-share lease (:mod:`~jobbers_celery.store.fairshare`), a publish's unique lock
(``uniq.lua``), a start's rate-limit entry (:mod:`~jobbers_celery.store.ratelimits`). A
step that then does not happen gives back what it took; one that reaches its point frees
what it held (:func:`release_freed`). The steps themselves are in
:mod:`~jobbers_celery.store.steps`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import redis

from jobbers_celery.core.fairshare import DIGEST_LEN, FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import parse_field
from jobbers_celery.store import fairshare, ratelimits
from jobbers_celery.store.base import StepResult
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.sharded import Sharded
from jobbers_celery.store.unique import HOLDING

log = escaped_logger("jobbers.store")

#: How long after its take (sharded layout) a lock whose holder has no record yet still
#: counts as held: its publish's step follows the take at once; a publisher that died in
#: between leaves a lock that frees itself after this.
UQ_STEP_GRACE_MS = 10_000
#: The states a resubmit leaves: a unique task's resubmit takes its lock again.
UQ_AGAIN = frozenset({"completed", "failed", "cancelled", "stalled", "dropped"})


def take_cap_lease(s: Sharded, name: str, task_id: str, spec: dict[str, Any]) -> int:
    """Take the lease of a capped start ``spec`` in the global slot: its name's
    ``max_concurrent`` lease (``conc.lua``), or its key's under fair shares. 1 taken now,
    2 held already, 0 when ``cap`` others hold one."""
    fair = spec.get("fair")
    if fair is not None:
        key = FairKey(str(fair["m"])[:DIGEST_LEN], int(spec["cap"]))
        return fairshare.take(s, name, task_id, key, int(spec["lease_cap_ms"]))
    return int(s._scripts["conc"](keys=[s.keys.concurrency(name)],
                                  args=["take", int(spec["lease_cap_ms"]), int(spec["cap"]),
                                        task_id]))


def lock_of(s: Sharded, sk: Keys, task_id: str, spec: dict[str, Any],
            create: dict[str, str] | None) -> str | None:
    """The unique lock (a record's ``uq`` field) the step ``spec`` takes first: a
    publish's (``create``), or a resubmit's, read from its record (``sk``: its shard)."""
    uq = create.get("uq") if create is not None else None
    if not uq and resubmits(spec):
        uq = cast("str | None", s.client.hget(sk.task(task_id), "uq"))  # a resubmit: again
    return uq


def resubmits(spec: dict[str, Any]) -> bool:
    """Whether the step ``spec`` may bring a finished record back to ``submitted`` (a
    resubmit, a stall recovery): its lock is taken again, and once it applied gets a fresh
    expiry (:func:`renew_unique`)."""
    return spec["to"] == "submitted" and bool(UQ_AGAIN & set(spec["from"]))


def take_unique(s: Sharded, task_id: str, uq: str) -> tuple[str | None, bool]:
    """Take the unique lock ``uq`` (a record's field, see core/unique.py) for ``task_id``
    in the global slot (sharded layout): (``None``, whether this call took it: ``False``
    when ``task_id`` held it already, so a refused step leaves it), else (the id of the
    live copy holding it, ``False``). A holder whose record is gone or past the lock's
    point is taken over. A lock held already keeps its expiry: a resubmit renews it only
    once its step applied (:func:`renew_unique`)."""
    parts = uq.split(":")
    if len(parts) != 3:
        return None, False
    lock, ms = s.keys.unique(parts[2]), parts[1]
    holder, pttl = s._scripts["uniq"](keys=[lock], args=["take", task_id, ms])
    if not holder:
        return None, not int(pttl)
    holder = str(holder)
    state, held = s.client.hmget(s.keys_of(holder).task(holder), "state", "uq")
    field = parse_field(held)
    if state is None and int(ms) - int(pttl) < UQ_STEP_GRACE_MS:
        return holder, False  # taken just now: its step may not have made its record yet
    if state is not None and field is not None and state in HOLDING[field.until]:
        return holder, False
    again, _ = s._scripts["uniq"](keys=[lock], args=["swap", task_id, ms, holder])
    return (str(again) or None), not again


def renew_unique(s: Sharded, task_id: str, uq: str) -> None:
    """After a resubmit (a stall recovery too) applied while ``task_id`` held its lock
    already: the lock's expiry anew (a window starts again), as the step's own take sets
    it on one shard. Lost if the store went away (logged): the lock keeps its expiry."""
    parts = uq.split(":")
    if len(parts) != 3:
        return
    try:
        s._scripts["uniq"](keys=[s.keys.unique(parts[2])], args=["renew", task_id, parts[1]])
    except redis.RedisError as exc:
        log.warning("the unique lock of %s keeps its expiry (not renewed): %s", task_id, exc)


def duplicate(task_id: str, holder: str) -> StepResult:
    """The refusal of a publish whose unique lock another copy holds (sharded layout)."""
    return StepResult(applied=False, previous="missing", now_ms=int(time.time() * 1000),
                      attempt=0, why=f"duplicate:{holder}")


def release_freed(s: Sharded, task_id: str, slot: Any) -> None:
    """Free in the global slot what a step out of its point freed (sharded layout): the
    ended attempt's ``max_concurrent`` lease (its name), and a unique lock (``[name, uq]``).
    The step applied: a store gone meanwhile loses the frees, never its outcome."""
    name, uq = (str(slot[0]), str(slot[1])) if isinstance(slot, list) else (str(slot), "")
    if name:
        s._release_leases([(task_id, name)])
    if uq:
        free_applied(s, task_id, uq)


def free_unique(s: Sharded, task_id: str, uq: str) -> None:
    """Give back the lock :func:`take_unique` took for a step that was refused, or free the
    lock of a step that reached its point (only if it still names ``task_id``)."""
    parts = uq.split(":")
    if len(parts) == 3:
        s._scripts["uniq"](keys=[s.keys.unique(parts[2])], args=["free", task_id])


def free_applied(s: Sharded, task_id: str, uq: str) -> None:
    """:func:`free_unique` after a step that applied (an end, a cancel, a stall verdict):
    a store that went away meanwhile (a failover of the global slot's master) is logged,
    not raised, so that the caller still reports what applied. The key left names a copy
    past its point, which every reader counts as free; it goes at its expiry or at the
    next publish of its key."""
    try:
        free_unique(s, task_id, uq)
    except redis.RedisError as exc:
        log.warning("could not delete the unique lock of %s (it counts as free, and "
                    "expires): %s", task_id, exc)


def rated(s: Sharded, spec: dict[str, Any], name: str, rate: RateKey,
          run: Callable[[], StepResult]) -> StepResult:
    """The start step ``spec`` (sent by ``run``) under ``rate``'s limit (``rate_limit_by``):
    its entry taken first in the global slot (sharded), and given back if the start does
    not happen."""
    taken = ratelimits.prepare(s, spec, name, rate)  # rate_limit_by (store/ratelimits.py)
    try:
        res = run()
    except BaseException:
        if taken:  # not known to have started (the step is sent again: it takes its own)
            ratelimits.give_back(s, name, rate, taken, once=True)
        raise
    if taken and (not res.applied or res.state is not TaskState.STARTED):
        ratelimits.give_back(s, name, rate, taken)  # refused (a duplicate delivery too)
    return res
