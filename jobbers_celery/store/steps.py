"""The lifecycle steps: each one Lua call, one round trip (``transition.lua``,
``complete.lua``, ``cancel.lua``).

The allowed source states of each step come from :mod:`jobbers_celery.core.states`, so the
scripts compare-and-set against the same table that the Python code documents. One function
per kind of transition, typed: what jobbers' recorder calls. Each builds the spec the script
reads (the same keys, the same encoding as the general form :func:`step`, which tests and
tools use) and runs it through ``FastScript``; the key layout of each shape is worked out
once. The sharded layout's pre-checks in the global slot are in
:mod:`~jobbers_celery.store.prechecks`, a bulk publish's batch in
:mod:`~jobbers_celery.store.stepbatch`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any, cast

from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.search import MAX_PER_VALUE
from jobbers_celery.core.states import TaskState, allowed_from
from jobbers_celery.core.workflow import WORKFLOW_CANCELLED, aliases
from jobbers_celery.store import fairshare, prechecks, ratelimits, stepbatch
from jobbers_celery.store.base import (
    CancelOutcome,
    Giver,
    ResultWrite,
    StepResult,
)
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.parts import StepStore
from jobbers_celery.store.scripts import EXPIRY_SLACK_S, to_json
from jobbers_celery.store.sharded import Sharded
from jobbers_celery.store.stepbatch import submit_many

__all__ = ["cancel", "complete", "end", "epoch", "start", "step", "submit", "submit_many",
           "unstarted"]

log = escaped_logger("jobbers.store")

#: The fixed shapes of the typed transitions (worked out once, not per step).
_FROM_STARTED = (TaskState.STARTED,)
_FROM_SUBMITTED = (TaskState.SUBMITTED,)
_START_TARGETS = frozenset({TaskState.STARTED, TaskState.CANCELLED})
_CAPPED_START_TARGETS = _START_TARGETS | {TaskState.SCHEDULED}
_COMPLETED = frozenset({TaskState.COMPLETED})
_START_RETURNS = ("ckpt", "queue")


def submit(
    s: StepStore,
    task_id: str,
    *,
    sources: Iterable[TaskState],
    reason: str,
    name: str | None = None,
    create: dict[str, str] | None = None,
    fields: dict[str, str] | None = None,
    delete: Sequence[str] = (),
    lease_ms: int | None = None,
    ret: Sequence[str] = (),
    later: tuple[int, str] | None = None,
    fair: FairKey | None = None,
    need: str | None = None,
) -> StepResult:
    """``-> submitted`` from ``sources``: a publish (``create`` makes the record if
    missing), a worker's late record of one, or a resubmit (``lease_ms``: a publish
    lease the publisher confirms). ``later`` (delay in ms, reason): then ``submitted ->
    scheduled`` in the same script, a first publish with a delay (``state`` says
    ``scheduled`` when both applied). ``fair``: a publish under fair shares, parked the
    same way when its key has no room (store/fairshare.py); ``state`` says which.
    ``need``: see :func:`step`."""
    if fair is not None and name:
        sharded = cast("Sharded", s)
        if sharded.sharded:  # decided in the global slot first
            admitted, counted = fairshare.admit(sharded, name, task_id, fair)
            if not admitted:
                later = (fairshare.PARK_BACKSTOP_MS, fair.parked_reason)
            done = False
            try:
                res = s.step(task_id, TaskState.SUBMITTED, sources=sources, create=create,
                             set_fields=fields, delete=delete, lease_ms=lease_ms,
                             reason=reason, ret=ret, name=name, later=later, need=need)
                done = res.applied or res is stepbatch.BATCHED
                return res
            finally:
                if counted and not done:
                    fairshare.withdraw(sharded, name, task_id, fair)
        else:
            token = _fair_publish.set(fairshare.publish_spec(sharded, name, fair))
            try:
                return s.step(task_id, TaskState.SUBMITTED, sources=sources, create=create,
                              set_fields=fields, delete=delete, lease_ms=lease_ms,
                              reason=reason, ret=ret, name=name, later=later, need=need)
            finally:
                _fair_publish.reset(token)
    return s.step(task_id, TaskState.SUBMITTED, sources=sources, create=create,
                  set_fields=fields, delete=delete, lease_ms=lease_ms, reason=reason,
                  ret=ret, name=name, later=later, need=need)


#: Set by :func:`submit` for a fair-share publish on one shard: :func:`step` puts it in the
#: spec (``fairpub``), where the submit step decides whether it is parked.
_fair_publish: ContextVar[dict[str, Any] | None] = ContextVar("jobbers_fair_publish",
                                                              default=None)


def start(
    s: Sharded,
    task_id: str,
    *,
    name: str,
    worker: str | None,
    wid: str,
    heartbeat_ms: int | None,
    cap: int | None,
    lease_cap_ms: int,
    defer_ms: int,
    fields: dict[str, str],
    rate: RateKey | None = None,
    fair: FairKey | None = None,
) -> StepResult:
    """``submitted -> started`` by worker incarnation ``wid`` (or ``scheduled``, past a
    ``cap`` of running tasks of this name, deferred ``defer_ms``, or over ``rate``'s limit
    until its key has room, or past ``fair``'s cap of its key, parked: see
    store/fairshare.py; or ``cancelled`` if a cancellation is pending). Returns the
    record's ``ckpt`` and ``queue``."""
    src_list, src = _sources(s, TaskState.STARTED, None)
    spec: dict[str, Any] = {"id": task_id, "to": "started", "from": src_list,
                            "ttl": s.retention_s + EXPIRY_SLACK_S}
    if fields:
        spec["set"] = fields
    spec["start"] = True
    if wid:
        spec["wid"] = wid
    if heartbeat_ms:
        spec["hb_ms"] = int(heartbeat_ms)
    targets = _START_TARGETS
    if cap:
        spec.update(cap=int(cap), lease_cap_ms=int(lease_cap_ms), defer_ms=int(defer_ms))
        targets = _CAPPED_START_TARGETS
        if fair is not None:  # the cap is per key (fair shares)
            spec.update(cap=fair.cap, fair=fairshare.spec(s, name, fair))
    spec["cancellable"] = True
    if worker:
        spec["worker"] = worker
    spec["ret"] = list(_START_RETURNS)
    if rate is None:
        return _run(s, task_id, TaskState.STARTED, src | targets, spec, wid, name, None,
                    None, _START_RETURNS, None, False)
    return prechecks.rated(s, spec, name, rate, lambda: _run(
        s, task_id, TaskState.STARTED, src | _CAPPED_START_TARGETS, spec, wid, name,
        None, None, _START_RETURNS, None, False))  # rate_limit_by: its entry first


def complete(
    s: Sharded,
    task_id: str,
    fence: int,
    *,
    name: str,
    worker: str | None,
    wid: str,
    fields: dict[str, str],
    delete: Sequence[str],
    write_result: ResultWrite | None,
    reason: str | None = None,
) -> StepResult:
    """``started -> completed`` of attempt ``fence``, dropping the ``delete`` fields;
    ``write_result``: Celery's result written by the same script, only if it applies
    (:attr:`StepResult.result_written`); ``reason`` for the history (an ``Ignore``)."""
    src_list, src = _sources(s, TaskState.COMPLETED, _FROM_STARTED)
    spec: dict[str, Any] = {"id": task_id, "to": "completed", "from": src_list,
                            "ttl": s.retention_s + EXPIRY_SLACK_S, "fence": fence}
    if fields:
        spec["set"] = fields
    if delete:
        spec["del"] = list(delete)
    if worker:
        spec["worker"] = worker
    if reason:
        spec["reason"] = reason
    return _run(s, task_id, TaskState.COMPLETED, src | _COMPLETED, spec, wid, name,
                None, write_result, (), fence, False)


def end(
    s: StepStore,
    task_id: str,
    to: TaskState,
    *,
    fence: int | None = None,
    wid_fence: str | None = None,
    wid: str,
    name: str,
    worker: str | None,
    reason: str,
    fields: dict[str, str] | None = None,
    ret: Sequence[str] = (),
    cancellable: bool = False,
    cancel_reason: str | None = None,
    delay_ms: int | None = None,
    lease_ms: int | None = None,
    expect_refusal: bool = False,
    giver: Giver | None = None,
) -> StepResult:
    """``started -> to`` (failed, cancelled, stalled, scheduled after ``delay_ms``, or
    unsubmitted, with a publish lease ``lease_ms``) of the attempt ``fence`` (in the
    pool) or of whichever attempt worker incarnation ``wid_fence`` runs (its main
    process). ``cancellable``: a pending cancellation ends it ``cancelled`` instead.
    ``giver``: a take-back, applied only if ``wid_fence`` is gone (see :meth:`step`)."""
    return s.step(task_id, to, sources=_FROM_STARTED, fence=fence, wid_fence=wid_fence,
                  set_fields=fields, wid=wid, cancellable=cancellable,
                  cancel_reason=cancel_reason, delay_ms=delay_ms, lease_ms=lease_ms,
                  worker=worker, reason=reason, ret=ret, name=name,
                  expect_refusal=expect_refusal, giver=giver)


def unstarted(
    s: StepStore,
    task_id: str,
    to: TaskState,
    *,
    reason: str,
    worker: str | None = None,
    fields: dict[str, str] | None = None,
    ret: Sequence[str] = (),
) -> StepResult:
    """``submitted -> to`` of a message that is not run here: ``dropped`` (counts an
    attempt, so that its dead letter has its own attempt number) or ``cancelled``."""
    return s.step(task_id, to, sources=_FROM_SUBMITTED, set_fields=fields,
                  bump=to is TaskState.DROPPED, worker=worker, reason=reason, ret=ret)


def step(
    s: Sharded,
    task_id: str,
    to: TaskState,
    *,
    sources: Iterable[TaskState] | None = None,
    fence: int | None = None,
    wid_fence: str | None = None,
    create: dict[str, str] | None = None,
    set_fields: dict[str, str] | None = None,
    delete: Sequence[str] = (),
    start: bool = False,
    bump: bool = False,
    wid: str | None = None,
    heartbeat_ms: int | None = None,
    cap: int | None = None,
    lease_cap_ms: int = 60_000,
    defer_ms: int = 1000,
    cancellable: bool = False,
    cancel_reason: str | None = None,
    delay_ms: int | None = None,
    lease_ms: int | None = None,
    worker: str | None = None,
    reason: str | None = None,
    ret: Sequence[str] = (),
    name: str | None = None,
    write_result: ResultWrite | None = None,
    expect_refusal: bool = False,
    later: tuple[int, str] | None = None,
    giver: Giver | None = None,
    gone_fence: bool = False,
    need: str | None = None,
) -> StepResult:
    """The general form of a step, every option at hand: for tests and tools that set
    up records; jobbers itself calls the typed transitions above (through its recorder).

    Applies ``-> to`` atomically if the task is in one of ``sources`` (default: the
    table). ``sources`` may narrow the table's sources, never widen them. ``wid`` is the
    worker incarnation taking part (the one starting the task, or the one it ran on);
    ``name`` is the task name, needed with ``cap`` and whenever a capped task leaves
    ``started``. With ``cancellable`` (or ``cap``) the step may end elsewhere than
    ``to``: read :attr:`StepResult.state`. ``write_result``: also write Celery's result
    in the same script if (and only if) the step applies. ``expect_refusal``: a refusal
    is routine for this caller (logged at debug, still counted). ``bump``: count an
    attempt without starting (drops), so each dead letter has its own attempt number.
    ``later``: see :meth:`submit`.

    ``giver`` (with ``wid_fence``): the step takes back a start that worker incarnation
    holds, named by a message it gave back; applied only if that incarnation is gone
    (not seen for ``giver.gone_ms``, counted from the end of an outage) or its own
    liveness refresh said it does not run that attempt, else refused ``giver_alive``
    (ask again later: that refresh may still come) or ``giver_runs_it``. ``gone_fence`` (with ``fence``):
    applied only to an attempt its own worker said it does not run (the cleaner's
    verdict "gone"). Both are checked in the step itself, never read first.

    ``need``: a field of ``ret`` the caller cannot go on without (a resubmit, its
    payload): absent from the record, the step is refused ``no_<field>``, atomically with
    the read, so that a caller never applies a step and then finds the field gone (the
    record's payload dropped meanwhile because its dead-letter entry holds it).
    """
    from_list, src = _sources(s, to, sources)
    spec: dict[str, Any] = {
        "id": task_id,
        "to": to.value,
        "from": from_list,
        "ttl": s.retention_s + EXPIRY_SLACK_S,
    }
    targets = {to}
    if fence is not None:
        spec["fence"] = fence
    if wid_fence is not None:
        spec["wid_fence"] = wid_fence
    if giver is not None:
        if wid_fence is None:
            raise ValueError("giver: only with wid_fence (the giver)")
        spec["giver"] = {"gone_ms": giver.gone_ms, "settle_ms": giver.settle_ms}
    if gone_fence:
        if fence is None:
            raise ValueError("gone_fence: only with fence (the attempt)")
        spec["gone_fence"] = True
    if create is not None:
        spec["create"] = create
    if set_fields:
        spec["set"] = set_fields
    if delete:
        spec["del"] = list(delete)
    if start:
        spec["start"] = True
        if wid:
            spec["wid"] = wid
        if heartbeat_ms:
            spec["hb_ms"] = int(heartbeat_ms)
        if cap:
            spec.update(cap=int(cap), lease_cap_ms=int(lease_cap_ms),
                        defer_ms=int(defer_ms))
            targets.add(TaskState.SCHEDULED)
    if bump:
        spec["bump"] = True
    if cancellable:
        spec["cancellable"] = True
        targets.add(TaskState.CANCELLED)
        if cancel_reason:
            spec["cancel_reason"] = cancel_reason
    if delay_ms is not None:
        spec["delay_ms"] = int(delay_ms)
    if lease_ms is not None:
        spec["lease_ms"] = int(lease_ms)
    if worker:
        spec["worker"] = worker
    if reason:
        spec["reason"] = reason
    if ret:
        spec["ret"] = list(ret)
    if need is not None:
        if need not in ret:
            raise ValueError("need: a field of ret")
        spec["need"] = need
    if create is not None and create.get("wf"):
        targets.add(TaskState.CANCELLED)  # a member of a cancelled workflow
    if later is not None:
        if to is not TaskState.SUBMITTED or TaskState.SUBMITTED not in allowed_from(
                TaskState.SCHEDULED):
            raise ValueError("later: only after a step to submitted")
        spec["later"] = {"delay_ms": int(later[0]), "reason": later[1]}
        targets.add(TaskState.SCHEDULED)
    fairpub = _fair_publish.get() if to is TaskState.SUBMITTED else None
    if fairpub is not None:
        spec["fairpub"] = fairpub
        targets.add(TaskState.SCHEDULED)
    return _run(s, task_id, to, src.union(targets), spec, wid, name, create,
                write_result, ret, fence, expect_refusal)


def _run(s: Sharded, task_id: str, to: TaskState, states: frozenset[TaskState] | set[TaskState],
    spec: dict[str, Any], wid: str | None, name: str | None,
    create: dict[str, str] | None, write_result: ResultWrite | None, ret: Sequence[str],
    fence: int | None, expect_refusal: bool,
) -> StepResult:
    """Run the step ``spec`` (one round trip): the keys of ``states``' indexes, the
    record, and what ``create``/``write_result`` need."""
    shard = s.shards.index(task_id)
    sk = s.shards.keys[shard]
    keys, layout = s._shared_keys(states, wid, name, shard)
    keys.append(sk.task(task_id))
    if spec.get("start") and wid and (os.getpid(), wid, shard) not in s._registered:
        spec["reg"] = True  # its first start here: enter it in the workers set
    split = s.sharded
    fresh = False  # a lease this call took, to give back if the start does not happen
    if split:
        spec["split"] = True
        if spec.get("start") and spec.get("cap"):
            # the lease first, in the global slot (conc.lua); a start that does not
            # happen gives back a lease it took (one that fails unconfirmed lets it
            # expire), never one its task already held (a running attempt's)
            took = prechecks.take_cap_lease(s, name or "", task_id, spec)
            spec["cap_held"] = took > 0
            fresh = took == 1
    uq = prechecks.lock_of(s, sk, task_id, spec, create) if split else None
    took_lock = False
    if uq:  # sharded: the unique lock first, in the global slot (uniq.lua)
        holder, took_lock = prechecks.take_unique(s, task_id, uq)
        if holder:
            return stepbatch.given(prechecks.duplicate(task_id, holder))
        spec["uq_held"] = True
    # a resubmit of a task holding its lock already: a fresh expiry once the step applied
    # (one more call; a lock this call took has its fresh expiry)
    renew = (task_id, uq) if uq and not took_lock and prechecks.resubmits(spec) else None
    unique = (task_id, uq) if uq and took_lock else None
    if create is not None:
        keys += [sk.name_index(name or ""), sk.epoch]
        if create.get("wf"):  # a canvas member: its workflow's keys, in its own shard
            keys += _workflow_keys(sk, create, spec)
        if create.get("ix"):  # its indexed argument values (see core/search.py)
            digests = create["ix"].split()
            spec["ix"] = {"at": len(keys) + 1, "n": len(digests), "cap": MAX_PER_VALUE}
            keys += [sk.argument_index(d) for d in digests]
    if "rl" in spec and not split:  # rate_limit_by on one slot: the step checks it
        spec["rl"]["at"] = len(keys) + 1
        keys += ratelimits.keys_of(s, spec["rl"]["name"], spec["rl"]["d"])
    if "giver" in spec:  # last: transition.lua reads them there
        keys += [sk.clock, sk.not_running(str(spec["wid_fence"]))]
    if write_result is not None:
        if create is not None:
            raise ValueError("a step that writes a result cannot create the record")
        keys.append(write_result.key)
        db = "" if write_result.db is None else str(write_result.db)
        raw = s._complete(keys, [layout, to_json(spec), write_result.value,
                                    str(write_result.expires), db])
        result = _step_result(task_id, to, raw[:-1], ret, fence, expect_refusal,
                              split)
        if int(raw[-1]):
            result = dataclasses.replace(result, result_written=True)
    else:
        args = _transition_args(layout, spec)
        batch = stepbatch.BATCH.get()
        if batch is not None:  # submit_many: sent with the others, finished at its reply
            if fresh or spec.get("reg"):
                raise ValueError("a step that takes a lease or registers a worker cannot "
                                 "be batched")
            batch.append((keys, args, functools.partial(
                _finish, s, task_id, to, ret, fence, expect_refusal, split,
                unique=unique, renew=renew)))
            return stepbatch.BATCHED
        return _finish(s, task_id, to, ret, fence, expect_refusal, split,
                       s._transition(keys, args), fresh=fresh, name=name,
                       registered=(wid, shard) if spec.get("reg") else None,
                       unique=unique, renew=renew)
    if split and result.applied:
        prechecks.release_freed(s, task_id, raw[5 + len(ret)])
    if fresh and result.state is not TaskState.STARTED:
        s._release_leases([(task_id, name or "")])
    if spec.get("reg") and result.applied:
        s._registered.add((os.getpid(), str(wid), shard))
    return result


def _transition_args(layout: str, spec: dict[str, Any]) -> list[str]:
    """``transition.lua``'s arguments: the spec as JSON, and a payload it sets (``msg``,
    often most of a publish's bytes) apart, as it is: the script stores it without decoding
    it, and it is not escaped into the spec's JSON (a step of a single publish and a
    batched one alike)."""
    fields = spec.get("set")
    if not fields or "msg" not in fields:
        return [layout, to_json(spec)]
    rest = {k: v for k, v in fields.items() if k != "msg"}
    spec = {k: v for k, v in spec.items() if k != "set"}
    if rest:
        spec["set"] = rest
    return [layout, to_json(spec), fields["msg"]]


def _finish(s: Sharded, task_id: str, to: TaskState, ret: Sequence[str], fence: int | None,
            expect_refusal: bool, split: bool, raw: Sequence[Any], *, fresh: bool = False,
            name: str | None = None, registered: tuple[str | None, int] | None = None,
            unique: tuple[str, str] | None = None,
            renew: tuple[str, str] | None = None) -> StepResult:
    """The result of a ``transition.lua`` reply ``raw``, and what follows it: the global
    lease a step out of ``started`` freed (sharded layout), the lease this call took for a
    start that did not happen (``fresh``), the worker's registration in the shard, the
    unique lock this call took for a step refused (``unique``: given back) and the lock a
    resubmit that applied held already (``renew``: its expiry anew)."""
    result = _step_result(task_id, to, raw, ret, fence, expect_refusal, split)
    if split and result.applied:
        prechecks.release_freed(s, task_id, raw[5 + len(ret)])
    if fresh and result.state is not TaskState.STARTED:
        s._release_leases([(task_id, name or "")])
    if registered is not None and result.applied:
        s._registered.add((os.getpid(), str(registered[0]), registered[1]))
    if unique is not None and not result.applied:
        prechecks.free_unique(s, *unique)
    if renew is not None and result.applied:
        prechecks.renew_unique(s, *renew)
    return result


def _workflow_keys(sk: Keys, create: dict[str, str], spec: dict[str, Any]) -> list[str]:
    """The keys of a canvas member's workflow in its shard (index, cancel mark, the ids
    that name it besides its members'), and its ``spec.wf`` (see ``transition.lua``)."""
    key, names = create["wf"], aliases(create)
    spec["wf"] = {"key": key, "aliases": len(names), "reason": WORKFLOW_CANCELLED}
    return [sk.workflow(key), sk.workflow_cancelled(key),
            *(sk.workflow_alias(a) for a in names)]


def _sources(s: Sharded, to: TaskState, sources: Iterable[TaskState] | None
) -> tuple[list[str], frozenset[TaskState]]:
    """The states a step to ``to`` may leave (``sources`` narrows the table's, never
    widens them), as the script's sorted list and as a set; worked out once per shape."""
    given = sources if sources is None or isinstance(sources, tuple) else tuple(sources)
    cached = s._shapes.get((to, given))
    if cached is None:
        table = allowed_from(to)
        src = table if given is None else frozenset(given)
        if not src <= table:
            raise ValueError(f"{sorted(src - table)} -> {to} is not in the transition table")
        cached = (sorted(state.value for state in src), src)
        s._shapes[(to, given)] = cached
    return cached


def _step_result(
    task_id: str, to: TaskState, raw: Sequence[Any], ret: Sequence[str], fence: int | None,
    expect_refusal: bool = False, split: bool = False,
) -> StepResult:
    applied = bool(int(raw[0]))
    at = 5 + len(ret) + split  # after the ret values (and the freed lease's name)
    epoch = str(raw[at]) if applied and len(raw) > at else None
    result = StepResult(
        applied=applied,
        previous=str(raw[1]),
        now_ms=int(raw[2]),
        attempt=int(raw[3]),
        state=TaskState(str(raw[4])) if applied else None,
        values=dict(zip(ret, (str(v) for v in raw[5:5 + len(ret)]), strict=True))
        if applied else {},
        why=None if applied else str(raw[4]),
        epoch=epoch,
    )
    if not applied:
        log.log(  # no warning for a field it lacks (taken elsewhere) or a unique duplicate
            logging.DEBUG if expect_refusal or (result.why or "").startswith(("no_", "duplicate:"))
            else logging.WARNING,
            "refused transition %s -> %s of task %s (%s, attempt %s, fence %s)",
            result.previous, to.value, task_id, result.why, result.attempt, fence,
        )
    return result


def epoch(s: Sharded, task_id: str, max_age: float = 0.0) -> str:
    """The epoch id of ``task_id``'s shard (made on first use; a shard that lost its
    data gets a new one). A value read less than ``max_age`` seconds ago may be returned
    without asking Redis."""
    now = time.monotonic()
    shard = s.shards.index(task_id)
    cached = s._epochs.get(shard)
    if cached is None or now - cached[1] >= max_age:
        key = s.shards.keys[shard].epoch
        pipe = s.client.pipeline(transaction=False)
        pipe.set(key, uuid.uuid4().hex, nx=True)
        pipe.get(key)
        cached = s._epochs[shard] = (str(pipe.execute()[1]), now)
    return cached[0]


def cancel(
    s: Sharded,
    task_id: str,
    reason: str,
    terminate_ms: int | None = None,
    set_fields: dict[str, str] | None = None,
    keep_reason: bool = False,
) -> CancelOutcome:
    """Cancel or flag a task (see :class:`CancelOutcome`). ``keep_reason``: a started
    task's ``reason`` heads the history of the step that ends it cancelled (a Celery
    revoke says so), unless a cancellation was already requested."""
    S = TaskState
    shard = s.shards.index(task_id)
    sk = s.shards.keys[shard]
    keys, states = s._shared_keys((S.SUBMITTED, S.SCHEDULED, S.STARTED, S.CANCELLED),
                                     shard=shard)
    keys += [sk.task(task_id), sk.cancelling]
    spec: dict[str, Any] = {"id": task_id, "ttl": s.retention_s + EXPIRY_SLACK_S,
                            "reason": reason}
    if terminate_ms is not None:
        spec["terminate_ms"] = int(terminate_ms)
    if set_fields:
        spec["set"] = set_fields
    if keep_reason:
        spec["keep"] = True
    if s.sharded:
        spec["split"] = True
    outcome, previous, *freed = s._scripts["cancel"](keys=keys, args=[states, to_json(spec)])
    if freed and freed[0]:  # sharded: a waiting unique task's lock, freed in the global slot
        prechecks.release_freed(s, task_id, freed[0])
    return CancelOutcome(str(outcome), str(previous))
