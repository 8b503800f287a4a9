"""The beat watch's records in memory (the ``PeriodicStore`` part), as ``periodic.lua``
keeps them: each run or slot counted once, the runs kept bounded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobbers_celery.core.periodic import MAX_SCHEDULES, PeriodicSchedule
from jobbers_celery.store.periodic import MAX_EVENT_AGE_MS, schedule_from
from jobbers_celery.store.scripts import to_json
from jobbers_celery.testing.memory import Memory

__all__ = ["MemoryPeriodic"]

_Run = dict[str, str | int]


class _Schedule:
    def __init__(self) -> None:
        self.h: dict[str, str] = {}
        self.runs: dict[str, _Run] = {}
        self.order: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.waiting: dict[str, int] = {}

    def settle(self, now: int, ended: str | None = None, s_end: int = 0,
               e_end: int = 0) -> list[str]:
        """``periodic.lua``'s settle: the waiting runs an end or their age decides."""
        out: list[str] = []
        for rid, sx in sorted(self.waiting.items(), key=lambda kv: (kv[1], kv[0])):
            flag = done = False
            if ended is not None and rid != ended and s_end <= sx <= e_end:
                flag = done = True
            elif not any(o != rid and at <= sx for o, at in self.running.items()):
                done = True
            elif sx < now - MAX_EVENT_AGE_MS:
                flag = done = True
            if done:
                del self.waiting[rid]
            run = self.runs.get(rid)
            if flag and run is not None and not run.get("ovl"):
                run["ovl"] = 1
                self.incr("overlap")
                out.append(rid)
        return out

    def add(self, run: _Run, score: int, keep: int) -> None:
        rid = str(run["id"])
        self.runs[rid] = run
        self.order[rid] = score
        for old, _ in sorted(self.order.items(), key=lambda kv: (kv[1], kv[0]))[
                :max(0, len(self.order) - keep)]:
            del self.order[old]
            self.runs.pop(old, None)

    def incr(self, name: str, by: int = 1) -> None:
        self.h[name] = str(int(self.h.get(name, "0")) + by)


class MemoryPeriodic(Memory):
    """The beat watch's part of the in-memory store."""

    def __init__(self) -> None:
        super().__init__()
        self._periodic: dict[str, _Schedule] = {}
        self._periodic_seen: dict[str, int] = {}

    def _watched(self, name: str) -> _Schedule | None:
        if name not in self._periodic_seen and len(self._periodic_seen) >= MAX_SCHEDULES:
            return None
        self._periodic_seen.setdefault(name, self.now_ms())
        return self._periodic.setdefault(name, _Schedule())

    def periodic_learn(self, name: str, fields: Mapping[str, str],
                       next_in_ms: int | None) -> bool:
        with self._lock:
            sched = self._watched(name)
            if sched is None:
                return False
            now = self.now_ms()
            sched.h.update(fields)
            if next_in_ms is not None:
                sched.h["next_at"] = str(now + int(next_in_ms))
            sched.h["seen_at"] = str(now)
            sched.h.pop("removed_at", None)
            self._periodic_seen[name] = now
            return True

    def periodic_remove(self, name: str) -> bool:
        with self._lock:
            sched = self._periodic.get(name)
            if sched is None or "removed_at" in sched.h:
                return False
            sched.h["removed_at"] = str(self.now_ms())
            sched.h.pop("next_at", None)
            return True

    def periodic_publish(self, name: str, task_id: str, task: str, slot_in_ms: int,
                         next_in_ms: int | None, keep: int, tolerance_ms: int) -> int:
        with self._lock:
            sched = self._watched(name)
            if sched is None:
                return 0
            now = self.now_ms()
            slot = now + int(slot_in_ms)
            out = 1
            run = sched.runs.get(task_id)
            if run is not None:  # a worker started it before beat recorded its publish
                start = run.get("start")
                pub = min(now, int(start)) if start is not None else now
                # each time is estimated: slot <= publish <= start (periodic.lua)
                slot = min(slot, pub)
                run.update(slot=slot, pub=pub)
                if start is not None and not run.get("late") and int(start) - slot > tolerance_ms:
                    run["late"], out = 1, 2
                    sched.incr("late")
            else:
                run = {"id": task_id, "slot": slot, "pub": now, "state": "published"}
                sched.incr("runs")
                sched.h["last_state"] = "published"
            sched.add(run, slot, keep)
            sched.h.update(task=task, last_pub=str(now))
            if next_in_ms is not None:
                sched.h["next_at"] = str(now + int(next_in_ms))
            return out

    def periodic_start(self, name: str, task_id: str, task: str, keep: int,
                       tolerance_ms: int, stale_ms: int, age_ms: float = 0
                       ) -> tuple[bool, list[str]]:
        with self._lock:
            sched = self._watched(name)
            if sched is None:
                return False, []
            now = self.now_ms()
            started = now - max(0, min(int(age_ms), MAX_EVENT_AGE_MS))
            run = sched.runs.get(task_id)
            if run is None:
                run = {"id": task_id, "state": "published"}
                sched.order[task_id] = started
                sched.incr("runs")
                sched.h.setdefault("task", task)
                sched.h.setdefault("source", "worker")
            if "start" in run:
                return False, []
            run.update(start=started, state="started")
            # times estimated from other clocks and sends: slot <= publish <= start
            if run.get("pub") is not None and int(run["pub"]) > started:
                run["pub"] = started
            first = int(run.get("pub", started))
            if run.get("slot") is not None and int(run["slot"]) > first:
                run["slot"] = first
                sched.order[task_id] = first
            late = False
            slot = run.get("slot")
            if slot is not None and not run.get("late") and started - int(slot) > tolerance_ms:
                run["late"], late = 1, True
                sched.incr("late")
            sched.running = {i: at for i, at in sched.running.items()
                             if at > now - stale_ms and i != task_id}
            for other, at in sched.running.items():
                if at > started:
                    sched.waiting.setdefault(other, at)
            if any(at <= started for at in sched.running.values()):
                sched.waiting[task_id] = started
            sched.running[task_id] = started
            sched.add(run, sched.order.get(task_id, started), keep)
            sched.h.update(last_start=str(started), last_state="started")
            return late, sched.settle(now)

    def periodic_end(self, name: str, task_id: str, state: str,
                     age_ms: float = 0) -> list[str]:
        with self._lock:
            sched = self._periodic.get(name)
            if sched is None:
                return []
            now = self.now_ms()
            sched.running.pop(task_id, None)
            run = sched.runs.get(task_id)
            if run is None:
                sched.waiting.pop(task_id, None)
                return sched.settle(now)
            ended = now - max(0, min(int(age_ms), MAX_EVENT_AGE_MS))
            if run.get("start") is not None:  # estimated: an end never precedes its start
                ended = max(ended, int(run["start"]))
            run.update(end=ended, state=state)
            sched.h.update(last_end=str(ended), last_state=state)
            if "start" in run:
                return sched.settle(now, task_id, int(run["start"]), ended)
            return sched.settle(now)

    def periodic_missed(self, name: str, judged_to: str, slots: Sequence[int],
                        keep: int) -> int:
        with self._lock:
            sched = self._periodic.get(name)
            if (not slots or sched is None or sched.h.get("judged_to", "") != judged_to
                    or "removed_at" in sched.h):
                return 0
            for slot in slots:
                sched.add({"id": f"missed:{slot}", "slot": slot, "state": "missed"}, slot,
                          keep)
            sched.h.update(judged_to=str(slots[-1]), last_state="missed")
            sched.incr("missed", len(slots))
            return len(slots)

    def periodic_late(self, name: str, tolerance_ms: int) -> list[str]:
        with self._lock:
            sched = self._periodic.get(name)
            if sched is None:
                return []
            since = int(sched.h.get("late_to", "0"))
            upto = self.now_ms() - tolerance_ms
            if upto <= since:
                return []
            out = []
            for rid, score in sorted(sched.order.items(), key=lambda kv: kv[1]):
                run = sched.runs.get(rid)
                if (since < score <= upto and run is not None and "pub" in run
                        and "start" not in run and not run.get("late")):
                    run["late"] = 1
                    sched.incr("late")
                    out.append(rid)
            sched.h["late_to"] = str(upto)
            return out

    def periodic_names(self) -> list[str]:
        with self._lock:
            return sorted(self._periodic_seen, key=lambda n: (self._periodic_seen[n], n))

    def periodic_state(self, name: str) -> dict[str, str]:
        with self._lock:
            sched = self._periodic.get(name)
            return dict(sched.h) if sched is not None else {}

    def periodic_schedules(self, runs: int) -> list[PeriodicSchedule]:
        with self._lock:
            out = []
            for name in sorted(self._periodic):
                sched = self._periodic[name]
                ids = sorted(sched.order, key=lambda i: (sched.order[i], i), reverse=True)
                texts = [to_json(sched.runs[i]) for i in ids[:max(0, runs)]
                         if i in sched.runs]
                out.append(schedule_from(name, sched.h, texts))
            return out
