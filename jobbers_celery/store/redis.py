"""RedisStore: every lifecycle step is one Lua call; every read walks an index.

The allowed source states of each step come from :mod:`jobbers_celery.core.states`, so the
scripts compare-and-set against the same table that the Python code documents.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, NamedTuple, cast

import redis
from redis.commands.core import Script

from jobbers_celery.core.config import DEFAULT_SHARDS
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import ErrorInfo, TaskRecord, Transition, from_ms
from jobbers_celery.core.states import RESUBMITTABLE, TERMINAL, TaskState, allowed_from
from jobbers_celery.store.base import (
    CancelOutcome,
    Claimed,
    CleanerScan,
    Heartbeat,
    ResultWrite,
    StallVerdict,
    StepResult,
)
from jobbers_celery.store.connect import is_cluster
from jobbers_celery.store.fastcall import (
    FastScript,
    WritesRefused,
    as_refusal,
    not_a_cluster_client,
    without_shebang,
)
from jobbers_celery.store.keys import STATE_ORDER, Keys, Shards

__all__ = ["UNREACHABLE", "Giver", "RedisStore", "WritesRefused", "is_outage"]

log = escaped_logger("jobbers.store")

#: Terminal records stay this much longer than the retention period so that the pruner,
#: which needs their name to clean the indexes, always sees them first.
_EXPIRY_SLACK_S = 3600
#: Records ``purge`` examines per round trip.
_PURGE_BATCH = 500
#: How many index entries a filtered ``tasks()`` call examines at most.
_MAX_EXAMINED = 10_000
#: The fixed shapes of the typed transitions (worked out once, not per step).
_FROM_STARTED = (TaskState.STARTED,)
_FROM_SUBMITTED = (TaskState.SUBMITTED,)
_START_TARGETS = frozenset({TaskState.STARTED, TaskState.CANCELLED})
_CAPPED_START_TARGETS = _START_TARGETS | {TaskState.SCHEDULED}
_COMPLETED = frozenset({TaskState.COMPLETED})
_START_RETURNS = ("ckpt", "queue")


#: Script flags (Redis >= 7) of the scripts that must run when Redis refuses writes:
#: ``prune`` only deletes, so it keeps freeing memory under ``maxmemory``.
_SCRIPT_FLAGS = {"prune": "allow-oom"}


@cache
def _script_source(name: str) -> str:
    """``_lib.lua`` then ``{name}.lua``, under a ``#!lua`` shebang: on Redis 7 a script so
    declared is refused as a whole, before it runs, when Redis refuses writes (``OOM`` under
    ``maxmemory``, ``MISCONF``, ``READONLY``, ``NOREPLICAS``), never stopped half-way.
    Redis < 7 cannot compile it: the line is dropped there (see ``without_shebang``)."""
    lua = resources.files("jobbers_celery.store").joinpath("lua")
    flags = _SCRIPT_FLAGS.get(name)
    shebang = f"#!lua flags={flags}" if flags else "#!lua"
    return (shebang + "\n" + lua.joinpath("_lib.lua").read_text() + "\n"
            + lua.joinpath(f"{name}.lua").read_text())


class _Script(Script):
    """redis-py's ``Script`` that drops the shebang on a Redis < 7 (see ``without_shebang``)."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        try:
            return super().__call__(keys, args, client)
        except redis.ResponseError as exc:
            if not without_shebang(self, exc):
                raise
            return super().__call__(keys, args, client)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _maybe_json(raw: str | None) -> Any:
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _ids(raw: Any) -> list[Any]:
    """A list from a script's JSON (cjson encodes an empty list as ``{}``)."""
    return list(raw) if isinstance(raw, list) else []


def _int(raw: str | None, default: int = 0) -> int:
    return int(raw) if raw not in (None, "") else default


#: What a store call raises when Redis cannot be reached (or went away during the call), or
#: refuses writes for now: ``OOM`` (``maxmemory`` reached), ``READONLY`` (a replica),
#: ``MASTERDOWN`` (a replica cut off from its master), ``MISCONF``/``NOREPLICAS``/``BUSY``
#: (``WritesRefused``: the lifecycle steps, heartbeats and liveness refreshes raise it, other
#: calls redis-py's plain ``ResponseError``; :func:`is_outage` tells those too), or, on Redis
#: Cluster, cannot serve the slot now. A script refused so wrote nothing: all of them are a
#: store outage, never a task's failure.
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError, WritesRefused,
    # Redis Cluster: CLUSTERDOWN, TRYAGAIN (a slot being resharded), and redis-py's
    # "TTL exhausted" after following redirections that long
    redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
)


def is_outage(exc: BaseException) -> bool:
    """``exc`` means the store cannot be reached or take writes for now (see UNREACHABLE),
    whichever call raised it (redis-py's own calls raise ``MISCONF`` and the like as a
    plain ``ResponseError``)."""
    return isinstance(exc, UNREACHABLE) or as_refusal(exc) is not None


class Giver(NamedTuple):
    """How a take-back judges the worker incarnation a given-back message names (ms): gone
    when not seen for ``gone_ms`` (counted from the end of an outage, as the cleaner
    counts); alive, its liveness refresh has had its chance to say it does not run the
    attempt (``alive.lua``'s not-running hash) once it was seen ``settle_ms`` after the
    attempt started."""

    gone_ms: int
    settle_ms: int


class Halt(NamedTuple):
    """A task a worker runs whose attempt the cleaner declared stalled (see ``alive.lua``)."""

    task_id: str
    verdict_ms: int  # Redis clock
    attempt: int


class Alive(NamedTuple):
    """What a liveness refresh hands back (see ``RedisStore.alive``)."""

    interrupt: list[str]
    orphans: list[str]
    halts: tuple[Halt, ...] = ()
    now_ms: int = 0


class RedisStore:
    """Typed access to the lifecycle records of one jobbers namespace.

    The keys spread over the dataset's shards (see :mod:`jobbers_celery.store.keys`): a step
    runs in its task's shard; what spans tasks (the cleaner's scan, the scheduler's due
    sets, a worker's liveness refresh, counts and listings) runs once per shard, in one
    pipeline per server, and merges the answers.
    """

    def __init__(self, client: redis.Redis, prefix: str = "jobbers", retention: float = 604800,
                 shards: int | None = None):
        self.client = client
        #: The global keys (``{<prefix>}``); a task's are ``keys_of(task_id)``.
        self.keys = Keys(prefix)
        self.retention_s = int(retention)
        self._want_shards = shards
        self._shards: Shards | None = None
        self._cluster = is_cluster(client)
        self._layouts: dict[tuple[int, frozenset[TaskState]], tuple[list[str], str]] = {}
        self._shapes: dict[tuple[TaskState, tuple[TaskState, ...] | None],
                           tuple[list[str], frozenset[TaskState]]] = {}
        self._epochs: dict[int, tuple[str, float]] = {}
        self._fixed: list[tuple[str, str, str, str, str, str]] = []
        #: scans run one shard per call (Redis Cluster; see _scan)
        self._scan_per_slot = self._cluster
        self._sharded = False
        #: (pid, worker incarnation, shard) whose start entered it in that shard's copy of
        #: the workers set: a worker killed before its first liveness refresh is then known
        #: as dead in every shard where it started a task
        self._registered: set[tuple[int, str, int]] = set()
        self._scripts = {
            name: _Script(client, _script_source(name))
            for name in ("transition", "complete", "claim", "prune", "heartbeat", "cancel",
                         "alive", "cleaner_due", "stall", "conc")
        }
        self._transition = FastScript(client, self._scripts["transition"])
        self._complete = FastScript(client, self._scripts["complete"])
        self._heartbeat = FastScript(client, self._scripts["heartbeat"])
        # the liveness thread gets its own connection: it must not wait on the shared pool
        self._alive = FastScript(client, self._scripts["alive"])
        lua = resources.files("jobbers_celery.store").joinpath("lua")
        self._due = client.register_script(lua.joinpath("due.lua").read_text())
        # the scans of the scheduler's polls and the cleaner's passes (see _scan)
        self._due_scan = FastScript(client, self._due)
        self._cleaner_scan = FastScript(client, self._scripts["cleaner_due"])
        self._lease = client.register_script(lua.joinpath("lease.lua").read_text())
        self._drop_payload = client.register_script(lua.joinpath("drop_payload.lua").read_text())
        self._has_payload = client.register_script(lua.joinpath("has_payload.lua").read_text())
        self._run_scripts = {name: client.register_script(lua.joinpath(f"{name}.lua").read_text())
                             for name in ("run_claim", "run_settle", "run_control")}

    def wait_out_outages(self, seconds: float) -> None:
        """Make the lifecycle steps (not heartbeats nor liveness refreshes, which have their
        own retries) keep trying for up to ``seconds`` while Redis cannot be reached or
        refuses writes (``OOM``, ``MISCONF``...), rather than fail: a worker's steps, so that
        a store restart, a failover or full memory does not fail the tasks that start or
        finish meanwhile (nothing was sent, or the script was refused before it wrote
        anything, so nothing is applied twice).
        """
        self._transition.outage_wait_s = self._complete.outage_wait_s = float(seconds)

    @classmethod
    def from_url(cls, url: str, prefix: str = "jobbers", retention: float = 604800,
                 shards: int | None = None) -> RedisStore:
        client = redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)
        return cls(client, prefix, retention, shards)

    # ------------------------------------------------------------------ shards
    @property
    def shards(self) -> Shards:
        """The dataset's shards, read (or, for a new dataset, written) at first use."""
        if self._shards is None:
            shards = self._layout_waiting_out_outages()
            # what every step passes, worked out once per shard
            self._fixed = [(k.all_tasks, k.publishing, k.stats, k.heartbeat_due, k.workers,
                            k.concurrency("")) for k in shards.keys]
            self._sharded = shards.count > 1
            self._shards = shards
        return self._shards

    @property
    def sharded(self) -> bool:
        """More than one shard: concurrency leases live in the global slot, apart from the
        steps (see ``conc.lua``)."""
        if self._shards is None:
            self.shards  # noqa: B018 - reads the layout
        return self._sharded

    def _layout_waiting_out_outages(self) -> Shards:
        """:meth:`_read_layout`, waiting while Redis is unreachable or refuses writes as a
        step would (``wait_out_outages``); then the outage is raised as a store outage
        (``WritesRefused`` for a refusal redis-py has no class for)."""
        deadline = time.monotonic() + self._transition.outage_wait_s
        pause = 0.05
        while True:
            try:
                return self._read_layout()
            except (redis.exceptions.MovedError, redis.exceptions.AskError) as exc:
                if self._cluster:
                    raise
                raise not_a_cluster_client(exc) from exc
            except redis.RedisError as exc:
                if not is_outage(exc):
                    raise
                if time.monotonic() + pause > deadline:
                    refused = as_refusal(exc)
                    if refused is None or refused is exc:
                        raise
                    raise refused from exc
                time.sleep(pause)
                pause = min(2 * pause, 1.0)

    def _read_layout(self) -> Shards:
        """The dataset's number of shards (``{<prefix>}:layout``), written at first use:
        the configured number, else ``DEFAULT_SHARDS`` on Redis Cluster and one on a single
        server (plain or Sentinel), where shards spread nothing and cost a fan-out (a
        liveness refresh and a cleaner scan per shard); a dataset written before shards
        existed (its keys under the global tag) has one. A configured number that differs
        from the dataset's is refused: every key would be looked up in the wrong slot."""
        k, want = self.keys, self._want_shards
        raw = self.client.get(k.layout)
        if raw is None:
            legacy = bool(self.client.exists(k.epoch, k.all_tasks))
            count = want if want is not None else (
                DEFAULT_SHARDS if self._cluster and not legacy else 1)
            if legacy and count != 1:
                raise ConfigurationError(
                    f"jobbers_store_shards is {count}, but the dataset under prefix "
                    f"{k.prefix!r} was written with one shard (by a jobbers without shards); "
                    "leave jobbers_store_shards unset (or set it to 1), or migrate the "
                    "dataset (docs/reference/redis.md, 'Shards')")
            self.client.set(k.layout, str(count), nx=True)
            raw = self.client.get(k.layout)
        stored = int(str(raw))
        if want is not None and want != stored:
            raise ConfigurationError(
                f"jobbers_store_shards is {want}, but the dataset under prefix {k.prefix!r} "
                f"has {stored} shards (fixed at its first use, in {k.layout}); set it to "
                f"{stored} or leave it unset, or migrate the dataset (docs/reference/redis.md,"
                " 'Shards')")
        return Shards(k.prefix, stored)

    def keys_of(self, task_id: str) -> Keys:
        """The keys of ``task_id``'s shard."""
        return self.shards.of(task_id)

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        """``ids`` grouped by shard, each group in the given order."""
        shards = self.shards
        out: dict[int, list[str]] = {}
        for task_id in ids:
            out.setdefault(shards.index(task_id), []).append(task_id)
        return out

    def _fan(self, calls: Sequence[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        """Run ``(script, keys, args)`` calls of redis-py scripts (rare paths: payload
        checks, lease renewals): one pipeline on one server; on Redis Cluster one call at a
        time, each to the node serving its keys."""
        if len(calls) == 1 or self._cluster:
            return [script(keys=keys, args=args) for script, keys, args in calls]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            script(keys=keys, args=args, client=pipe)
        return pipe.execute()

    def _release_leases(self, freed: Iterable[tuple[str, str]]) -> None:
        """Release the global concurrency leases of attempts that ended (sharded layout):
        ``(task id, name)`` pairs. Lost if Redis goes away meanwhile: the lease then expires
        as a dead holder's does."""
        pairs = [(task_id, name) for task_id, name in freed if name]
        if not pairs:
            return
        try:
            if len(pairs) == 1:
                self.client.zrem(self.keys.concurrency(pairs[0][1]), pairs[0][0])
                return
            pipe = self.client.pipeline(transaction=False)
            for task_id, name in pairs:
                pipe.zrem(self.keys.concurrency(name), task_id)
            pipe.execute()
        except UNREACHABLE as exc:
            log.warning("could not release the concurrency lease of %s (it expires by "
                        "itself): %s", ", ".join(i for i, _ in pairs), exc)

    # ------------------------------------------------------------------ steps
    def _shared_keys(
        self, states: Iterable[TaskState], wid: str | None = None, name: str | None = None,
        shard: int = 0,
    ) -> tuple[list[str], str]:
        """The shared KEYS prefix of every script and the matching ARGV[1], in ``shard``.

        Only the indexes of ``states`` are passed: a step touches the index of its current
        state (one of its sources) and of its targets, nothing else. ``wid`` and ``name``
        select the worker-tasks and concurrency-lease sets (placeholders when ``None``;
        the lease set is the shard's placeholder in the sharded layout, where leases live
        in the global slot and are taken apart from the steps).
        """
        wanted = frozenset(states)
        cached = self._layouts.get((shard, wanted))
        if cached is None:
            sk = self.shards.keys[shard]
            ordered = [s for s in STATE_ORDER if s in wanted]
            cached = (
                [sk.state_index(s) for s in ordered],
                json.dumps([s.value for s in ordered]),
            )
            self._layouts[(shard, wanted)] = cached
        all_tasks, publishing, stats, hbdue, workers, placeholder = self._fixed[shard]
        conc = placeholder if self._sharded else self.keys.concurrency(name or "")
        return [all_tasks, publishing, stats, hbdue, self.shards.keys[shard].worker_tasks(wid or ""),
                conc, workers, *cached[0]], cached[1]

    # One method per kind of transition, typed: what jobbers' recorder calls. Each builds
    # the spec ``transition.lua``/``complete.lua`` reads (the same keys, the same encoding
    # as the general form :meth:`step`, which tests and tools use) and runs it in one round
    # trip through ``FastScript``; the key layout of each shape is worked out once.
    def submit(
        self,
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
    ) -> StepResult:
        """``-> submitted`` from ``sources``: a publish (``create`` makes the record if
        missing), a worker's late record of one, or a resubmit (``lease_ms``: a publish
        lease the publisher confirms). ``later`` (delay in ms, reason): then ``submitted ->
        scheduled`` in the same script, a first publish with a delay (``state`` says
        ``scheduled`` when both applied)."""
        return self.step(task_id, TaskState.SUBMITTED, sources=sources, create=create,
                         set_fields=fields, delete=delete, lease_ms=lease_ms, reason=reason,
                         ret=ret, name=name, later=later)

    def start(
        self,
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
    ) -> StepResult:
        """``submitted -> started`` by worker incarnation ``wid`` (or ``scheduled``, past a
        ``cap`` of running tasks of this name, deferred ``defer_ms``; or ``cancelled`` if a
        cancellation is pending). Returns the record's ``ckpt`` and ``queue``."""
        src_list, src = self._sources(TaskState.STARTED, None)
        spec: dict[str, Any] = {"id": task_id, "to": "started", "from": src_list,
                                "ttl": self.retention_s + _EXPIRY_SLACK_S}
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
        spec["cancellable"] = True
        if worker:
            spec["worker"] = worker
        spec["ret"] = list(_START_RETURNS)
        return self._run(task_id, TaskState.STARTED, src | targets, spec, wid, name, None,
                         None, _START_RETURNS, None, False)

    def _take_lease(self, name: str, task_id: str, cap: int, lease_ms: int) -> int:
        """Take a ``max_concurrent`` lease of ``name`` for ``task_id`` (sharded layout, see
        ``conc.lua``): 1 taken now, 2 held already, 0 when ``cap`` others hold one."""
        return int(self._scripts["conc"](keys=[self.keys.concurrency(name)],
                                         args=["take", lease_ms, cap, task_id]))

    def complete(
        self,
        task_id: str,
        fence: int,
        *,
        name: str,
        worker: str | None,
        wid: str,
        fields: dict[str, str],
        delete: Sequence[str],
        write_result: ResultWrite | None,
    ) -> StepResult:
        """``started -> completed`` of attempt ``fence``, dropping the ``delete`` fields;
        ``write_result``: Celery's result written by the same script, only if it applies
        (:attr:`StepResult.result_written`)."""
        src_list, src = self._sources(TaskState.COMPLETED, _FROM_STARTED)
        spec: dict[str, Any] = {"id": task_id, "to": "completed", "from": src_list,
                                "ttl": self.retention_s + _EXPIRY_SLACK_S, "fence": fence}
        if fields:
            spec["set"] = fields
        if delete:
            spec["del"] = list(delete)
        if worker:
            spec["worker"] = worker
        return self._run(task_id, TaskState.COMPLETED, src | _COMPLETED, spec, wid, name,
                         None, write_result, (), fence, False)

    def end(
        self,
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
        return self.step(task_id, to, sources=_FROM_STARTED, fence=fence, wid_fence=wid_fence,
                         set_fields=fields, wid=wid, cancellable=cancellable,
                         cancel_reason=cancel_reason, delay_ms=delay_ms, lease_ms=lease_ms,
                         worker=worker, reason=reason, ret=ret, name=name,
                         expect_refusal=expect_refusal, giver=giver)

    def unstarted(
        self,
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
        return self.step(task_id, to, sources=_FROM_SUBMITTED, set_fields=fields,
                         bump=to is TaskState.DROPPED, worker=worker, reason=reason, ret=ret)

    def step(
        self,
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
        """
        from_list, src = self._sources(to, sources)
        spec: dict[str, Any] = {
            "id": task_id,
            "to": to.value,
            "from": from_list,
            "ttl": self.retention_s + _EXPIRY_SLACK_S,
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
        if later is not None:
            if to is not TaskState.SUBMITTED or TaskState.SUBMITTED not in allowed_from(
                    TaskState.SCHEDULED):
                raise ValueError("later: only after a step to submitted")
            spec["later"] = {"delay_ms": int(later[0]), "reason": later[1]}
            targets.add(TaskState.SCHEDULED)
        return self._run(task_id, to, src.union(targets), spec, wid, name, create,
                         write_result, ret, fence, expect_refusal)

    def _run(
        self, task_id: str, to: TaskState, states: frozenset[TaskState] | set[TaskState],
        spec: dict[str, Any], wid: str | None, name: str | None,
        create: dict[str, str] | None, write_result: ResultWrite | None, ret: Sequence[str],
        fence: int | None, expect_refusal: bool,
    ) -> StepResult:
        """Run the step ``spec`` (one round trip): the keys of ``states``' indexes, the
        record, and what ``create``/``write_result`` need."""
        shard = self.shards.index(task_id)
        sk = self.shards.keys[shard]
        keys, layout = self._shared_keys(states, wid, name, shard)
        keys.append(sk.task(task_id))
        if spec.get("start") and wid and (os.getpid(), wid, shard) not in self._registered:
            spec["reg"] = True  # its first start here: enter it in the workers set
        split = self.sharded
        fresh = False  # a lease this call took, to give back if the start does not happen
        if split:
            spec["split"] = True
            if spec.get("start") and spec.get("cap"):
                # the lease first, in the global slot (conc.lua); a start that does not
                # happen gives back a lease it took (one that fails unconfirmed lets it
                # expire), never one its task already held (a running attempt's)
                took = self._take_lease(name or "", task_id, int(spec["cap"]),
                                        int(spec["lease_cap_ms"]))
                spec["cap_held"] = took > 0
                fresh = took == 1
        if create is not None:
            keys += [sk.name_index(name or ""), sk.epoch]
        if "giver" in spec:  # last: transition.lua reads them there
            keys += [sk.clock, sk.not_running(str(spec["wid_fence"]))]
        if write_result is not None:
            if create is not None:
                raise ValueError("a step that writes a result cannot create the record")
            keys.append(write_result.key)
            db = "" if write_result.db is None else str(write_result.db)
            raw = self._complete(keys, [layout, _json(spec), write_result.value,
                                        str(write_result.expires), db])
            result = self._step_result(task_id, to, raw[:-1], ret, fence, expect_refusal,
                                       split)
            if int(raw[-1]):
                result = dataclasses.replace(result, result_written=True)
        else:
            raw = self._transition(keys, [layout, _json(spec)])
            result = self._step_result(task_id, to, raw, ret, fence, expect_refusal, split)
        if split and result.applied and raw[5 + len(ret)]:
            self._release_leases([(task_id, str(raw[5 + len(ret)]))])
        if fresh and result.state is not TaskState.STARTED:
            self._release_leases([(task_id, name or "")])
        if spec.get("reg") and result.applied:
            self._registered.add((os.getpid(), str(wid), shard))
        return result

    def _sources(
        self, to: TaskState, sources: Iterable[TaskState] | None
    ) -> tuple[list[str], frozenset[TaskState]]:
        """The states a step to ``to`` may leave (``sources`` narrows the table's, never
        widens them), as the script's sorted list and as a set; worked out once per shape."""
        given = sources if sources is None or isinstance(sources, tuple) else tuple(sources)
        cached = self._shapes.get((to, given))
        if cached is None:
            table = allowed_from(to)
            src = table if given is None else frozenset(given)
            if not src <= table:
                raise ValueError(f"{sorted(src - table)} -> {to} is not in the transition table")
            cached = (sorted(s.value for s in src), src)
            self._shapes[(to, given)] = cached
        return cached

    @staticmethod
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
            log.log(
                logging.DEBUG if expect_refusal else logging.WARNING,
                "refused transition %s -> %s of task %s (%s, attempt %s, fence %s)",
                result.previous, to.value, task_id, result.why, result.attempt, fence,
            )
        return result

    # ------------------------------------------------------------------ epoch
    def epoch(self, task_id: str, max_age: float = 0.0) -> str:
        """The epoch id of ``task_id``'s shard (made on first use; a shard that lost its
        data gets a new one). A value read less than ``max_age`` seconds ago may be returned
        without asking Redis."""
        now = time.monotonic()
        shard = self.shards.index(task_id)
        cached = self._epochs.get(shard)
        if cached is None or now - cached[1] >= max_age:
            key = self.shards.keys[shard].epoch
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, uuid.uuid4().hex, nx=True)
            pipe.get(key)
            cached = self._epochs[shard] = (str(pipe.execute()[1]), now)
        return cached[0]

    # ------------------------------------------------------------------ running tasks
    def heartbeat(
        self,
        task_id: str,
        fence: int,
        *,
        progress: str | None = None,
        checkpoint: str | None = None,
        name: str | None = None,
        lease_cap_ms: int | None = None,
    ) -> Heartbeat:
        """Record that attempt ``fence`` is alive; ``progress``/``checkpoint`` are JSON text."""
        spec: dict[str, Any] = {"id": task_id, "fence": fence}
        if progress is not None:
            spec["progress"] = progress
        if checkpoint is not None:
            spec["ckpt"] = checkpoint
        try:
            k = self.keys_of(task_id)
            if self.sharded:  # the lease is renewed by the worker's liveness refresh
                conc = k.concurrency("")
            else:
                conc = self.keys.concurrency(name or "")
                if lease_cap_ms:
                    spec["lease_cap_ms"] = int(lease_cap_ms)
            raw = self._heartbeat([k.task(task_id), k.heartbeat_due, conc, k.stats],
                                  [_json(spec)])
        except UNREACHABLE as exc:
            # best effort: a Redis blip (or a refusal of writes, OOM) must not kill a long
            # task; the cleaner allows for outages (see the clock tick), and the next
            # heartbeat carries what this one had
            log.warning("heartbeat of task %s not delivered: %s", task_id, exc)
            return Heartbeat(accepted=False, cancel_requested=False, now_ms=0,
                             delivered=False)
        if int(raw[0]):
            return Heartbeat(accepted=True, cancel_requested=raw[1] == "1", now_ms=int(raw[2]))
        log.warning("rejected heartbeat of task %s attempt %s: the task is %s (attempt %s)",
                    task_id, fence, raw[1], raw[2])
        return Heartbeat(accepted=False, cancel_requested=False, now_ms=int(raw[3]),
                         state=str(raw[1]), attempt=int(raw[2]))

    def cancel(
        self,
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
        shard = self.shards.index(task_id)
        sk = self.shards.keys[shard]
        keys, states = self._shared_keys((S.SUBMITTED, S.SCHEDULED, S.STARTED, S.CANCELLED),
                                         shard=shard)
        keys += [sk.task(task_id), sk.cancelling]
        spec: dict[str, Any] = {"id": task_id, "ttl": self.retention_s + _EXPIRY_SLACK_S,
                                "reason": reason}
        if terminate_ms is not None:
            spec["terminate_ms"] = int(terminate_ms)
        if set_fields:
            spec["set"] = set_fields
        if keep_reason:
            spec["keep"] = True
        outcome, previous = self._scripts["cancel"](keys=keys, args=[states, _json(spec)])
        return CancelOutcome(str(outcome), str(previous))

    def alive(
        self, wid: str, gaps: tuple[int, int], leases: Sequence[tuple[str, str]],
        lease_cap_ms: int, running: Sequence[str] | None = None, orphan_ms: int = 0,
        orphan_grace_ms: int | None = None, notes: Sequence[tuple[str, int, str]] = (),
    ) -> Alive:
        """A worker's liveness refresh (one round trip). ``leases``: (task name, task id) of
        the capped tasks it runs. Returns the ids whose ``terminate`` grace has run out and,
        when ``running`` (the ids it runs) is given, the orphans: tasks recorded as started
        by it for longer than ``orphan_ms`` that it does not run, none until
        ``orphan_grace_ms`` (default ``orphan_ms``) after an outage ended; and the halts:
        tasks it runs whose attempt the cleaner declared stalled. ``notes``: (task id,
        attempt, text) appended to the reason of that attempt's stall in the history.

        Sharded: the refresh runs in every shard (sent together on one server, one call
        per shard on Redis Cluster), each with the shard's copy of the workers set and
        clock, the tasks running in it, and its notes; the concurrency leases are renewed
        in the global slot."""
        shards, split = self.shards, self.sharded
        running_in = self._by_shard(running or ())
        notes_in: dict[int, list[tuple[str, int, str]]] = {}
        for note in notes:
            notes_in.setdefault(shards.index(note[0]), []).append(note)
        own_leases = [] if split else list(leases)  # one shard, whose script renews them
        calls = []
        for shard, sk in enumerate(shards.keys):
            mine = notes_in.get(shard, [])
            keys = [sk.clock, sk.workers, sk.worker_tasks(wid), sk.cancelling, sk.halts(wid),
                    *(self.keys.concurrency(name) for name, _ in own_leases),
                    *(sk.task(task_id) for task_id, _, _ in mine), sk.not_running(wid)]
            spec: dict[str, Any] = {"wid": wid, "gap_ms": gaps[0], "cgap_ms": gaps[1],
                                    "lease_cap_ms": int(lease_cap_ms),
                                    "leases": [task_id for _, task_id in own_leases]}
            if running is not None:
                spec.update(running=running_in.get(shard, []),
                            orphan_ms=int(orphan_ms),
                            orphan_grace_ms=int(orphan_ms if orphan_grace_ms is None
                                                else orphan_grace_ms))
            if mine:
                spec["notes"] = [{"id": task_id, "attempt": int(attempt), "text": text}
                                 for task_id, attempt, text in mine]
            calls.append((keys, [_json(spec)]))
        replies = self._alive.many(calls)
        if split and leases:
            self._renew_leases(leases, lease_cap_ms)
        interrupt: list[str] = []
        orphans: list[str] = []
        halts: list[Halt] = []
        now = 0
        for raw in replies:
            interrupt += [str(x) for x in raw[1] or ()]
            orphans += [str(x) for x in raw[2] or ()]
            flat = [str(x) for x in raw[3] or ()] if len(raw) > 3 else []
            for task_id, value in zip(flat[::2], flat[1::2], strict=True):
                verdict, _, attempt = value.partition("|")
                halts.append(Halt(task_id, int(verdict), int(attempt or 0)))
            now = max(now, int(raw[0]))
        return Alive(interrupt, orphans, tuple(halts), now)

    def _renew_leases(self, leases: Sequence[tuple[str, str]], lease_cap_ms: int) -> None:
        """Renew the global concurrency leases of the capped tasks a worker runs (sharded
        layout: ``conc.lua``, one call per task name)."""
        by_name: dict[str, list[str]] = {}
        for name, task_id in leases:
            by_name.setdefault(name, []).append(task_id)
        conc = self._scripts["conc"]
        self._fan([(conc, [self.keys.concurrency(name)], ["renew", int(lease_cap_ms), *ids])
                   for name, ids in by_name.items()])

    # ------------------------------------------------------------------ cleaner
    def cleaner_due(self, gaps: tuple[int, int], lost_ms: int, limit: int
                    ) -> list[CleanerScan]:
        """Ids and incarnations one cleaner pass must judge, one scan per shard (see
        cleaner_due.lua; index ranges only, never a keyspace scan; one call on one server)."""
        args = [_json({"gap_ms": gaps[0], "cgap_ms": gaps[1], "lost_ms": int(lost_ms),
                       "limit": limit})]
        replies = self._scan(self._cleaner_scan,
                             [[k.clock, k.heartbeat_due, k.workers, k.cancelling]
                              for k in self.shards.keys], args, json.loads)
        scans = []
        for shard, out in enumerate(replies):
            scans.append(CleanerScan(now_ms=int(out["now"]), hb=_ids(out["hb"]),
                                     dead=_ids(out["dead"]), cancel=_ids(out["cancel"]),
                                     resumed_at_ms=int(out.get("resumed_at") or 0),
                                     shard=shard))
        return scans

    def _scan(self, script: FastScript, per_shard: list[list[str]], args: list[str],
              decode: Callable[[Any], list[Any]] = list) -> list[Any]:
        """A scan script (``cleaner_due``, ``due``) over every shard: one call per shard on
        Redis Cluster (each touches one slot), one call naming every shard's keys on a single
        server, where slots do not matter and a pass with nothing to do then costs one
        script run, as with one shard (``decode`` turns a reply into its list of per-shard
        answers). A single endpoint that refuses keys of several slots
        in one script (``CROSSSLOT``: a proxy in front of shards) gets one call per shard
        from then on. The replies, concatenated in shard order."""
        if not self._scan_per_slot:
            try:
                return decode(script([key for keys in per_shard for key in keys], args))
            except redis.ResponseError as exc:
                if not str(exc).startswith("CROSSSLOT"):
                    raise
                log.info("the store refuses a script over several slots; scanning one "
                         "shard per call")
                self._scan_per_slot = True
        return [x for reply in script.many([(keys, args) for keys in per_shard])
                for x in decode(reply)]

    def _pipeline_each(self, commands: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Read commands (``(method, args)``) in one pipeline (per node on a cluster)."""
        pipe = self.client.pipeline(transaction=False)
        for method, args in commands:
            getattr(pipe, method)(*args)
        return pipe.execute()

    def workers(self, since_ms: int) -> list[tuple[str, int, int]]:
        """``(incarnation, last seen ms, tasks it runs)`` of every worker incarnation seen
        alive since ``since_ms``, most recently seen first (two round trips; the latest
        sighting in any shard, the tasks summed over shards)."""
        shards = self.shards.keys
        replies = self._pipeline_each([("zrevrangebyscore",
                                        (k.workers, "+inf", since_ms, None, None, True))
                                       for k in shards])
        seen: dict[str, int] = {}
        for pairs in replies:
            for wid, at in pairs:
                seen[wid] = max(seen.get(wid, 0), int(at))
        if not seen:
            return []
        order = sorted(seen, key=lambda w: -seen[w])
        counts = self._pipeline_each([("zcard", (k.worker_tasks(wid),))
                                      for wid in order for k in shards])
        n = len(shards)
        return [(wid, seen[wid], sum(int(c) for c in counts[i * n:(i + 1) * n]))
                for i, wid in enumerate(order)]

    def worker_tasks(self, dead: Mapping[int, Sequence[str]], limit: int
                     ) -> dict[int, dict[str, list[str]]]:
        """The tasks each worker incarnation started and did not finish, oldest first, up to
        ``limit`` each, per shard: ``dead`` names the incarnations to read in each shard
        (one pipeline for them all)."""
        pairs = [(shard, wid) for shard, wids in dead.items() for wid in wids]
        keys = self.shards.keys
        replies = self._pipeline_each([("zrange", (keys[shard].worker_tasks(wid), 0, limit - 1))
                                       for shard, wid in pairs])
        out: dict[int, dict[str, list[str]]] = {}
        for (shard, wid), ids in zip(pairs, replies, strict=True):
            out.setdefault(shard, {})[wid] = [str(i) for i in ids]
        return out

    def fields(self, ids: Sequence[str], names: Sequence[str]) -> list[list[str | None]]:
        """``HMGET`` of ``names`` for each id, in one round trip (per node on a cluster)."""
        of = self.shards.of
        return cast("list[list[str | None]]", self._pipeline_each(
            [("hmget", (of(task_id).task(task_id), list(names))) for task_id in ids]))

    def drop_payloads(self, dead: Sequence[tuple[str, int]]) -> int:
        """Forget the payload (``msg``) of dead-lettered records whose dead-letter entry now
        holds it: ``(task id, dead-lettered attempt)`` pairs, one round trip. A record
        resubmitted or started since keeps its payload. Returns how many were dropped."""
        if not dead:
            return 0
        keep_ms = (self.retention_s + _EXPIRY_SLACK_S) * 1000
        attempts = dict(dead)
        of = self.shards.of
        return sum(int(n) for n in self._fan([
            (self._drop_payload, [of(i).task(i) for i in ids],
             [keep_ms, *(str(attempts[i]) for i in ids)])
            for ids in self._by_shard(attempts).values()]))

    def without_payload(self, ids: Sequence[str]) -> dict[str, int]:
        """Of ``ids``, the resubmittable records that hold no payload (a dead-letter entry
        holds it, see :meth:`drop_payloads`): id -> attempt. One round trip."""
        if not ids:
            return {}
        of = self.shards.of
        groups = list(self._by_shard(ids).values())
        replies = self._fan([(self._has_payload, [of(i).task(i) for i in group], [])
                             for group in groups])
        out: dict[str, int] = {}
        for group, raw in zip(groups, replies, strict=True):
            for n, task_id in enumerate(group):
                state, attempt, has_msg = raw[3 * n:3 * n + 3]
                if state in RESUBMITTABLE and not int(has_msg):
                    out[task_id] = _int(attempt)
        return out

    def stall(
        self,
        items: Sequence[tuple[str, str, str, str]],
        lost_ms: int,
        lease_ms: int,
        forget: Sequence[str] = (),
        shard: int | None = None,
    ) -> StallVerdict:
        """Judge ``(task id, kind, worker incarnation, task name)`` candidates (stall.lua),
        one script call per shard; ``forget``: dead incarnations to forget in ``shard`` (the
        shard a cleaner scan found them dead in) once they have no task left there."""
        groups: dict[int, list[tuple[str, str, str, str]]] = {}
        for item in items:
            groups.setdefault(self.shards.index(item[0]), []).append(item)
        if forget:
            if shard is None:
                raise ValueError("forget: name the shard the incarnations were found dead in")
            groups.setdefault(shard, [])
        recovered: list[dict[str, str]] = []
        dead: list[dict[str, str]] = []
        stalled = kept = 0
        for group_shard, group in groups.items():
            part = self._stall(group_shard, group, lost_ms, lease_ms,
                               forget if group_shard == shard else ())
            recovered += part.recovered
            dead += part.dead
            stalled += part.stalled
            kept += part.kept
        return StallVerdict(recovered, dead, stalled, kept)

    def _stall(self, shard: int, items: Sequence[tuple[str, str, str, str]], lost_ms: int,
               lease_ms: int, forget: Sequence[str]) -> StallVerdict:
        S = TaskState
        keys, states = self._shared_keys((S.STARTED, S.STALLED, S.SUBMITTED), shard=shard)
        k = self.shards.keys[shard]
        split = self.sharded
        keys += [k.clock, k.workers]
        for task_id, _, wid, name in items:
            conc = k.concurrency("") if split else self.keys.concurrency(name)
            keys += [k.task(task_id), k.worker_tasks(wid), conc, k.halts(wid)]
        keys += [k.worker_tasks(wid) for wid in forget]
        keys += [k.halts(wid) for wid in forget]
        spec: dict[str, Any] = {
            "items": [{"id": i, "kind": kind, "wid": wid} for i, kind, wid, _ in items],
            "lost_ms": int(lost_ms),
            "lease_ms": int(lease_ms),
            "ttl": self.retention_s + _EXPIRY_SLACK_S,
            "forget": list(forget),
        }
        if split:
            spec["split"] = True
        out: dict[str, Any] = json.loads(
            self._scripts["stall"](keys=keys, args=[states, _json(spec)]))
        if split:
            self._release_leases((str(i), str(n)) for i, n in _ids(out.get("freed")))
        return StallVerdict(recovered=_ids(out["recovered"]), dead=_ids(out["dead"]),
                            stalled=int(out["stalled"]), kept=int(out["kept"]))

    def tidy_cancelling(self, ids: Sequence[str]) -> None:
        of = self.shards.of
        for group in self._by_shard(ids).values():
            self.client.zrem(of(group[0]).cancelling, *group)

    def record_pass(self, at_ms: int, duration_ms: float, by: str, report: dict[str, Any]) -> None:
        self.client.hset(self.keys.clock, mapping={
            "last_at": at_ms, "last_ms": f"{duration_ms:.3f}", "by": by, "report": _json(report),
        })

    def clock(self) -> dict[str, str]:
        return cast("dict[str, str]", self.client.hgetall(self.keys.clock))

    def last_pass_age_ms(self) -> int | None:
        """Redis-clock ms since the cleaner's last pass, ``None`` if none ran (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.hget(self.keys.clock, "last_at")
        (sec, usec), last = pipe.execute()
        if not last:
            return None
        return int(sec) * 1000 + int(usec) // 1000 - int(last)

    def remove_terminal(self, ids: Sequence[str]) -> int:
        """Delete terminal records now (``purge``), with their history and index entries."""
        if not ids:
            return 0
        return self._remove(list(ids), cutoff=2**62)

    def purge(
        self, name: str | None, queue: str | None, before_ms: int | None
    ) -> tuple[int, list[str], list[str]]:
        """Walk the most selective index (submission-time order) and act on matches:
        terminal records are removed, submitted and scheduled tasks cancelled, others
        skipped. The records purge cancels are marked ``purged`` and kept (until the
        retention period) as tombstones, also by a later purge: a message of theirs still
        queued must find them and be dropped. Returns (removed, cancelled ids, skipped ids).
        Shard by shard."""
        removed = 0
        cancelled: list[str] = []
        skipped: list[str] = []
        for k in self.shards.keys:
            removed += self._purge_shard(k, name, queue, before_ms, cancelled, skipped)
        return removed, cancelled, skipped

    def _purge_shard(self, k: Keys, name: str | None, queue: str | None,
                     before_ms: int | None, cancelled: list[str], skipped: list[str]) -> int:
        index = k.name_index(name) if name is not None else k.all_tasks
        removed = 0
        seen: set[str] = set()
        start = 0
        while True:
            ids = cast("list[str]", self.client.zrangebyscore(
                index, "-inf", "+inf" if before_ms is None else f"({before_ms}",
                start=start, num=_PURGE_BATCH))
            if not ids:
                break
            start += len(ids)
            batch = [i for i in ids if i not in seen]
            seen.update(batch)
            terminal, gone = [], []
            meta = self.fields(batch, ("state", "name", "queue", "purged"))
            for task_id, (state, rec_name, rec_queue, purged) in zip(batch, meta, strict=True):
                if state is None:
                    gone.append(task_id)  # the index entry of an expired record
                elif (name is not None and rec_name != name) or (
                        queue is not None and rec_queue != queue):
                    continue
                elif TaskState(state) in TERMINAL:
                    if not purged:
                        terminal.append(task_id)
                elif state in (TaskState.SUBMITTED, TaskState.SCHEDULED):
                    done = self.cancel(task_id, "purged", set_fields={"purged": "1"})
                    (cancelled if done.outcome == "cancelled" else skipped).append(task_id)
                else:
                    skipped.append(task_id)
            if gone:
                self.client.zrem(index, *gone)
            n = self.remove_terminal(terminal)
            removed += n
            start -= n + len(gone)  # what was removed no longer occupies the window
        return removed

    # ------------------------------------------------------------------ scheduler
    def due(self, limit: int = 500) -> tuple[list[str], int | None]:
        """Ids worth claiming now (due, or lease expired) and the next run_at (ms) if any,
        over every shard (one pipeline; up to ``limit`` of each kind per shard)."""
        raw = self._scan(self._due_scan, [[k.state_index(TaskState.SCHEDULED), k.publishing]
                                          for k in self.shards.keys], [str(limit)])
        ids: list[str] = []
        nxt: int | None = None
        for due, expired, at in raw:  # per shard (nested: an id may hold any character)
            ids += [*due, *expired]
            if at not in ("", None):
                nxt = int(float(at)) if nxt is None else min(nxt, int(float(at)))
        return list(dict.fromkeys(ids)), nxt

    def claim(self, ids: Sequence[str], lease_ms: int, worker: str | None) -> list[Claimed]:
        """Atomically take due tasks (scheduled -> submitted) for this caller to publish."""
        if not ids:
            return []
        out: list[Claimed] = []
        for shard, group in self._by_shard(ids).items():
            out += self._claim(shard, group, lease_ms, worker)
        return out

    def _claim(self, shard: int, ids: Sequence[str], lease_ms: int, worker: str | None
               ) -> list[Claimed]:
        keys, states = self._shared_keys(
            (TaskState.UNSUBMITTED, TaskState.SCHEDULED, TaskState.SUBMITTED), shard=shard)
        sk = self.shards.keys[shard]
        for task_id in ids:
            keys.append(sk.task(task_id))
        spec = {
            "ids": list(ids),
            "lease_ms": int(lease_ms),
            "worker": worker or "",
            "from": [TaskState.SCHEDULED.value],
        }
        raw = self._scripts["claim"](keys=keys, args=[states, _json(spec)])
        return [
            Claimed(task_id=str(raw[i]), msg=str(raw[i + 1]), retries=_int(raw[i + 2]),
                    name=str(raw[i + 3]),
                    run_at=_int(str(raw[i + 4])) if raw[i + 4] not in ("", None) else None,
                    queue=str(raw[i + 5]))
            for i in range(0, len(raw), 6)
        ]

    def release_publish_leases(self, ids: Sequence[str]) -> None:
        """Make claimed-but-unpublished tasks due for any scheduler to publish now."""
        of = self.shards.of
        for group in self._by_shard(ids).values():
            self.client.zadd(of(group[0]).publishing, dict.fromkeys(group, 0), xx=True)

    def confirm_published(self, ids: Iterable[str]) -> None:
        """Drop publish leases once the messages are with the broker."""
        of = self.shards.of
        for group in self._by_shard(ids).values():
            self.client.zrem(of(group[0]).publishing, *group)

    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take the lease ``key`` for ``token`` if it is free, or renew it if ``token`` holds
        it; ``False`` while another token holds it (lease.lua, one round trip)."""
        return bool(self._lease(keys=[key], args=[token, int(ttl_ms)]))

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        """Take a best-effort lock that expires by itself (efficiency only, never safety)."""
        return bool(self.client.set(self.keys.lock(name), "1", nx=True, px=ttl_ms))

    # ------------------------------------------------------------------ paced resubmits
    _RUN_PARTS = ("pending", "unsettled", "claiming", "window", "notes", "log")

    def run_keys(self, run_id: int) -> list[str]:
        """The keys of one paced resubmit, in the order the ``run_*.lua`` scripts take them
        (the last one, the set of runs to drive, is shared)."""
        k = self.keys
        return [k.resubmit_run(run_id),
                *(k.resubmit_run_part(run_id, part) for part in self._RUN_PARTS),
                k.resubmit_runs_active]

    def create_run(self, fields: Mapping[str, str | int | float], members: Sequence[str], event: str) -> int:
        """A new run (id from a counter) with ``members`` pending, in one MULTI; returns
        its id. Finished runs older than the retention period leave the index here."""
        k = self.keys
        run_id = int(self.client.incr(k.resubmit_run_seq))
        now = self.now_ms()
        keys = self.run_keys(run_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(keys[0], mapping={"id": str(run_id), "created_at": str(now)})
        pipe.hset(keys[0], mapping=dict(fields.items()))
        for i in range(0, len(members), 1000):
            pipe.rpush(keys[1], *members[i:i + 1000])
        pipe.rpush(keys[6], event)
        pipe.zadd(k.resubmit_runs, {str(run_id): now})
        pipe.zremrangebyscore(k.resubmit_runs, 0, now - self.retention_s * 1000)
        pipe.sadd(k.resubmit_runs_active, str(run_id))
        pipe.execute()
        return run_id

    def active_runs(self, limit: int) -> list[int]:
        """Up to ``limit`` runs to drive, in a random order (``SRANDMEMBER``: with more
        runs than one pass takes, every run still gets passes)."""
        raw = cast("list[str]", self.client.srandmember(self.keys.resubmit_runs_active, limit))
        return [int(r) for r in raw or ()]

    def runs(self, limit: int) -> list[int]:
        """Run ids, newest first."""
        raw = cast("list[str]", self.client.zrevrange(self.keys.resubmit_runs, 0, limit - 1))
        return [int(r) for r in raw]

    def run(self, run_id: int
            ) -> tuple[dict[str, str], int, int, list[str], dict[str, str]] | None:
        """A run's hash, its pending and unsettled counts, its log and its notes (member ->
        ``code|why`` of the entries it skipped or could not publish), in one round trip;
        ``None`` if there is no such run (or it expired)."""
        keys = self.run_keys(run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(keys[0])
        pipe.llen(keys[1])
        pipe.zcard(keys[2])
        pipe.lrange(keys[6], 0, -1)
        pipe.hgetall(keys[5])
        fields, pending, unsettled, events, notes = pipe.execute()
        if not fields:
            return None
        return fields, int(pending), int(unsettled), list(events), dict(notes)

    def run_fields(self, run_id: int, names: Sequence[str]) -> list[str | None]:
        return cast("list[str | None]", self.client.hmget(self.keys.resubmit_run(run_id),
                                                          list(names)))

    def claim_run(self, run_id: int, most: int) -> list[str]:
        """Claim what the run's pace allows now (run_claim.lua): each member once, ever."""
        return [str(m) for m in self._run_scripts["run_claim"](
            keys=self.run_keys(run_id)[:4], args=[int(most)])]

    def run_unsettled(self, run_id: int, limit: int) -> tuple[list[str], dict[str, int]]:
        """The oldest ``limit`` claimed members whose outcome is unknown, and of those,
        the ones whose publish is not confirmed yet (member -> claim ms)."""
        keys = self.run_keys(run_id)
        unsettled = cast("list[str]", self.client.zrange(keys[2], 0, limit - 1))
        if not unsettled:
            return [], {}
        scores = self.client.zmscore(keys[3], unsettled)
        return unsettled, {m: int(s) for m, s in zip(unsettled, scores, strict=True)
                           if s is not None}

    def settle_run(self, run_id: int, outcomes: Sequence[tuple[str, str, str]],
                   window: int) -> tuple[str, str]:
        """Record outcomes, apply the stop rule, see if done (run_settle.lua); the run's
        status and what changed (``""``: nothing)."""
        status, changed = self._run_scripts["run_settle"](
            keys=self.run_keys(run_id),
            args=[_json([list(o) for o in outcomes]) if outcomes else "[]", int(window),
                  self.retention_s * 1000, str(run_id)])
        return str(status), str(changed)

    def control_run(self, run_id: int, action: str, by: str) -> tuple[bool, str]:
        """Pause, resume or cancel (run_control.lua): whether it moved, and the status now
        (``""``: no such run)."""
        moved, status = self._run_scripts["run_control"](
            keys=self.run_keys(run_id), args=[action, by, self.retention_s * 1000])
        return bool(moved), str(status)

    def maxmemory_policy(self) -> str | None:
        """The server's ``maxmemory-policy``, from ``INFO memory`` (the documented ACL rule
        grants ``info``; ``CONFIG``, in the same ``@dangerous`` category, is refused wherever
        ``INFO`` is, so it is not asked: a refusal stays in ``ACL LOG``); ``None`` if ``INFO``
        is refused."""
        try:
            policy = self.client.info("memory").get("maxmemory_policy")
        except redis.RedisError:
            return None
        return str(policy) if policy else None

    def now_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def prune(self, limit: int = 500) -> int:
        """Remove terminal records older than the retention period; returns how many."""
        cutoff = self.now_ms() - self.retention_s * 1000
        replies = self._pipeline_each([
            ("zrangebyscore", (k.state_index(state), "-inf", cutoff, 0, limit))
            for k in self.shards.keys for state in TERMINAL])
        ids = [str(i) for part in replies for i in part]
        if not ids:
            return 0
        return self._remove(ids, cutoff)

    def _remove(self, ids: list[str], cutoff: int) -> int:
        names = dict(zip(ids, (n for (n,) in self.fields(ids, ("name",))), strict=True))
        removed = 0
        for shard, group in self._by_shard(ids).items():
            sk = self.shards.keys[shard]
            keys, states = self._shared_keys(TERMINAL, shard=shard)
            for task_id in group:
                keys += [sk.task(task_id), sk.name_index(names[task_id] or "")]
            spec = {"ids": group, "cutoff_ms": cutoff,
                    "terminal": sorted(s.value for s in TERMINAL)}
            removed += int(self._scripts["prune"](keys=keys, args=[states, _json(spec)]))
        return removed

    # ------------------------------------------------------------------ reads
    def get(self, task_id: str) -> TaskRecord | None:
        raw = cast("dict[str, str]", self.client.hgetall(self.keys_of(task_id).task(task_id)))
        return self._record(task_id, raw) if raw else None

    def started_by(self, task_id: str, wid: str) -> StepResult | None:
        """After a ``started`` step whose reply was lost (Redis went away once it was sent):
        its result if the record shows it applied (started by worker incarnation ``wid``),
        ``None`` if it did not apply and may be sent again."""
        raw = self.get_raw(task_id)
        if raw.get("state") != TaskState.STARTED.value or raw.get("wid") != wid:
            return None
        return StepResult(applied=True, previous=TaskState.SUBMITTED.value,
                          now_ms=int(raw.get("hb_at") or 0),
                          attempt=int(raw.get("attempt") or 0), state=TaskState.STARTED,
                          values={"ckpt": raw.get("ckpt", ""), "queue": raw.get("queue", "")})

    def get_raw(self, task_id: str) -> dict[str, str]:
        return cast("dict[str, str]", self.client.hgetall(self.keys_of(task_id).task(task_id)))

    def history(self, task_id: str) -> list[Transition]:
        raw = self.get_raw(task_id)
        return self._history(task_id, raw)

    @staticmethod
    def _history(task_id: str, raw: dict[str, str]) -> list[Transition]:
        """Parse the ``h1..hN`` entries of a record (format in ``_lib.lua``)."""
        out = []
        previous = TaskState.UNSUBMITTED
        base = _int(raw.get("sub_at"))
        current = raw.get("worker") or ""
        for n in range(1, _int(raw.get("hn")) + 1):
            entry = raw.get(f"h{n}")
            if entry is None:
                continue
            to, delta, attempt, worker, reason = entry.split("|", 4)
            worker = current if worker == "*" else worker
            state = TaskState(to)
            out.append(
                Transition(
                    task_id=task_id,
                    from_state=previous,
                    to_state=state,
                    at=from_ms(base + int(delta)),  # type: ignore[arg-type]
                    attempt=int(attempt),
                    worker=worker or None,
                    reason=reason or None,
                )
            )
            previous = state
        return out

    def counts(self) -> dict[TaskState, int]:
        """Tasks per state, summed over the shards (one pipeline)."""
        replies = self._pipeline_each([("zcard", (k.state_index(state),))
                                       for k in self.shards.keys for state in STATE_ORDER])
        n = len(STATE_ORDER)
        return {s: sum(int(replies[j * n + i]) for j in range(len(self.shards.keys)))
                for i, s in enumerate(STATE_ORDER)}

    def sample_counts(self, keep: int) -> bool:
        """Add :meth:`counts` to the count history unless this Redis-clock minute has a
        sample already (a lock per minute: one sample whichever worker asks first); keep
        the newest ``keep``. Returns whether it sampled."""
        now = self.now_ms()
        minute = now - now % 60_000
        if not self.client.set(self.keys.lock(f"counts:{minute}"), "1", nx=True, px=120_000):
            return False
        counts = {state.value: n for state, n in self.counts().items()}
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(self.keys.count_history, {_json({"at": minute, "counts": counts}): minute})
        pipe.zremrangebyrank(self.keys.count_history, 0, -keep - 1)
        pipe.execute()
        return True

    def count_history(self, since_ms: int) -> list[tuple[int, dict[str, int]]]:
        """The count samples taken at or after ``since_ms``, oldest first: ``(minute ms,
        {state: n})``."""
        rows = cast("list[str]", self.client.zrangebyscore(self.keys.count_history,
                                                           since_ms, "+inf"))
        out = []
        for raw in rows:
            sample = json.loads(raw)
            out.append((int(sample["at"]), {str(k): int(v)
                                            for k, v in sample["counts"].items()}))
        return out

    def scheduled(self, limit: int = 100) -> list[TaskRecord]:
        """The next ``limit`` scheduled tasks, soonest first (each shard's soonest, merged)."""
        if limit < 1:
            return []
        shards = self.shards.keys
        replies = self._pipeline_each([
            ("zrange", (k.state_index(TaskState.SCHEDULED), 0, limit - 1, False, True))
            for k in shards])
        # ties ordered by id, as within one sorted set
        merged = heapq.merge(*([(float(score), str(i), shard) for i, score in pairs]
                               for shard, pairs in enumerate(replies)))
        picked = [(shard, task_id) for _, task_id, shard in itertools.islice(merged, limit)]
        return self._records(picked, lambda k: k.state_index(TaskState.SCHEDULED))

    def tasks(
        self,
        state: TaskState | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        worker: str | None = None,
    ) -> list[TaskRecord]:
        """Newest first. Walks the state or name index when given (else every task, newest
        first) and filters on the other criteria; a queue or a worker is a filter only (no
        index of its own: it would cost every record ~135 bytes). Each shard's index is read
        a page at a time (one pipeline for every shard that needs one) and the pages are
        merged by score, so the answer is the same as from one index; at most
        ``_MAX_EXAMINED`` records are examined in all."""
        if limit < 1:
            return []
        if state is not None:
            def index(k: Keys) -> str:
                return k.state_index(state)
        elif name is not None:
            def index(k: Keys) -> str:
                return k.name_index(name)
        else:
            def index(k: Keys) -> str:
                return k.all_tasks
        shards = self.shards.keys
        count = len(shards)
        batch = max(limit, 100)
        page = batch if count == 1 else batch // count + 16
        cursors = [0] * count
        buffers: list[collections.deque[tuple[float, str]]] = [
            collections.deque() for _ in range(count)]
        exhausted = [False] * count
        found: list[TaskRecord] = []
        examined = 0
        while len(found) < limit and examined < _MAX_EXAMINED:
            need = [i for i in range(count) if not buffers[i] and not exhausted[i]]
            if need:
                replies = self._pipeline_each([
                    ("zrevrange", (index(shards[i]), cursors[i], cursors[i] + page - 1, True))
                    for i in need])
                for i, pairs in zip(need, replies, strict=True):
                    if not pairs:
                        exhausted[i] = True
                    buffers[i].extend((float(score), str(m)) for m, score in pairs)
                    cursors[i] += len(pairs)
            # newest first across the shards, until a shard's page runs out (it is read
            # further before anything older than its next entry is taken)
            picked: list[tuple[int, str]] = []
            while len(picked) < batch:
                heads = [(*buffers[i][0], i) for i in range(count) if buffers[i]]
                if not heads:
                    break
                i = max(heads)[2]  # ties by id, as within one sorted set
                picked.append((i, buffers[i].popleft()[1]))
                if not buffers[i] and not exhausted[i]:
                    break
            if not picked:
                break
            examined += len(picked)
            records = self._records(picked, index, cursors)
            for record in records:
                if ((state is None or record.state == state)
                        and (name is None or record.name == name)
                        and (queue is None or record.queue == queue)
                        and (worker is None or record.worker == worker)):
                    found.append(record)
                    if len(found) == limit:
                        break
        return found

    def _records(self, picked: Sequence[tuple[int, str]], index: Callable[[Keys], str],
                 cursors: list[int] | None = None) -> list[TaskRecord]:
        """The records of ``(shard, id)`` pairs, in order (one pipeline). An id whose record
        expired behind its index's back leaves ``index`` here (lazily tidied), and the
        shard's read position in ``cursors`` moves back by one: what followed it moved up."""
        shards = self.shards.keys
        raws = self._pipeline_each([("hgetall", (shards[shard].task(task_id),))
                                    for shard, task_id in picked])
        out = []
        gone: dict[int, list[str]] = {}
        for (shard, task_id), raw in zip(picked, raws, strict=True):
            if raw:
                out.append(self._record(task_id, raw))
            else:
                gone.setdefault(shard, []).append(task_id)
        for shard, ids in gone.items():
            self.client.zrem(index(shards[shard]), *ids)
            if cursors is not None:
                cursors[shard] -= len(ids)
        return out

    @staticmethod
    def _record(task_id: str, raw: dict[str, str]) -> TaskRecord:
        err = _maybe_json(raw.get("err"))
        return TaskRecord(
            task_id=task_id,
            name=raw.get("name", ""),
            version=_int(raw.get("ver")) if raw.get("ver") not in (None, "") else None,
            queue=raw.get("queue") or None,
            state=TaskState(raw.get("state", TaskState.UNSUBMITTED)),
            attempt=_int(raw.get("attempt")),
            retry_attempt=_int(raw.get("retries")),
            submitted_at=from_ms(raw.get("sub_at")),
            started_at=from_ms(raw.get("start_at")),
            retried_at=from_ms(raw.get("retry_at")),
            completed_at=from_ms(raw.get("done_at")),
            heartbeat_at=from_ms(raw.get("hb_at")),
            run_at=from_ms(raw.get("run_at")),
            worker=raw.get("worker") or None,
            error=ErrorInfo(str(err.get("type", "")), str(err.get("message", "")))
            if isinstance(err, dict) else None,
            progress=_maybe_json(raw.get("progress")),
            checkpoint=_maybe_json(raw.get("ckpt")),
        )

    def refused_counts(self) -> dict[str, int]:
        """The refusal counters, summed over the shards."""
        out: dict[str, int] = {}
        for raw in self._pipeline_each([("hgetall", (k.stats,)) for k in self.shards.keys]):
            for key, value in raw.items():
                out[key] = out.get(key, 0) + int(value)
        return out
