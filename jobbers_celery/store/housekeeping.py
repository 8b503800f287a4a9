"""The cleaner's scans and verdicts (``cleaner_due.lua``, ``stall.lua``), purges, pruning
(``prune.lua``) and the dropping of payloads a dead-letter entry holds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.search import MAX_INDEXED_PATHS
from jobbers_celery.core.states import RESUBMITTABLE, TERMINAL, TaskState
from jobbers_celery.store import prechecks, reads, steps
from jobbers_celery.store.base import (
    CleanerScan,
    StallVerdict,
)
from jobbers_celery.store.keys import Keys
from jobbers_celery.store.scripts import EXPIRY_SLACK_S, as_ids, as_int, to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["cleaner_due", "clock", "drop_payloads", "epochs", "last_pass_age_ms", "maxmemory_policy",
           "prune", "purge", "record_pass", "remove_terminal", "stall", "tidy_cancelling",
           "without_payload", "worker_tasks", "workers"]

log = escaped_logger("jobbers.store")

#: Records ``purge`` examines per round trip.
_PURGE_BATCH = 500


def cleaner_due(s: Sharded, gaps: tuple[int, int], lost_ms: int, limit: int
                ) -> list[CleanerScan]:
    """Ids and incarnations one cleaner pass must judge, one scan per shard (see
    cleaner_due.lua; index ranges only, never a keyspace scan; one call on one server)."""
    args = [to_json({"gap_ms": gaps[0], "cgap_ms": gaps[1], "lost_ms": int(lost_ms),
                   "limit": limit})]
    replies = s._scan(s._cleaner_scan,
                         [[k.clock, k.heartbeat_due, k.workers, k.cancelling]
                          for k in s.shards.keys], args, json.loads)
    scans = []
    for shard, out in enumerate(replies):
        scans.append(CleanerScan(now_ms=int(out["now"]), hb=as_ids(out["hb"]),
                                 dead=as_ids(out["dead"]), cancel=as_ids(out["cancel"]),
                                 resumed_at_ms=int(out.get("resumed_at") or 0),
                                 shard=shard))
    return scans


def workers(s: Sharded, since_ms: int) -> list[tuple[str, int, int]]:
    """``(incarnation, last seen ms, tasks it runs)`` of every worker incarnation seen
    alive since ``since_ms``, most recently seen first (two round trips; the latest
    sighting in any shard, the tasks summed over shards)."""
    shards = s.shards.keys
    replies = s._pipeline_each([("zrevrangebyscore",
                                    (k.workers, "+inf", since_ms, None, None, True))
                                   for k in shards])
    seen: dict[str, int] = {}
    for pairs in replies:
        for wid, at in pairs:
            seen[wid] = max(seen.get(wid, 0), int(at))
    if not seen:
        return []
    order = sorted(seen, key=lambda w: -seen[w])
    counts = s._pipeline_each([("zcard", (k.worker_tasks(wid),))
                                  for wid in order for k in shards])
    n = len(shards)
    return [(wid, seen[wid], sum(int(c) for c in counts[i * n:(i + 1) * n]))
            for i, wid in enumerate(order)]


def worker_tasks(s: Sharded, dead: Mapping[int, Sequence[str]], limit: int
                 ) -> dict[int, dict[str, list[str]]]:
    """The tasks each worker incarnation started and did not finish, oldest first, up to
    ``limit`` each, per shard: ``dead`` names the incarnations to read in each shard
    (one pipeline for them all)."""
    pairs = [(shard, wid) for shard, wids in dead.items() for wid in wids]
    keys = s.shards.keys
    replies = s._pipeline_each([("zrange", (keys[shard].worker_tasks(wid), 0, limit - 1))
                                   for shard, wid in pairs])
    out: dict[int, dict[str, list[str]]] = {}
    for (shard, wid), ids in zip(pairs, replies, strict=True):
        out.setdefault(shard, {})[wid] = [str(i) for i in ids]
    return out


def drop_payloads(s: Sharded, dead: Sequence[tuple[str, int]]) -> int:
    """Forget the payload (``msg``) of dead-lettered records whose dead-letter entry now
    holds it: ``(task id, dead-lettered attempt)`` pairs, one round trip. A record
    resubmitted or started since keeps its payload. Returns how many were dropped."""
    if not dead:
        return 0
    keep_ms = (s.retention_s + EXPIRY_SLACK_S) * 1000
    attempts = dict(dead)
    of = s.shards.of
    return sum(int(n) for n in s._fan([
        (s._drop_payload, [of(i).task(i) for i in ids],
         [keep_ms, *(str(attempts[i]) for i in ids)])
        for ids in s._by_shard(attempts).values()]))


def without_payload(s: Sharded, ids: Sequence[str]) -> dict[str, int]:
    """Of ``ids``, the resubmittable records that hold no payload (a dead-letter entry
    holds it, see :meth:`drop_payloads`): id -> attempt. One round trip."""
    if not ids:
        return {}
    of = s.shards.of
    groups = list(s._by_shard(ids).values())
    replies = s._fan([(s._has_payload, [of(i).task(i) for i in group], [])
                         for group in groups])
    out: dict[str, int] = {}
    for group, raw in zip(groups, replies, strict=True):
        for n, task_id in enumerate(group):
            state, attempt, has_msg = raw[3 * n:3 * n + 3]
            if state in RESUBMITTABLE and not int(has_msg):
                out[task_id] = as_int(attempt)
    return out


def stall(
    s: Sharded,
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
        groups.setdefault(s.shards.index(item[0]), []).append(item)
    if forget:
        if shard is None:
            raise ValueError("forget: name the shard the incarnations were found dead in")
        groups.setdefault(shard, [])
    recovered: list[dict[str, str]] = []
    dead: list[dict[str, str]] = []
    stalled = kept = 0
    for group_shard, group in groups.items():
        part = _stall(s, group_shard, group, lost_ms, lease_ms,
                      forget if group_shard == shard else ())
        recovered += part.recovered
        dead += part.dead
        stalled += part.stalled
        kept += part.kept
    return StallVerdict(recovered, dead, stalled, kept)


def _stall(s: Sharded, shard: int, items: Sequence[tuple[str, str, str, str]], lost_ms: int,
           lease_ms: int, forget: Sequence[str],
           locks: Mapping[str, str] | None = None) -> StallVerdict:
    """One ``stall.lua`` call on ``shard``'s ``items``; ``locks``: the second call of the
    sharded layout's unique recoveries (id -> ``held`` or ``duplicate:<id>``, see
    :func:`_recover_unique`)."""
    S = TaskState
    keys, states = s._shared_keys((S.STARTED, S.STALLED, S.SUBMITTED), shard=shard)
    k = s.shards.keys[shard]
    split = s.sharded
    keys += [k.clock, k.workers]
    for task_id, _, wid, name in items:
        conc = k.concurrency("") if split else s.keys.concurrency(name)
        keys += [k.task(task_id), k.worker_tasks(wid), conc, k.halts(wid)]
    keys += [k.worker_tasks(wid) for wid in forget]
    keys += [k.halts(wid) for wid in forget]
    given = locks or {}
    spec: dict[str, Any] = {
        "items": [{"id": i, "kind": kind, "wid": wid, **({"lock": given[i]} if i in given
                                                          else {})}
                  for i, kind, wid, _ in items],
        "lost_ms": int(lost_ms),
        "lease_ms": int(lease_ms),
        "ttl": s.retention_s + EXPIRY_SLACK_S,
        "forget": list(forget),
    }
    if split:
        spec["split"] = True
    out: dict[str, Any] = json.loads(
        s._scripts["stall"](keys=keys, args=[states, to_json(spec)]))
    verdict = StallVerdict(recovered=as_ids(out["recovered"]), dead=as_ids(out["dead"]),
                           stalled=int(out["stalled"]), kept=int(out["kept"]))
    if split:  # the verdicts applied: what follows them cannot undo them (free_applied)
        s._release_leases((str(i), str(n)) for i, n in as_ids(out.get("freed")))
        for task_id, uq in as_ids(out.get("unlock")):
            prechecks.free_applied(s, str(task_id), str(uq))
        again = as_ids(out.get("again"))
        if again:
            part = _recover_unique(s, shard, items, again, lost_ms, lease_ms, forget)
            verdict = StallVerdict(recovered=verdict.recovered + part.recovered,
                                   dead=verdict.dead + part.dead,
                                   stalled=verdict.stalled + part.stalled,
                                   kept=verdict.kept + part.kept)
    return verdict


def _recover_unique(s: Sharded, shard: int, items: Sequence[tuple[str, str, str, str]],
                    again: list[dict[str, Any]], lost_ms: int, lease_ms: int,
                    forget: Sequence[str]) -> StallVerdict:
    """The stall verdicts of unique tasks with a recovery left (sharded layout), which
    ``stall.lua`` left started (``again``): their locks taken in the global slot, then the
    verdict and the recovery in one ``stall.lua`` call, told who holds each lock (as the
    recovery's own take does on one shard: a recovered copy holds its key while it waits
    and runs; another copy holding it refuses the recovery, and the task is dead-lettered).
    A task whose lock cannot be taken is left started, judged again on a later pass."""
    by_id = {item[0]: item for item in items}
    info = {str(i["id"]): i for i in again}
    locks: dict[str, str] = {}
    fresh: set[str] = set()  # the locks taken now, given back if not recovered
    for task_id, item in info.items():
        try:
            holder, took = prechecks.take_unique(s, task_id, str(item["uq"]))
        except redis.RedisError as exc:
            log.warning("stalled task %s is judged again on a later pass (its unique lock "
                        "could not be taken): %s", task_id, exc)
            continue
        locks[task_id] = f"duplicate:{holder}" if holder else "held"
        if took:
            fresh.add(task_id)
    left = len(info) - len(locks)
    if not locks:
        return StallVerdict([], [], 0, left)
    try:
        part = _stall(s, shard, [by_id[i] for i in locks], lost_ms, lease_ms, forget, locks)
        done = {str(i["id"]) for i in part.recovered}
        not_recovered = set(locks) - done
    except redis.RedisError as exc:  # the reply lost: the script may have applied
        part, not_recovered = _read_back(s, info, locks, exc)
        done = {str(i["id"]) for i in part.recovered}
    for task_id in done:
        if locks[task_id] == "held" and task_id not in fresh:
            _renew_recovered(s, task_id, str(info[task_id]["uq"]))
    # a lock whose recovery's outcome is unknown is kept: if it applied, the resubmitted
    # copy needs it; if not, the holder-record check and its expiry free it
    for task_id in fresh & not_recovered:
        prechecks.free_applied(s, task_id, str(info[task_id]["uq"]))
    return StallVerdict(part.recovered, part.dead, part.stalled, part.kept + left)


def _renew_recovered(s: Sharded, task_id: str, uq: str) -> None:
    """:func:`prechecks.renew_unique` for a recovery that applied while its task held the
    lock already: the copy was started, none of its steps reached the lock's point, so no
    delete of its lock can be in flight, and the renewal does not count it re-taken
    (``uniq.lua``): the recovered copy's point deletes the key. Lost if the store went away
    (logged): the lock keeps its expiry."""
    parts = uq.split(":")
    if len(parts) != 3:
        return
    try:
        s._scripts["uniq"](keys=[s.keys.unique(parts[2])],
                           args=["renew", task_id, parts[1], "1"])
    except redis.RedisError as exc:
        log.warning("the unique lock of %s keeps its expiry (not renewed): %s", task_id, exc)


def _read_back(s: Sharded, info: Mapping[str, dict[str, Any]], locks: Mapping[str, str],
               exc: Exception) -> tuple[StallVerdict, set[str]]:
    """The outcome of unique recoveries whose ``stall.lua`` reply was lost, read from their
    records: resubmitted (``submitted``, its stalls counted), stalled (the recovery refused:
    dead-lettered) or still started (not judged: a later pass does); and the ids known not
    recovered (stalled or started). A store that does not answer leaves them unknown
    (logged; none known not recovered): one the script stalled and did not resubmit stays
    ``stalled``, not dead-lettered, as after a lost reply of any stall verdict."""
    ids = list(locks)
    try:
        got = reads.fields(s, ids, ("state", "attempt", "stalls"))
    except redis.RedisError as again:
        log.error("the stall verdicts of %s are unknown (the reply was lost: %s; the "
                  "records could not be read: %s)", ", ".join(ids), exc, again)
        return StallVerdict([], [], 0, 0), set()
    recovered: list[dict[str, Any]] = []
    not_recovered: set[str] = set()
    dead: list[dict[str, Any]] = []
    kept = 0
    for task_id, (state, attempt, stalls) in zip(ids, got, strict=True):
        item = info[task_id]
        same = attempt == str(item["attempt"])
        if state == TaskState.SUBMITTED and same and stalls == str(item["stalls"]):
            recovered.append({key: item[key] for key in
                              ("id", "msg", "retries", "name", "queue", "now", "started")})
        elif state == TaskState.STALLED and same:
            lock = locks[task_id]
            why = lock if lock != "held" else "its reply was lost"
            dead.append({**item, "reason": f"{item['reason']}; not resubmitted: {why}"})
            not_recovered.add(task_id)
            if lock == "held" and str(item["uq"]).startswith("e:"):
                prechecks.free_applied(s, task_id, str(item["uq"]))
        elif state == TaskState.STARTED and same:
            kept += 1
            not_recovered.add(task_id)
    log.warning("stall verdicts read back after a lost reply (%s): %d resubmitted, %d "
                "dead-lettered, %d judged again later", exc, len(recovered), len(dead), kept)
    return StallVerdict(recovered, dead, len(recovered) + len(dead), kept), not_recovered


def tidy_cancelling(s: Sharded, ids: Sequence[str]) -> None:
    of = s.shards.of
    for group in s._by_shard(ids).values():
        s.client.zrem(of(group[0]).cancelling, *group)


def record_pass(s: Sharded, at_ms: int, duration_ms: float, by: str,
                report: dict[str, Any]) -> None:
    s.client.hset(s.keys.clock, mapping={
        "last_at": at_ms, "last_ms": f"{duration_ms:.3f}", "by": by, "report": to_json(report),
    })


def clock(s: Sharded) -> dict[str, str]:
    return cast("dict[str, str]", s.client.hgetall(s.keys.clock))


def epochs(s: Sharded) -> list[str]:
    """Every shard's epoch id (made on first use, ``SET NX``: a shard that lost its data gets
    a new one), in shard order: one pipeline, so one round trip per Redis Cluster node. Its
    ``SET NX`` is refused wherever writes are (``OOM``, ``READONLY``): every node that holds
    a shard is probed (the watch of an emptied store, a loop's write probe)."""
    shards = s.shards
    pipe = s.client.pipeline(transaction=False)
    for keys in shards.keys:
        pipe.set(keys.epoch, uuid.uuid4().hex, nx=True)
        pipe.get(keys.epoch)
    got = pipe.execute()
    now = time.monotonic()
    out = [str(got[2 * i + 1]) for i in range(shards.count)]
    for i, epoch in enumerate(out):  # steps.epoch's cache, read fresh
        s._epochs[i] = (epoch, now)
    return out


def last_pass_age_ms(s: Sharded) -> int | None:
    """Redis-clock ms since the cleaner's last pass, ``None`` if none ran (one round trip)."""
    pipe = s.client.pipeline(transaction=False)
    pipe.time()
    pipe.hget(s.keys.clock, "last_at")
    (sec, usec), last = pipe.execute()
    if not last:
        return None
    return int(sec) * 1000 + int(usec) // 1000 - int(last)


def remove_terminal(s: Sharded, ids: Sequence[str]) -> int:
    """Delete terminal records now (``purge``), with their history and index entries."""
    if not ids:
        return 0
    return _remove(s, list(ids), cutoff=2**62)


def purge(s: Sharded, name: str | None, queue: str | None, before_ms: int | None
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
    for k in s.shards.keys:
        removed += _purge_shard(s, k, name, queue, before_ms, cancelled, skipped)
    return removed, cancelled, skipped


def _purge_shard(s: Sharded, k: Keys, name: str | None, queue: str | None,
                 before_ms: int | None, cancelled: list[str], skipped: list[str]) -> int:
    index = k.name_index(name) if name is not None else k.all_tasks
    removed = 0
    seen: set[str] = set()
    start = 0
    while True:
        ids = cast("list[str]", s.client.zrangebyscore(
            index, "-inf", "+inf" if before_ms is None else f"({before_ms}",
            start=start, num=_PURGE_BATCH))
        if not ids:
            break
        start += len(ids)
        batch = [i for i in ids if i not in seen]
        seen.update(batch)
        terminal, gone = [], []
        meta = reads.fields(s, batch, ("state", "name", "queue", "purged"))
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
                done = steps.cancel(s, task_id, "purged", set_fields={"purged": "1"})
                (cancelled if done.outcome == "cancelled" else skipped).append(task_id)
            else:
                skipped.append(task_id)
        if gone:
            s.client.zrem(index, *gone)
        n = remove_terminal(s, terminal)
        removed += n
        start -= n + len(gone)  # what was removed no longer occupies the window
    return removed


def prune(s: Sharded, limit: int = 500) -> int:
    """Remove terminal records older than the retention period; returns how many."""
    cutoff = s.now_ms() - s.retention_s * 1000
    replies = s._pipeline_each([
        ("zrangebyscore", (k.state_index(state), "-inf", cutoff, 0, limit))
        for k in s.shards.keys for state in TERMINAL])
    ids = [str(i) for part in replies for i in part]
    if not ids:
        return 0
    return _remove(s, ids, cutoff)


def _remove(s: Sharded, ids: list[str], cutoff: int) -> int:
    # the name and workflow indexes the record is in (a member of no workflow: its name
    # index again, a placeholder), and the argument indexes its field ix names
    found = dict(zip(ids, reads.fields(s, ids, ("name", "wf", "ix")), strict=True))
    removed = 0
    for shard, group in s._by_shard(ids).items():
        sk = s.shards.keys[shard]
        keys, states = s._shared_keys(TERMINAL, shard=shard)
        counts = []
        for task_id in group:
            name, workflow, ix = found[task_id]
            named = sk.name_index(name or "")
            keys += [sk.task(task_id), named, sk.workflow(workflow) if workflow else named]
            digests = (ix or "").split()[:MAX_INDEXED_PATHS]
            keys += [sk.argument_index(d) for d in digests]
            counts.append(len(digests))
        spec: dict[str, Any] = {"ids": group, "cutoff_ms": cutoff,
                                "terminal": sorted(state.value for state in TERMINAL)}
        if any(counts):
            spec["ix"] = counts
        removed += int(s._scripts["prune"](keys=keys, args=[states, to_json(spec)]))
    return removed


def maxmemory_policy(s: Sharded) -> str | None:
    """The server's ``maxmemory-policy``, from ``INFO memory`` (the documented ACL rule
    grants ``info``; ``CONFIG``, in the same ``@dangerous`` category, is refused wherever
    ``INFO`` is, so it is not asked: a refusal stays in ``ACL LOG``); ``None`` if ``INFO``
    is refused."""
    try:
        policy = s.client.info("memory").get("maxmemory_policy")
    except redis.RedisError:
        return None
    return str(policy) if policy else None
