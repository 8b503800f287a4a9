"""The beat watch's records (``periodic.lua``): each schedule learned, its runs and counts.

Keys (global tag, :meth:`Keys.periodic`): the set of schedules (at most
``core.periodic.MAX_SCHEDULES``) and per schedule a hash, its last runs (bounded by
``keep``) and its running runs. Every change is one script call, so beat's publish, a
worker's start and two judges never count a run or a slot twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import cast

from redis.commands.core import Script

from jobbers_celery.core.periodic import MAX_SCHEDULES, PeriodicRun, PeriodicSchedule
from jobbers_celery.store.scripts import lua_text
from jobbers_celery.store.sharded import Sharded

__all__ = ["MAX_EVENT_AGE_MS", "periodic_end", "periodic_late", "periodic_learn", "periodic_missed",
           "periodic_names", "periodic_publish", "periodic_remove", "periodic_schedules",
           "periodic_start", "periodic_state", "schedule_from"]

_PARTS = ("s", "runs", "order", "running", "waiting")
#: The most a run's start or end may be recorded after it happened (a worker's writer
#: waits out a store outage for up to 60 s, then retries once a second): an age handed
#: beyond it, or below 0 (a clock oddity), is bounded to it. A run's overlap is settled
#: at the latest this long after it started.
MAX_EVENT_AGE_MS = 90_000


def _age(age_ms: float) -> int:
    return max(0, min(int(age_ms), MAX_EVENT_AGE_MS))


def _call(s: Sharded, op: str, name: str, *args: str | float) -> object:
    script = cast("Script | None", getattr(s, "_periodic_script", None))
    if script is None:
        script = s.client.register_script(lua_text("periodic"))
        s._periodic_script = script  # type: ignore[attr-defined]
    k = s.keys
    keys = [k.periodic_schedules, k.periodic(name), *(k.periodic(name, p) for p in _PARTS[1:])]
    return script(keys=keys, args=[op, name, *args], client=s.client)


def _offset(ms: int | None) -> str:
    return "" if ms is None else str(int(ms))


def periodic_learn(s: Sharded, name: str, fields: Mapping[str, str],
                   next_in_ms: int | None) -> bool:
    """Record (or refresh) a schedule: ``fields`` (task, desc, source, period...), its next
    slot ``next_in_ms`` from now; ``False`` if the set of schedules is full."""
    pairs = [v for kv in fields.items() for v in kv]
    return bool(_call(s, "learn", name, MAX_SCHEDULES, _offset(next_in_ms), *pairs))


def periodic_remove(s: Sharded, name: str) -> bool:
    """Beat no longer lists ``name``: no slot is expected any more (kept, shown removed)."""
    return bool(_call(s, "remove", name))


def periodic_publish(s: Sharded, name: str, task_id: str, task: str, slot_in_ms: int,
                     next_in_ms: int | None, keep: int, tolerance_ms: int) -> int:
    """Beat published ``task_id`` for its slot ``slot_in_ms`` from now (<= 0: passed): 0 if
    not watched (the set is full), 2 if a worker started it first and it is late, else 1."""
    return int(cast("int", _call(s, "publish", name, task_id, int(slot_in_ms),
                                 _offset(next_in_ms), int(keep), task, MAX_SCHEDULES,
                                 int(tolerance_ms))))


def periodic_start(s: Sharded, name: str, task_id: str, task: str, keep: int,
                   tolerance_ms: int, stale_ms: int, age_ms: float = 0
                   ) -> tuple[bool, list[str]]:
    """A worker started the run ``task_id`` ``age_ms`` ago: whether it is late (once per
    run), and the runs found overlapping now (each once: a run's overlap is settled when
    the runs started before it end, or :data:`MAX_EVENT_AGE_MS` after its start)."""
    got = cast("list[int | str]", _call(
        s, "start", name, task_id, int(keep), int(tolerance_ms), int(stale_ms), task,
        MAX_SCHEDULES, _age(age_ms), MAX_EVENT_AGE_MS))
    return bool(got[1]), [str(i) for i in got[2:]]


def periodic_end(s: Sharded, name: str, task_id: str, state: str,
                 age_ms: float = 0) -> list[str]:
    """The run ``task_id`` ended ``age_ms`` ago: the runs found overlapping now."""
    got = cast("list[str]", _call(s, "end", name, task_id, state, _age(age_ms),
                                  MAX_EVENT_AGE_MS))
    return [str(i) for i in got]


def periodic_missed(s: Sharded, name: str, judged_to: str, slots: Sequence[int],
                    keep: int) -> int:
    """Record ``slots`` missed if the schedule's ``judged_to`` is still ``judged_to``
    (compare-and-set); the slots recorded (0: another judge was first)."""
    if not slots:
        return 0
    return int(cast("int", _call(s, "missed", name, judged_to, int(keep),
                                 *(int(x) for x in slots))))


def periodic_late(s: Sharded, name: str, tolerance_ms: int) -> list[str]:
    """Flag the runs published more than ``tolerance_ms`` ago and not started (once
    each); their ids."""
    return [str(i) for i in cast("list[str]", _call(s, "late", name, int(tolerance_ms)))]


def periodic_schedules(s: Sharded, runs: int) -> list[PeriodicSchedule]:
    """Every schedule watched with its newest ``runs`` runs, by name (two round trips)."""
    k = s.keys
    names = sorted(cast("list[str]", s.client.zrange(k.periodic_schedules, 0, -1)))
    if not names:
        return []
    pipe = s.client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(k.periodic(name))
        pipe.zrevrange(k.periodic(name, "order"), 0, max(0, runs - 1))
    got = pipe.execute()
    pipe = s.client.pipeline(transaction=False)
    for i, name in enumerate(names):
        ids = got[2 * i + 1] if runs > 0 else []
        pipe.hmget(k.periodic(name, "runs"), ids) if ids else pipe.echo("")
    texts = pipe.execute()
    out = []
    for i, name in enumerate(names):
        raw = texts[i] if isinstance(texts[i], list) else []
        out.append(schedule_from(name, got[2 * i], [t for t in raw if t]))
    return out


def _int(raw: str | None) -> int | None:
    try:
        return int(float(raw)) if raw not in (None, "") else None
    except ValueError:
        return None


def _run(text: str) -> PeriodicRun | None:
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    return PeriodicRun(id=str(d.get("id", "")), slot_at=_int(d.get("slot")),
                       published_at=_int(d.get("pub")), started_at=_int(d.get("start")),
                       ended_at=_int(d.get("end")), state=str(d.get("state", "")),
                       late=bool(d.get("late")), overlapping=bool(d.get("ovl")))


def schedule_from(name: str, h: Mapping[str, str], runs: Sequence[str]) -> PeriodicSchedule:
    """A schedule read from its hash and its runs' JSON (the in-memory store's too)."""
    parsed = tuple(r for r in map(_run, runs) if r is not None)
    return PeriodicSchedule(
        name=name, task=h.get("task", ""), schedule=h.get("desc", ""),
        source=h.get("source", ""), period_ms=_int(h.get("period")) or 0,
        next_at=_int(h.get("next_at")), seen_at=_int(h.get("seen_at")),
        last_published_at=_int(h.get("last_pub")), last_started_at=_int(h.get("last_start")),
        last_ended_at=_int(h.get("last_end")), last_state=h.get("last_state"),
        missed=_int(h.get("missed")) or 0, late=_int(h.get("late")) or 0,
        overlapping=_int(h.get("overlap")) or 0, runs_total=_int(h.get("runs")) or 0,
        removed_at=_int(h.get("removed_at")), runs=parsed)


def periodic_state(s: Sharded, name: str) -> dict[str, str]:
    """A schedule's raw hash (what the judge reads)."""
    return cast("dict[str, str]", s.client.hgetall(s.keys.periodic(name)))


def periodic_names(s: Sharded) -> list[str]:
    return cast("list[str]", s.client.zrange(s.keys.periodic_schedules, 0, -1))
