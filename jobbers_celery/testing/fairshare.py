"""Fair shares in memory (the ``FairStore`` part, and the keyed start): the rules of
``_lib.lua``'s fair section and ``fair.lua`` (a key's running, parked first-in-first-out
and released tasks), on the in-memory records and the store's clock (``advance()``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from jobbers_celery.core.fairshare import FairHeld, FairKey, Released
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import fairshare as store_fairshare
from jobbers_celery.store.base import SentSteps, StepResult, Submission
from jobbers_celery.store.fairshare import PARK_BACKSTOP_MS
from jobbers_celery.testing.steps import MemorySteps

__all__ = ["MemoryFairShares"]

S = TaskState

#: A key's parked ids -> their place (score), its released ids -> when they stop counting
#: (ms), its cap.
_Entry = tuple[dict[str, float], dict[str, int], int]


def _place(rec: dict[str, str], now: int) -> float:
    """``_lib.lua``'s ``fair_place``: where a task parked at its start goes in its key's
    list (the place the release pass took it out of, else its submission, else now)."""
    for field in ("fp", "sub_at"):
        try:
            return float(rec[field])
        except (KeyError, ValueError):
            continue
    return float(now)


def _park(parked: dict[str, float], task_id: str, place: float, now: int) -> None:
    """``_lib.lua``'s ``fair_park``: one parked now goes after every task parked before
    it, in the same millisecond too; a task parked already keeps its place."""
    if task_id in parked:
        return
    if place >= now and parked:
        last = max(parked.values())
        if last >= place:
            place = last + 0.001
    parked[task_id] = round(place, 3)


def _in_order(parked: dict[str, float]) -> list[str]:
    """The parked ids, first out first (by place, then id: Redis's sorted set order)."""
    return sorted(parked, key=lambda i: (parked[i], i))


class MemoryFairShares(MemorySteps):
    """Keyed ``max_concurrent`` in memory: ``(name, digest)`` -> parked ids (by place),
    released ids (until they start, or stop counting ``ON_THE_WAY_MS`` after they were
    sent, on the store's clock), cap."""

    def _fair(self) -> dict[tuple[str, str], _Entry]:
        if not hasattr(self, "_fair_keys"):
            self._fair_keys: dict[tuple[str, str], _Entry] = {}
        return self._fair_keys

    def _fair_entry(self, name: str, fair: FairKey, now: int) -> _Entry:
        """The key's entry, its expired released ids dropped (``fair_full``'s prune)."""
        entry = self._fair().setdefault((name, fair.digest), ({}, {}, fair.cap))
        _expire(entry[1], now)
        return entry

    def _fair_running(self, name: str, digest: str) -> int:
        return sum(1 for r in self._records.values() if r.get("name") == name
                   and r.get("state") == "started" and r.get("fk") == digest)

    def start(self, task_id: str, *, name: str, worker: str | None, wid: str,
              heartbeat_ms: int | None, cap: int | None, lease_cap_ms: int, defer_ms: int,
              fields: dict[str, str], rate: RateKey | None = None,
              fair: FairKey | None = None) -> StepResult:
        """As ``start``; ``fair``: the cap is its key's (a rate limit too is not checked
        with a key here: the Redis store checks both)."""
        if fair is None:
            return super().start(task_id, name=name, worker=worker, wid=wid,
                                 heartbeat_ms=heartbeat_ms, cap=cap,
                                 lease_cap_ms=lease_cap_ms, defer_ms=defer_ms, fields=fields,
                                 rate=rate)
        with self._lock:
            now = self.now_ms()
            parked, released, _ = self._fair_entry(name, fair, now)
            mine = task_id in released
            busy = self._fair_running(name, fair.digest) + len(released) - int(mine)
            full = busy >= fair.cap or (not mine and bool(parked)
                                        and _in_order(parked)[0] != task_id)
            rec = self._records.get(task_id) or {}
            if not full or rec.get("state") != "submitted":
                res = self.step(task_id, S.STARTED, set_fields={**fields, "fk": fair.digest},
                                start=True, wid=wid, heartbeat_ms=heartbeat_ms,
                                cancellable=True, worker=worker, ret=("ckpt", "queue"),
                                name=name)
                if res.state is S.STARTED:
                    released.pop(task_id, None)
                    parked.pop(task_id, None)
                return res
            res = self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                            delay_ms=PARK_BACKSTOP_MS, worker=worker, name=name,
                            reason=fair.parked_reason)
            released.pop(task_id, None)
            if res.applied:
                _park(parked, task_id, _place(rec, now), now)
            return res

    def submit(self, task_id: str, *, sources: Iterable[TaskState], reason: str,
               name: str | None = None, create: dict[str, str] | None = None,
               fields: dict[str, str] | None = None, delete: Sequence[str] = (),
               lease_ms: int | None = None, ret: Sequence[str] = (),
               later: tuple[int, str] | None = None, fair: FairKey | None = None,
               need: str | None = None) -> StepResult:
        """As ``submit``; ``fair``: parked at once when its key has no room."""
        res = super().submit(task_id, sources=sources, reason=reason, name=name,
                             create=create, fields=fields, delete=delete, lease_ms=lease_ms,
                             ret=ret, later=later, need=need)
        if fair is None or not name or not res.applied or res.state is not S.SUBMITTED:
            return res
        with self._lock:
            now = self.now_ms()
            parked, released, _ = self._fair_entry(name, fair, now)
            _expire(released, now)
            mine = task_id in released
            busy = self._fair_running(name, fair.digest) + len(released) - mine
            # as fair_full: room, and no parked task ahead of it (itself at the head: a
            # parked task come due is published)
            if busy < fair.cap and (mine or not parked or _in_order(parked)[0] == task_id):
                parked.pop(task_id, None)
                released[task_id] = now + store_fairshare.ON_THE_WAY_MS
                return res
            _park(parked, task_id, now, now)  # at its publish: its submission
        return self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                         delay_ms=PARK_BACKSTOP_MS, name=name,
                         reason=fair.parked_reason)

    def submit_many(self, items: Sequence[Submission]) -> SentSteps:
        """As ``submit_many``; a member never sent gives its key's place back (``withdraw_many``
        in Redis: neither on its way nor parked)."""
        sent = super().submit_many(items)
        fair = {item.task_id: (item.name, item.fair.digest) for item in items
                if item.fair is not None and item.name}

        def unsent(ids: Collection[str]) -> None:
            with self._lock:
                for task_id in ids:
                    entry = self._fair().get(fair[task_id]) if task_id in fair else None
                    if entry is not None:
                        entry[0].pop(task_id, None)
                        entry[1].pop(task_id, None)

        return SentSteps(sent.results, unsent)

    def fair_release(self, limit: int = 200,
                     keys: Sequence[tuple[str, str]] | None = None) -> Released:
        out: dict[str, tuple[str, str]] = {}
        with self._lock:
            now = self.now_ms()
            fair = self._fair()
            visit = list(fair)[:limit] if keys is None else [k for k in keys if k in fair]
            for name, digest in visit:
                parked, released, cap = fair[(name, digest)]
                _expire(released, now)
                room = cap - self._fair_running(name, digest) - len(released)
                for task_id in _in_order(parked)[:max(room, 0)]:
                    place = parked.pop(task_id)
                    released[task_id] = now + store_fairshare.ON_THE_WAY_MS
                    out[task_id] = (name, digest)
                    rec = self._records.get(task_id)
                    if rec is not None:  # fair.lua's place: got back if parked again
                        rec["fp"] = f"{place:.3f}"
            return Released(out, now)

    def fair_unreleased(self, ids: Sequence[tuple[str, str, str]]) -> None:
        with self._lock:
            for task_id, name, digest in ids:
                entry = self._fair().get((name, digest))
                if entry is not None:
                    entry[1].pop(task_id, None)

    def fair_held(self, limit: int = 100) -> list[FairHeld]:
        with self._lock:
            now = self.now_ms()
            for _, released, _ in self._fair().values():
                _expire(released, now)
            out = [FairHeld(name, digest[:8], digest, cap, len(parked), len(released),
                            self._fair_running(name, digest))
                   for (name, digest), (parked, released, cap) in self._fair().items()
                   if parked]
        out.sort(key=lambda h: (-h.parked, h.name, h.digest))
        return out[:limit]


def _expire(released: dict[str, int], now: int) -> None:
    """Drop the released ids whose time on their way is over (``fair_full``'s
    ``ZREMRANGEBYSCORE``): a publish whose message was lost stops holding a place."""
    for task_id in [i for i, until in released.items() if until <= now]:
        del released[task_id]
