"""The records of paced resubmits in memory (the ``RunStore`` part): what ``run_claim.lua``,
``run_settle.lua`` and ``run_control.lua`` do to a run, so that a paced run can be driven
(:class:`~jobbers_celery.resubmit.pacer.Pacer`) without Redis.

The pace and the stop rule are not written again here: a claim counts with
:func:`jobbers_celery.resubmit.pace.allowance`, the halt is
:func:`jobbers_celery.resubmit.pace.stop_rule` (the one rule both sinks use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobbers_celery.resubmit.pace import (
    FINAL,
    SETTLED,
    RunOutcome,
    allowance,
    control_transition,
    stop_rule,
)
from jobbers_celery.store.scripts import to_json
from jobbers_celery.testing.memory import Memory

__all__ = ["MemoryRuns"]

#: The outcomes a settle counts, each in the run's field of its name (``completed``, ...).
_COUNTED = frozenset(RunOutcome) - {RunOutcome.PUBLISHED}


@dataclass
class _Run:
    fields: dict[str, str]
    pending: list[str]
    unsettled: dict[str, int] = field(default_factory=dict)  # member -> claim ms
    claiming: dict[str, int] = field(default_factory=dict)  # publish not confirmed yet
    window: list[str] = field(default_factory=list)  # newest settled outcome first
    notes: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


class MemoryRuns(Memory):
    """Paced resubmits' runs, each step atomic under the store's lock."""

    def __init__(self) -> None:
        super().__init__()
        self._runs: dict[int, _Run] = {}
        self._active: set[int] = set()

    def run_keys(self, run_id: int) -> list[str]:
        return [f"memory:run:{run_id}"]

    def create_run(self, fields: Mapping[str, str | int | float], members: Sequence[str],
                   event: str) -> int:
        with self._lock:
            run_id = max(self._runs, default=0) + 1
            values = {"id": str(run_id), "created_at": str(self.now_ms())}
            values.update({k: str(v) for k, v in fields.items()})
            self._runs[run_id] = _Run(values, list(members), log=[event])
            self._active.add(run_id)
            return run_id

    def active_runs(self, limit: int) -> list[int]:
        with self._lock:
            return sorted(self._active)[:limit]

    def runs(self, limit: int) -> list[int]:
        with self._lock:
            return sorted(self._runs, reverse=True)[:limit]

    def run(self, run_id: int
            ) -> tuple[dict[str, str], int, int, list[str], dict[str, str]] | None:
        with self._lock:
            r = self._runs.get(run_id)
            if r is None:
                return None
            return dict(r.fields), len(r.pending), len(r.unsettled), list(r.log), dict(r.notes)

    def run_fields(self, run_id: int, names: Sequence[str]) -> list[str | None]:
        with self._lock:
            r = self._runs.get(run_id)
            return [None if r is None else r.fields.get(n) for n in names]

    def claim_run(self, run_id: int, most: int) -> list[str]:
        """As ``run_claim.lua``: a queued run starts; a running one hands out what its
        pace allows now, each member once."""
        with self._lock:
            r = self._runs.get(run_id)
            if r is None:
                return []
            now = self.now_ms()
            f = r.fields
            f["last_step_at"] = str(now)
            if f.get("status") == "queued":
                f.update(status="running", started_at=str(now), paced_since=str(now),
                         published_base="0")
            if f.get("status") != "running":
                return []
            claimed = int(f.get("claimed") or 0)
            allowed = allowance(float(f["rate"]), (now - int(f["paced_since"])) / 1000) \
                - (claimed - int(f.get("published_base") or 0))
            ids = r.pending[:max(0, min(allowed, most))]
            del r.pending[:len(ids)]
            for member in ids:
                r.unsettled[member] = r.claiming[member] = now
            if ids:
                f["claimed"] = str(claimed + len(ids))
            return ids

    def run_unsettled(self, run_id: int, limit: int) -> tuple[list[str], dict[str, int]]:
        with self._lock:
            r = self._runs.get(run_id)
            if r is None:
                return [], {}
            oldest = sorted(r.unsettled, key=lambda m: r.unsettled[m])[:limit]
            return oldest, {m: r.claiming[m] for m in oldest if m in r.claiming}

    def settle_run(self, run_id: int, outcomes: Sequence[tuple[str, str, str]],
                   window: int) -> tuple[str, str]:
        """As ``run_settle.lua``: each outcome counted once, then the stop rule, then done
        once nothing is pending or unsettled."""
        with self._lock:
            r = self._runs.get(run_id)
            if r is None:
                self._active.discard(run_id)
                return "", ""
            f = r.fields
            for member, code, note in outcomes:
                if code == RunOutcome.PUBLISHED:
                    r.claiming.pop(member, None)
                elif code in _COUNTED and r.unsettled.pop(member, None) is not None:
                    r.claiming.pop(member, None)
                    name = RunOutcome(code).name.lower()
                    f[name] = str(int(f.get(name) or 0) + 1)
                    if code in SETTLED:
                        r.window.insert(0, code)
                    if note:
                        r.notes[member] = f"{code}|{note}"
            del r.window[window:]
            status, changed, now = f.get("status", ""), "", self.now_ms()
            if status == "running":
                halt_after, of_last = f.get("halt_after"), f.get("of_last")
                changed = stop_rule(r.window, int(halt_after) if halt_after else None,
                                    int(of_last) if of_last else None)
                if changed:
                    status = "halted"
                    f.update(status=status, halt_reason=changed, finished_at=str(now))
                elif not r.pending and not r.unsettled:
                    status, changed = "done", "every entry published and settled"
                    f.update(status=status, finished_at=str(now))
                if changed:
                    r.log.append(to_json({"at": now, "action": status, "by": "pacer",
                                          "detail": changed}))
            if status in FINAL and not r.unsettled:
                self._active.discard(run_id)
            return status, changed

    def control_run(self, run_id: int, action: str, by: str) -> tuple[bool, str]:
        """As ``run_control.lua``: pause, resume or cancel, if the run's status allows."""
        with self._lock:
            r = self._runs.get(run_id)
            if r is None:
                return False, ""
            f, now = r.fields, self.now_ms()
            target = control_transition(f.get("status", ""), action)
            if target is None:
                return False, f.get("status", "")
            f["status"] = target.value
            detail = ""
            if action in ("resume", "continue"):  # the pace counts from now: no burst
                f.update(paced_since=str(now), published_base=f.get("claimed") or "0")
            if action == "continue":  # the stop rule starts over; driven again
                detail = f"after: {f.get('halt_reason', '')}"
                f["halt_reason"] = ""
                f.pop("finished_at", None)
                r.window.clear()
                self._active.add(run_id)
            elif action == "cancel":
                f["finished_at"] = str(now)
            r.log.append(to_json({"at": now, "action": action, "by": by, "detail": detail}))
            if action == "cancel" and not r.unsettled:
                self._active.discard(run_id)
            return True, target.value
