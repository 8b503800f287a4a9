"""What a worker sends while its tasks run: heartbeats (``heartbeat.lua``) and its liveness
refresh (``alive.lua``, one round trip per server)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.store.base import (
    Alive,
    Halt,
    Heartbeat,
)
from jobbers_celery.store.errors import UNREACHABLE
from jobbers_celery.store.scripts import to_json
from jobbers_celery.store.sharded import Sharded

__all__ = ["alive", "heartbeat"]

log = escaped_logger("jobbers.store")


def heartbeat(
    s: Sharded,
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
        k = s.keys_of(task_id)
        if s.sharded:  # the lease is renewed by the worker's liveness refresh
            conc = k.concurrency("")
        else:
            conc = s.keys.concurrency(name or "")
            if lease_cap_ms:
                spec["lease_cap_ms"] = int(lease_cap_ms)
        raw = s._heartbeat([k.task(task_id), k.heartbeat_due, conc, k.stats],
                              [to_json(spec)])
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


def alive(s: Sharded, wid: str, gaps: tuple[int, int], leases: Sequence[tuple[str, str]],
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
    shards, split = s.shards, s.sharded
    running_in = s._by_shard(running or ())
    notes_in: dict[int, list[tuple[str, int, str]]] = {}
    for note in notes:
        notes_in.setdefault(shards.index(note[0]), []).append(note)
    own_leases = [] if split else list(leases)  # one shard, whose script renews them
    calls = []
    for shard, sk in enumerate(shards.keys):
        mine = notes_in.get(shard, [])
        keys = [sk.clock, sk.workers, sk.worker_tasks(wid), sk.cancelling, sk.halts(wid),
                *(s.keys.concurrency(name) for name, _ in own_leases),
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
        calls.append((keys, [to_json(spec)]))
    replies = s._alive.many(calls)
    if split and leases:
        _renew_leases(s, leases, lease_cap_ms)
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


def _renew_leases(s: Sharded, leases: Sequence[tuple[str, str]], lease_cap_ms: int) -> None:
    """Renew the global concurrency leases of the capped tasks a worker runs (sharded
    layout: ``conc.lua``, one call per task name)."""
    by_name: dict[str, list[str]] = {}
    for name, task_id in leases:
        by_name.setdefault(name, []).append(task_id)
    conc = s._scripts["conc"]
    s._fan([(conc, [s.keys.concurrency(name)], ["renew", int(lease_cap_ms), *ids])
               for name, ids in by_name.items()])
