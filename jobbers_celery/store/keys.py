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
wf         the workflow key of a canvas member (see core/workflow.py; absent for a task
           published alone)        root, par, grp  Celery's root_id, parent_id, group
chd        a chord header member: its callback's id
end        a chain link: the id of the chain's last link
nxt        "1": it publishes tracked successors when it completes (chain, link)
ix         the argument-index digests it is entered under, space-separated (see
           core/search.py; absent when no argument path is indexed for it)
ql         the running attempt's queue latency, ms (counted in the history when it ends)
uq         a unique task's lock: ``<s|e|w>:<ttl ms>:<key digest>`` (until start, end or a
           window; see core/unique.py and ``Keys.unique``)
fp         a fair-share task's place (score) in its key's parked list when the release
           pass took it out: parked again at its start, it goes back there (fair.lua)
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

__all__ = ["SERIES_CONF", "SERIES_DAY", "SERIES_HOUR", "STATE_ORDER", "Keys", "Shards",
           "shard_tags"]

#: The order in which per-state index keys are passed to the scripts.
STATE_ORDER: tuple[TaskState, ...] = tuple(TaskState)

#: The history's keys after their namespace, as printf formats: an hour of a series (kind,
#: hour; the name follows, never formatted: Lua's would stop at a NUL), a day's index of
#: names (kind, day), the settings. ``_lib.lua``'s step fills them in (``string.format``)
#: after the tag of the task it steps; the loader puts them in the script
#: (``store/scripts.py``): this is their one home. No quote or backslash in them.
SERIES_HOUR = ":ser:%s:%d:"
SERIES_DAY = ":ser:idx:%s:%d"
SERIES_CONF = ":ser:conf"


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

    def argument_index(self, digest: str) -> str:
        """Sorted set of the tasks of this shard whose indexed argument path holds one
        value (``digest``: :func:`jobbers_celery.core.search.digest`), scored by submission
        (ms): written by the ``submit`` step that makes the record, trimmed to the newest
        ``MAX_PER_VALUE``, pruned with the records (their field ``ix`` names the digests)."""
        return f"{self._ns}:arg:{digest}"

    def workflow(self, key: str) -> str:
        """Sorted set of a workflow's members in this shard, scored by submission (ms):
        each member's ``submit`` step adds it in its own shard (the same script as its
        record), so a workflow is read from every shard; pruned with its records."""
        return f"{self._ns}:wf:{key}"

    def workflow_alias(self, alias: str) -> str:
        """String: the workflow key an id names besides its members' (a nested group's, a
        chord callback's, a chain's last link's, known before that task is recorded),
        written by the steps of the members of this shard that name it; expires with the
        retention period."""
        return f"{self._ns}:wfa:{alias}"

    def workflow_cancelled(self, key: str) -> str:
        """String: when the workflow was cancelled as a whole (ms), written in every
        shard: a member recorded while it is set is cancelled by its own ``submit`` step.
        Expires with the retention period."""
        return f"{self._ns}:wfx:{key}"

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

    def unique(self, digest: str) -> str:
        """String: the id of the copy holding a unique task's lock (``digest``: its key's
        SHA-256, see core/unique.py), with an expiry. The record's tag with one shard (the
        step that creates the record takes it), the global one with several. With
        several, ``<this>:retaken`` (a hash, field ``n``; built in uniq.lua, same slot and
        expiry) counts the resubmits that took it again while its copy held it: a late
        delete by that copy takes one off instead of deleting."""
        return f"{self._ns}:uq:{digest}"

    def concurrency(self, name: str) -> str:
        """Sorted set of running ``name`` tasks holding a ``max_concurrent`` lease (expiry)."""
        return f"{self._ns}:conc:{name}"

    # Fair shares (``concurrency_key``, see core/fairshare.py and ``_lib.lua``'s fair
    # section), in the global slot. ``digest``: the key's 64 hex digits first (fixed length:
    # no separator a value or a name could forge), then the task name.

    def fair_running(self, name: str, digest: str) -> str:
        """Sorted set: the ``name`` tasks of key ``digest`` that started (lease expiry);
        an entry counts only while its lease in ``concurrency(name)`` is live."""
        return f"{self._ns}:fs:c:{digest}:{name}"

    def fair_parked(self, name: str, digest: str) -> str:
        """Sorted set: the ``name`` tasks of key ``digest`` parked past its cap, scored by
        the time each was first parked (first in, first out; one parked again at its start
        keeps its place, see ``fp``)."""
        return f"{self._ns}:fs:p:{digest}:{name}"

    def fair_released(self, name: str, digest: str) -> str:
        """Sorted set: parked tasks of key ``digest`` released (made due) and not started
        yet, scored by when the release stops counting (a lost publish self-heals)."""
        return f"{self._ns}:fs:r:{digest}:{name}"

    @property
    def fair_index(self) -> str:
        """Sorted set of ``<digest><name>`` (a key with parked tasks), scored by the release
        pass's last visit (round robin)."""
        return f"{self._ns}:fs:idx"

    @property
    def fair_caps(self) -> str:
        """Hash ``<digest><name>`` -> the cap per key its parked tasks were given."""
        return f"{self._ns}:fs:cap"

    @property
    def pauses(self) -> str:
        """Hash of the pauses: ``task:<name>`` / ``queue:<name>`` -> JSON ``{"at": ms,
        "by": text}`` (the global one, read by every worker; each shard keeps a copy of the
        task names, read by ``hold.lua`` in the same script as the hold; see
        :mod:`jobbers_celery.store.pauses`)."""
        return f"{self._ns}:pauses"

    def held(self, name: str) -> str:
        """Sorted set of the tasks of ``name`` held in this shard because that name is
        paused (scored by when held): what a resume publishes again."""
        return f"{self._ns}:held:{name}"

    @property
    def cancelling(self) -> str:
        """Sorted set of ``cancel(terminate=True)`` requests, scored by when to interrupt."""
        return f"{self._ns}:cancelling"

    @property
    def clock(self) -> str:
        """A shard's hash: ``tick`` (last sign of life from any worker or cleaner, ms),
        ``resumed_at`` (end of the last gap in those signs: a Redis outage or pause, or a
        change of server: restart or failover, told by ``run_id``), ``quiet_from`` and
        ``quiet_to`` (the last shorter silence, longer than 1.5 refresh periods: heartbeat
        verdicts leave it out). The global one: the
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

    def series(self, kind: str, hour: int, name: str) -> str:
        """Hash: one hour of a per-minute series (kind ``n`` a task name, ``q`` a queue):
        field the minute of the hour, value ``"s ql e rt n f r"``; written by ``_lib.lua``'s
        step in the task's shard (which builds the same name from the task key's tag) when
        an attempt ends, expires ``jobbers_history_days`` after the hour (see
        :mod:`jobbers_celery.core.series`)."""
        return self._ns + SERIES_HOUR % (kind, hour) + name

    def series_index(self, kind: str, day: int) -> str:
        """Sorted set of the names (``n``) or queues (``q``) a day's series hold, capped;
        score: the name's first event that day (ms). Sorted, not a plain set, so that the
        steps' script needs only commands the documented ACL rule grants (zscore, zcard,
        zadd; no sismember, scard)."""
        return self._ns + SERIES_DAY % (kind, day)

    @property
    def series_conf(self) -> str:
        """Hash ``days``, ``cap``: the history settings the steps read, written by the
        workers' housekeeping (the script's defaults without it: 7 days, 200 names)."""
        return self._ns + SERIES_CONF

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

    @property
    def periodic_schedules(self) -> str:
        """Sorted set of the beat schedules watched (names, at most
        ``core.periodic.MAX_SCHEDULES``), scored by when they were last learned (ms)."""
        return f"{self._ns}:periodic"

    def periodic(self, name: str, part: str = "") -> str:
        """A schedule's hash (``part`` empty: task, description, next slot, counters), its
        ``runs`` hash (run id -> JSON), its ``order`` sorted set (run ids by slot, trimmed to
        ``jobbers_periodic_keep_runs``) and its ``running`` sorted set (ids by start ms)."""
        return f"{self._ns}:periodic:{part}:{name}" if part else f"{self._ns}:periodic:s:{name}"

    def lock(self, name: str) -> str:
        return f"{self._ns}:lock:{name}"

    def alert_mark(self, digest: str) -> str:
        """String: an alert was sent for a (rule, kind, thing) within the rule's
        ``min_interval`` (expires; see ``store/alerts.py``)."""
        return f"{self._ns}:alert:mark:{digest}"

    def alert_count(self, digest: str) -> str:
        """Counter: dead letters of a rate rule's thing in one window (expires)."""
        return f"{self._ns}:alert:count:{digest}"

    @property
    def metrics_lease(self) -> str:
        """String: the token of the one process that reports the cluster-wide metric gauges
        (expires unless that process renews it; see ``jobbers_celery.telemetry.metrics``)."""
        return f"{self._ns}:metrics:lease"

    def rate_window(self, name: str, digest: str) -> str:
        """Sorted set: the starts of ``name`` tasks with rate-limit key ``digest`` (64 hex
        digits: the value is never in a key) in the last period, scored by ms (global;
        see ``_lib.lua``'s ``rate_wait``)."""
        return f"{self._ns}:rl:w:{name}:{digest}"

    def rate_waiting(self, name: str, digest: str) -> str:
        """Sorted set: the ``name`` tasks of key ``digest`` told to wait, scored by run_at."""
        return f"{self._ns}:rl:q:{name}:{digest}"

    def rate_held(self, name: str) -> str:
        """Sorted set: the ``name`` tasks told to wait by their rate limit, scored by run_at
        (what the operators' pages count)."""
        return f"{self._ns}:rl:held:{name}"

    @property
    def rate_limits(self) -> str:
        """Hash: task name -> the rate that overrides its declared ``rate_limit_by``
        (``10/s``) or ``off``; read by every start step (see ``store/ratelimits.py``)."""
        return f"{self._ns}:rl:conf"


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
