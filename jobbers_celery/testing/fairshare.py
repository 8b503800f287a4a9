"""Fair shares in memory (the ``FairStore`` part, and the keyed start): the rules of
``_lib.lua``'s fair section and ``fair.lua`` (a key's running, parked first-in-first-out
and released tasks), on the in-memory records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jobbers_celery.core.fairshare import FairHeld, FairKey, Released
from jobbers_celery.core.ratelimit import RateKey
from jobbers_celery.core.states import TaskState
from jobbers_celery.store.base import StepResult
from jobbers_celery.store.fairshare import PARK_BACKSTOP_MS
from jobbers_celery.testing.steps import MemorySteps

__all__ = ["MemoryFairShares"]

S = TaskState


class MemoryFairShares(MemorySteps):
    """Keyed ``max_concurrent`` in memory: ``(name, digest)`` -> parked ids (oldest first),
    released ids, cap."""

    def _fair(self) -> dict[tuple[str, str], tuple[list[str], set[str], int]]:
        if not hasattr(self, "_fair_keys"):
            self._fair_keys: dict[tuple[str, str], tuple[list[str], set[str], int]] = {}
        return self._fair_keys

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
            parked, released, _ = self._fair().setdefault((name, fair.digest), ([], set(),
                                                                                 fair.cap))
            mine = task_id in released
            busy = self._fair_running(name, fair.digest) + len(released) - int(mine)
            full = busy >= fair.cap or (not mine and bool(parked) and parked[0] != task_id)
            rec = self._records.get(task_id) or {}
            if not full or rec.get("state") != "submitted":
                res = self.step(task_id, S.STARTED, set_fields={**fields, "fk": fair.digest},
                                start=True, wid=wid, heartbeat_ms=heartbeat_ms,
                                cancellable=True, worker=worker, ret=("ckpt", "queue"),
                                name=name)
                if res.state is S.STARTED:
                    released.discard(task_id)
                    if task_id in parked:
                        parked.remove(task_id)
                return res
            res = self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                            delay_ms=PARK_BACKSTOP_MS, worker=worker, name=name,
                            reason=fair.parked_reason)
            released.discard(task_id)
            if res.applied and task_id not in parked:
                parked.append(task_id)
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
            parked, released, _ = self._fair().setdefault((name, fair.digest),
                                                          ([], set(), fair.cap))
            busy = self._fair_running(name, fair.digest) + len(released)
            if busy < fair.cap and not parked:
                released.add(task_id)
                return res
            parked.append(task_id)
        return self.step(task_id, S.SCHEDULED, sources=(S.SUBMITTED,),
                         delay_ms=PARK_BACKSTOP_MS, name=name,
                         reason=fair.parked_reason)

    def fair_release(self, limit: int = 200,
                     keys: Sequence[tuple[str, str]] | None = None) -> Released:
        out: dict[str, tuple[str, str]] = {}
        with self._lock:
            fair = self._fair()
            visit = list(fair)[:limit] if keys is None else [k for k in keys if k in fair]
            for name, digest in visit:
                parked, released, cap = fair[(name, digest)]
                room = cap - self._fair_running(name, digest) - len(released)
                while room > 0 and parked:
                    task_id = parked.pop(0)
                    released.add(task_id)
                    out[task_id] = (name, digest)
                    room -= 1
            return Released(out, self.now_ms())

    def fair_unreleased(self, ids: Sequence[tuple[str, str, str]]) -> None:
        with self._lock:
            for task_id, name, digest in ids:
                entry = self._fair().get((name, digest))
                if entry is not None:
                    entry[1].discard(task_id)

    def fair_held(self, limit: int = 100) -> list[FairHeld]:
        with self._lock:
            out = [FairHeld(name, digest[:8], digest, cap, len(parked), len(released),
                            self._fair_running(name, digest))
                   for (name, digest), (parked, released, cap) in self._fair().items()
                   if parked]
        out.sort(key=lambda h: (-h.parked, h.name, h.digest))
        return out[:limit]
