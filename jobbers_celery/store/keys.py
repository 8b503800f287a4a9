"""Every Redis key and record field name jobbers uses, in one place.

The keys are spread over ``S`` shards (``jobbers_store_shards``, fixed per dataset): a task's
record and every key one of its lifecycle steps touches (state indexes, due sets, the
worker-tasks and halt sets, the shard's copy of the workers set and clock, its epoch) share
its shard's hash tag, so each script touches one slot, and on Redis Cluster the shards spread
over the masters. Keys with no task to follow (dead letters, concurrency leases, paced
resubmits, locks and leases, count history, the layout itself) share the global tag
``{<prefix>}``. With one shard, shard 0's tag is the global one: the layout of datasets
written before shards existed.

Record hash ``task:<id>`` fields (the Lua scripts use the same literal names):

=========  ==============================================================
name       task name                  ver       task version
queue      queue (routing key)        state     TaskState value
attempt    starts so far (fence)      retries   retry count (Celery's)
sub_at     first submission, ms       start_at  first start, ms
retry_at   latest later start, ms     done_at   entered a terminal state, ms
hb_at      last heartbeat, ms         run_at    scheduled time, ms
worker     last worker hostname       err       JSON {"type", "message"}
progress   JSON                       ckpt      JSON checkpoint
msg        JSON publish payload       dlq       "1" when dead_letter_policy=save
wid        worker incarnation (liveness entry) of the running attempt
hb_iv      max_heartbeat_interval, ms srec      max_stall_recoveries
cap        max_concurrent of a started attempt holding a concurrency lease
stalls     stall recoveries so far    cancel    cancellation requested (ms)
cxl        the reason a cancel request kept for the step that ends it (a revoke)
purged     "1": cancelled by purge (a tombstone purge keeps)
hn, h<n>   history: count, and entry n (format in _lib.lua)
=========  ==============================================================

``msg`` is deleted when the task completes, and once a dead-letter entry holds it (a sink
with ``entry()``, see ``drop_payload.lua``): jobbers stores a payload once at a time.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from jobbers_celery.core.states import TaskState

__all__ = ["STATE_ORDER", "Keys", "Shards", "shard_tags"]

#: The order in which per-state index keys are passed to the scripts.
STATE_ORDER: tuple[TaskState, ...] = tuple(TaskState)


def shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """The hash tag of each of ``shards`` shards: shard ``i`` gets ``<prefix>.<i>.<k>`` with
    the smallest ``k`` whose slot is in the ``i``-th of ``shards`` equal slot ranges, so the
    shards spread evenly over any contiguous assignment of slots to masters (as
    ``redis-cli --cluster create`` makes). One shard: the global tag, ``<prefix>``."""
    if shards == 1:
        return (prefix,)
    tags = []
    for i in range(shards):
        k = 0
        while key_slot(f"{prefix}.{i}.{k}".encode()) * shards // REDIS_CLUSTER_HASH_SLOTS != i:
            k += 1
        tags.append(f"{prefix}.{i}.{k}")
    return tuple(tags)


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys under one hash tag: the global one (``tag`` empty) or a shard's."""

    prefix: str
    tag: str = ""

    @property
    def _ns(self) -> str:
        return "{" + (self.tag or self.prefix) + "}"

    @property
    def layout(self) -> str:
        """String: the dataset's number of shards, written at first use (global)."""
        return f"{self._ns}:layout"

    def task(self, task_id: str) -> str:
        return f"{self._ns}:task:{task_id}"

    def state_index(self, state: TaskState) -> str:
        """Sorted set of task ids in ``state``, scored by entry time (``scheduled``: run_at)."""
        return f"{self._ns}:state:{state.value}"

    def state_indexes(self) -> list[str]:
        return [self.state_index(s) for s in STATE_ORDER]

    @property
    def all_tasks(self) -> str:
        """Sorted set of every tracked task id, scored by first submission."""
        return f"{self._ns}:all"

    def name_index(self, name: str) -> str:
        return f"{self._ns}:name:{name}"

    @property
    def publishing(self) -> str:
        """Sorted set of ids recorded as submitted but not yet confirmed published (deadline)."""
        return f"{self._ns}:publishing"

    @property
    def stats(self) -> str:
        """Hash of counters (refused transitions by kind)."""
        return f"{self._ns}:stats"

    @property
    def dead_letters(self) -> str:
        """Hash ``<task_id>:<attempt>`` -> JSON entry (the default Redis sink)."""
        return f"{self._ns}:dlq"

    @property
    def dead_letter_index(self) -> str:
        return f"{self._ns}:dlq:index"

    @property
    def dead_letter_outbox(self) -> str:
        """List of entries a sink failed to take, retried by the workers."""
        return f"{self._ns}:dlq:outbox"

    @property
    def dead_letter_set_aside(self) -> str:
        """List of dead letters set aside (JSON, newest first, bounded): the sink refused
        them for a reason of their own, or they could not be read back (see
        :mod:`jobbers_celery.deadletter.aside`)."""
        return f"{self._ns}:dlq:aside"

    @property
    def dead_letter_set_aside_count(self) -> str:
        """Counter: dead letters ever set aside (those the bound dropped included)."""
        return f"{self._ns}:dlq:aside:count"

    @property
    def heartbeat_due(self) -> str:
        """Sorted set of started tasks with ``max_heartbeat_interval``, scored by deadline."""
        return f"{self._ns}:hbdue"

    @property
    def workers(self) -> str:
        """Sorted set of worker incarnations, scored by when each was last seen alive (a copy
        per shard, each written by every liveness refresh and read by that shard's verdicts)."""
        return f"{self._ns}:workers"

    def worker_tasks(self, wid: str) -> str:
        """Sorted set of the tasks a worker incarnation started and has not finished."""
        return f"{self._ns}:wtasks:{wid}"

    def halts(self, wid: str) -> str:
        """Hash of the tasks a worker incarnation runs whose attempt the cleaner declared
        stalled: id -> ``<verdict ms>|<attempt>``; the incarnation's liveness refresh reads
        it, ends those attempts (see ``alive.lua``) and forgets each once it no longer runs it."""
        return f"{self._ns}:halt:{wid}"

    def not_running(self, wid: str) -> str:
        """Hash of the tasks recorded as started by a worker incarnation for longer than
        ``worker_lost_after`` that its last liveness refresh did not run: id -> the start
        of that attempt (ms), rewritten at every refresh (``alive.lua``). A message that
        incarnation gave back may take such a start back (``_lib.lua``'s step); its header
        alone never can."""
        return f"{self._ns}:notrun:{wid}"

    def concurrency(self, name: str) -> str:
        """Sorted set of running ``name`` tasks holding a ``max_concurrent`` lease (expiry)."""
        return f"{self._ns}:conc:{name}"

    @property
    def cancelling(self) -> str:
        """Sorted set of ``cancel(terminate=True)`` requests, scored by when to interrupt."""
        return f"{self._ns}:cancelling"

    @property
    def clock(self) -> str:
        """A shard's hash: ``tick`` (last sign of life from any worker or cleaner, ms),
        ``resumed_at`` (end of the last gap in those signs: a Redis outage or pause, or a
        change of server: restart or failover, told by ``run_id``). The global one: the
        cleaner's last pass (``last_at``, ``last_ms``, ``report``, ``by``)."""
        return f"{self._ns}:clock"

    @property
    def epoch(self) -> str:
        """A random id made once per shard's data: a record missing under the same epoch as
        its message was removed on purpose (purge, retention), not lost with the data."""
        return f"{self._ns}:epoch"

    @property
    def count_history(self) -> str:
        """Sorted set of per-state counts sampled at most once a minute, scored by the
        minute (ms): JSON ``{"at": ms, "counts": {state: n}}``, trimmed to the newest
        ``history.KEEP`` (see :mod:`jobbers_celery.telemetry.history`)."""
        return f"{self._ns}:counts:history"

    @property
    def resubmit_runs(self) -> str:
        """Sorted set of paced resubmit run ids (Redis sink), scored by creation (ms)."""
        return f"{self._ns}:runs"

    @property
    def resubmit_runs_active(self) -> str:
        """Set of the run ids the workers' scheduler passes still drive (not finished, or
        finished with claimed entries whose outcome is not known yet)."""
        return f"{self._ns}:runs:active"

    @property
    def resubmit_run_seq(self) -> str:
        """Counter: the last run id handed out."""
        return f"{self._ns}:runs:seq"

    def resubmit_run(self, run_id: int) -> str:
        """Hash: a run's selection, pace, rule, version choice, status, counters, halt
        reason and times (fields in :mod:`jobbers_celery.resubmit.pacer`)."""
        return f"{self._ns}:run:{run_id}"

    def resubmit_run_part(self, run_id: int, part: str) -> str:
        """A run's ``pending`` list (members ``task_id:attempt`` not claimed yet, in order),
        ``unsettled`` and ``claiming`` sorted sets (claimed, outcome unknown / publish not
        confirmed yet; scored by claim time), ``window`` list (outcome codes, newest first,
        for the stop rule), ``notes`` hash (member -> why it was skipped or not published)
        and ``log`` list (JSON events: start, pause, resume, cancel, halt, done)."""
        return f"{self._ns}:run:{run_id}:{part}"

    def lock(self, name: str) -> str:
        return f"{self._ns}:lock:{name}"

    @property
    def metrics_lease(self) -> str:
        """String: the token of the one process that reports the cluster-wide metric gauges
        (expires unless that process renews it; see ``jobbers_celery.telemetry.metrics``)."""
        return f"{self._ns}:metrics:lease"


class Shards:
    """The ``S`` shards of a dataset: which one holds a task, and each one's keys."""

    __slots__ = ("count", "keys")

    def __init__(self, prefix: str, count: int) -> None:
        self.count = count
        self.keys: tuple[Keys, ...] = tuple(Keys(prefix, tag)
                                            for tag in shard_tags(prefix, count))

    def index(self, task_id: str) -> int:
        """The shard of ``task_id``: CRC-32 of the id modulo ``S`` (stable across processes
        and versions, unlike ``hash()``)."""
        if self.count == 1:
            return 0
        return zlib.crc32(task_id.encode()) % self.count

    def of(self, task_id: str) -> Keys:
        return self.keys[self.index(task_id)]
