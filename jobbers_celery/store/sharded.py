"""The one sharded connection every part of the store runs on.

The keys spread over the dataset's shards (see :mod:`jobbers_celery.store.keys`): a step
runs in its task's shard; what spans tasks (the cleaner's scan, the scheduler's due sets, a
worker's liveness refresh, counts and listings) runs once per shard, in one pipeline per
server, and merges the answers. :class:`Sharded` holds the client, the loaded scripts, the
shard layout and the fan-out; the parts (``steps``, ``running``, ``reads``,
``housekeeping``, ``scheduling``, ``runs``, ``deadletters``) are functions of it, and
:class:`~jobbers_celery.store.redis.RedisStore` binds them as its methods.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self

import redis

from jobbers_celery.core.config import DEFAULT_SHARDS
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.connect import Endpoint, client_endpoint, is_cluster, recheck_master
from jobbers_celery.store.errors import UNREACHABLE, is_outage
from jobbers_celery.store.fastcall import FastScript, as_refusal, not_a_cluster_client
from jobbers_celery.store.keys import STATE_ORDER, Keys, Shards
from jobbers_celery.store.scripts import LuaScript, lua_text, script_source

__all__ = ["Sharded"]

log = escaped_logger("jobbers.store")


class Sharded:
    """Typed access to the lifecycle records of one jobbers namespace: the connection,
    its scripts and its shards."""

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
            name: LuaScript(client, script_source(name))
            for name in ("transition", "complete", "claim", "prune", "heartbeat", "cancel",
                         "alive", "cleaner_due", "stall", "conc", "hold", "release",
                         "uniq", "fair")
        }
        self._transition = FastScript(client, self._scripts["transition"])
        self._complete = FastScript(client, self._scripts["complete"])
        self._heartbeat = FastScript(client, self._scripts["heartbeat"])
        # the liveness thread gets its own connection: it must not wait on the shared pool
        self._alive = FastScript(client, self._scripts["alive"])
        self._due = client.register_script(lua_text("due"))
        # the scans of the scheduler's polls and the cleaner's passes (see _scan)
        self._due_scan = FastScript(client, self._due)
        self._cleaner_scan = FastScript(client, self._scripts["cleaner_due"])
        self._lease = client.register_script(lua_text("lease"))
        self._drop_payload = client.register_script(lua_text("drop_payload"))
        self._has_payload = client.register_script(lua_text("has_payload"))
        self._run_scripts = {name: client.register_script(lua_text(name))
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
                 shards: int | None = None) -> Self:
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

    def recheck_master(self) -> bool:
        """See :func:`~jobbers_celery.store.connect.recheck_master` (Redis Sentinel)."""
        return recheck_master()

    def now_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        """Take a best-effort lock that expires by itself (efficiency only, never safety)."""
        return bool(self.client.set(self.keys.lock(name), "1", nx=True, px=ttl_ms))

    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take the lease ``key`` for ``token`` if it is free, or renew it if ``token`` holds
        it; ``False`` while another token holds it (lease.lua, one round trip)."""
        return bool(self._lease(keys=[key], args=[token, int(ttl_ms)]))

    def endpoint(self) -> Endpoint | None:
        """The server, user and db the store's connections go to; ``None`` on Redis
        Cluster (no one node)."""
        return client_endpoint(self.client)
