"""Fair shares in the store: the start step's part (``_lib.lua``'s fair section, ``fair.lua``
first in the sharded layout), the release pass a worker's scheduler runs, and what
operators read. The rules are in ``_lib.lua``; the keys in ``store/keys.py`` (``fs:*``).

Cost: on one shard the keyed cap is decided inside the start step (no added call); with
several shards one ``fair.lua`` call in the global slot comes first, as ``conc.lua`` does
for ``max_concurrent``. The release pass costs one read per scheduler pass, and one
script call when some key has parked tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from jobbers_celery.core.fairshare import DIGEST_LEN, FairHeld, FairKey, Released
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.store.sharded import Sharded

__all__ = ["ON_THE_WAY_MS", "PARK_BACKSTOP_MS", "admit", "admit_many", "held", "publish_spec",
           "release", "spec", "take", "unreleased", "withdraw", "withdraw_many"]

#: A parked task's ``run_at``: a backstop only (the release pass makes it due when its key
#: has room); should its entry in the key's list be lost, it is published then, and parked
#: again if its key is still full.
PARK_BACKSTOP_MS = 900_000
#: How long a task sent to the broker (a fair publish let through, or a parked task
#: released) counts against its key's room before it starts: one whose message was lost,
#: or that was cancelled or dropped before it started, stops holding room back after this.
ON_THE_WAY_MS = 300_000
#: Keys the release pass visits per scheduler pass (the least recently visited first).
RELEASE_KEYS_PER_PASS = 200

log = escaped_logger("jobbers.store")


def member(name: str, digest: str) -> str:
    """The index member of a key: the digest (fixed length) then the name."""
    return digest + name


def spec(s: Sharded, name: str, key: FairKey) -> dict[str, Any]:
    """The start step's ``fair`` spec field for ``name`` tasks of ``key``."""
    k = s.keys
    return {"c": k.fair_running(name, key.digest), "p": k.fair_parked(name, key.digest),
            "r": k.fair_released(name, key.digest), "i": k.fair_index, "caps": k.fair_caps,
            "m": member(name, key.digest), "d8": key.short, "park_ms": PARK_BACKSTOP_MS}


def publish_spec(s: Sharded, name: str, key: FairKey) -> dict[str, Any]:
    """The submit step's ``fairpub`` spec field (one shard: decided in that step)."""
    return {**spec(s, name, key), "conc": s.keys.concurrency(name), "cap": key.cap,
            "way_ms": ON_THE_WAY_MS}


def admit(s: Sharded, name: str, task_id: str, key: FairKey) -> tuple[bool, bool]:
    """Sharded layout, before a publish's step: whether its message may go now (counted
    on its way to start), else it is parked in the global slot (``False``); and whether
    this call counted it (``False``: an earlier publish of the same id had), so that a
    step then refused withdraws it (:func:`withdraw`)."""
    got = _fair_call(s, "admit", name, task_id, key, ON_THE_WAY_MS)
    return bool(got & 1), not got & 2


def admit_many(s: Sharded, calls: Sequence[tuple[str, str, FairKey]]
               ) -> list[tuple[bool, bool]]:
    """:func:`admit` of a bulk publish's fair members (``(name, task id, key)``), in order,
    in one round trip (``EVALSHA`` of the same script, pipelined: each call sees the ones
    before it). On Redis Cluster, or for a call the pipeline got an error for (the script
    not loaded yet: it did not run; a script Redis < 7 must load without its shebang), one
    :func:`admit` at a time. Raises if the store cannot be reached: the caller's publish
    then goes out unrecorded, as a failed step's does."""
    if not calls:
        return []
    if s._cluster or len(calls) == 1:
        return [admit(s, name, task_id, key) for name, task_id, key in calls]
    pipe = s.client.pipeline(transaction=False)
    sha = s._scripts["fair"].sha
    for name, task_id, key in calls:
        keys, args = _fair_args(s, "admit", name, task_id, key, ON_THE_WAY_MS)
        pipe.evalsha(sha, len(keys), *keys, *args)
    replies = pipe.execute(raise_on_error=False)
    out = []
    for (name, task_id, key), got in zip(calls, replies, strict=True):
        if isinstance(got, Exception):
            out.append(admit(s, name, task_id, key))
        else:
            out.append((bool(int(got) & 1), not int(got) & 2))
    return out


def withdraw(s: Sharded, name: str, task_id: str, key: FairKey) -> None:
    """A publish :func:`admit` counted whose step was refused (a unique duplicate, an id
    recorded already) or failed: it is neither on its way nor parked (it held one of its
    key's places for ``ON_THE_WAY_MS``, or headed its parked tasks)."""
    withdraw_many(s, [(name, task_id, key)])


def withdraw_many(s: Sharded, calls: Sequence[tuple[str, str, FairKey]]) -> None:
    """:func:`withdraw` of many publishes (``(name, task id, key)``) in one round trip."""
    if not calls:
        return
    pipe = s.client.pipeline(transaction=False)
    for name, task_id, key in calls:
        pipe.zrem(s.keys.fair_released(name, key.digest), task_id)
        pipe.zrem(s.keys.fair_parked(name, key.digest), task_id)
    pipe.execute()


def _fair_args(s: Sharded, mode: str, name: str, task_id: str, key: FairKey, ms: int,
               *more: str | bytes) -> tuple[list[str], list[str | int | bytes]]:
    """The keys and arguments of a ``fair.lua`` call about one task."""
    k = s.keys
    return ([k.concurrency(name), k.fair_running(name, key.digest),
             k.fair_parked(name, key.digest), k.fair_released(name, key.digest),
             k.fair_index, k.fair_caps],
            [mode, int(ms), key.cap, task_id, member(name, key.digest), *more])


def _fair_call(s: Sharded, mode: str, name: str, task_id: str, key: FairKey, ms: int,
               *more: str | bytes) -> int:
    keys, args = _fair_args(s, mode, name, task_id, key, ms, *more)
    return int(s._scripts["fair"](keys=keys, args=args))


def take(s: Sharded, name: str, task_id: str, key: FairKey, lease_ms: int) -> int:
    """Sharded layout, before the start step: take a lease of ``key`` (1 taken now, 2 held
    already), or park the task in the global slot (0: full). A task not parked yet is
    parked at its place (``_lib.lua``'s ``fair_place``: the place the release pass took it
    out of, else its submission), read from its record, in its own shard: one read and one
    more call, only then (the key full, the task not in its list)."""
    got = _fair_call(s, "take", name, task_id, key, lease_ms)
    if got == 3:
        fp, sub_at = s.client.hmget(s.keys_of(task_id).task(task_id), ["fp", "sub_at"])
        got = _fair_call(s, "take", name, task_id, key, lease_ms, fp or "", sub_at or "")
    return got


def release(s: Sharded, limit: int = RELEASE_KEYS_PER_PASS,
            keys: Sequence[tuple[str, str]] | None = None) -> Released:
    """The release pass: the parked tasks whose key has room now, for the caller to claim
    and publish as due (:func:`unreleased` for those it could not claim); over the keys
    with parked tasks (up to ``limit``, the least recently visited first), or over
    ``keys`` (``(name, digest)``: the key of a task that just ended). Each released task's
    record is told the place it had (:func:`_remember_places`, one more call when some
    task was released)."""
    k = s.keys
    if keys is None:
        members = [str(m) for m in s.client.zrange(k.fair_index, 0, limit - 1)]
    else:
        members = [member(name, digest) for name, digest in keys]
    members = [m for m in members if len(m) > DIGEST_LEN]
    if not members:
        return Released({}, 0)
    script_keys = [k.fair_index, k.fair_caps]
    for m in members:
        name, digest = m[DIGEST_LEN:], m[:DIGEST_LEN]
        script_keys += [k.concurrency(name), k.fair_running(name, digest),
                        k.fair_parked(name, digest), k.fair_released(name, digest)]
    now, per, places = s._scripts["fair"](keys=script_keys,
                                          args=["release", ON_THE_WAY_MS, *members])
    out: dict[str, tuple[str, str]] = {}
    at: dict[str, str] = {}
    for m, ids, scores in zip(members, per or (), places or (), strict=False):
        for task_id, score in zip(ids or (), scores or (), strict=False):
            out[str(task_id)] = (m[DIGEST_LEN:], m[:DIGEST_LEN])
            at[str(task_id)] = str(score)
    _remember_places(s, at)
    return Released(out, int(now))


def _remember_places(s: Sharded, places: dict[str, str]) -> None:
    """Write on each released task's record the place it had in its key's list (field
    ``fp``; ``fair.lua``'s ``place``, one call per shard), which it gets back if it is
    parked again at its start. Lost if the store goes away meanwhile (logged, not raised:
    the release applied and its tasks must still be published): such a task parked again
    is placed by its submission."""
    if not places:
        return
    script = s._scripts["fair"]
    calls: list[tuple[Any, list[str], list[Any]]] = []
    for shard, ids in s._by_shard(places).items():
        sk = s.shards.keys[shard]
        calls.append((script, [sk.task(i) for i in ids], ["place", *(places[i] for i in ids)]))
    try:
        s._fan(calls)
    except redis.RedisError as exc:
        log.warning("could not record the place of released tasks %s (parked again, they "
                    "are placed by their submission): %s", ", ".join(places), exc)


def unreleased(s: Sharded, ids: Sequence[tuple[str, str, str]]) -> None:
    """Released tasks that were not claimed (cancelled, removed, already published by the
    backstop): they stop holding their key's room back at once. ``(task id, name,
    digest)``."""
    if not ids:
        return
    pipe = s.client.pipeline(transaction=False)
    for task_id, name, digest in ids:
        pipe.zrem(s.keys.fair_released(name, digest), task_id)
    pipe.execute()


def held(s: Sharded, limit: int = 100) -> list[FairHeld]:
    """The keys holding tasks back now, most parked first (up to ``limit`` keys; the index
    lists only keys with parked tasks). On their way: the entries that still count (an
    expired one is pruned only by the next check of its key)."""
    k = s.keys
    members = [str(m) for m in s.client.zrange(k.fair_index, 0, 999)]
    members = [m for m in members if len(m) > DIGEST_LEN]
    if not members:
        return []
    caps = s.client.hmget(k.fair_caps, members)
    now = s.now_ms()
    pipe = s.client.pipeline(transaction=False)
    for m in members:
        name, digest = m[DIGEST_LEN:], m[:DIGEST_LEN]
        pipe.zcard(k.fair_parked(name, digest))
        pipe.zcount(k.fair_released(name, digest), f"({now}", "+inf")
        pipe.zcard(k.fair_running(name, digest))
    counts = pipe.execute()
    out = [FairHeld(m[DIGEST_LEN:], m[:8], m[:DIGEST_LEN], int(cap or 1),
                    *counts[3 * i:3 * i + 3])
           for i, (m, cap) in enumerate(zip(members, caps, strict=True))]
    out.sort(key=lambda h: (-h.parked, h.name, h.digest))
    return out[:limit]
