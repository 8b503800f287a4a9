"""What every part of the in-memory store shares: the records, one lock, the clock.

Why: the parts (steps, running, reads, scheduling) are mixins of one object, as the Redis
store's parts are functions of one connection; this is that connection. The records are
kept as the flat fields Redis keeps, read back through the real store's parsers
(``store/reads.py``), so a :class:`~jobbers_celery.TaskRecord` and its history look the
same whichever store made them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.workflow import aliases
from jobbers_celery.store.reads import _history, _record

__all__ = ["HeartbeatSent", "Memory", "history_of", "record_of"]


def record_of(task_id: str, raw: dict[str, str]) -> TaskRecord:
    """A record read from its fields, as the Redis store reads it."""
    return _record(task_id, raw)


def history_of(task_id: str, raw: dict[str, str]) -> list[Transition]:
    """A record's transitions, as the Redis store reads them."""
    return _history(task_id, raw)


@dataclass(frozen=True, slots=True)
class HeartbeatSent:
    """One heartbeat that reached the store (``progress`` and ``checkpoint`` as the JSON
    text the task sent): what a test asserts on when it checks what a task reported."""

    task_id: str
    attempt: int
    progress: str | None
    checkpoint: str | None


class Memory:
    """The state the parts share, and the clock (``ClockStore``). Thread-safe: one lock,
    held by each step for its whole work, so each is atomic as a Lua script is."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._records: dict[str, dict[str, str]] = {}
        self._publishing: dict[str, int] = {}  # id -> publish lease deadline (ms)
        self._locks: dict[str, int] = {}
        self._leases: dict[str, tuple[str, int]] = {}
        self._offset_ms = 0
        self._epoch = uuid.uuid4().hex
        self._refused: Counter[str] = Counter()
        #: workflow key -> {member id: submitted at ms}; alias -> workflow key; workflow
        #: key -> when it was cancelled as a whole (ms): see jobbers_celery.core.workflow
        self._workflows: dict[str, dict[str, int]] = {}
        self._workflow_aliases: dict[str, str] = {}
        self._workflows_cancelled: dict[str, int] = {}
        #: Every heartbeat the store accepted, oldest first.
        self.heartbeats: list[HeartbeatSent] = []

    def now_ms(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    def advance(self, seconds: float) -> None:
        """Move the store's clock ``seconds`` forward (a countdown comes due at once)."""
        with self._lock:
            self._offset_ms += int(seconds * 1000)

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ms()
            if self._locks.get(name, 0) > now:
                return False
            self._locks[name] = now + ttl_ms
            return True

    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ms()
            holder = self._leases.get(key)
            if holder is not None and holder[0] != token and holder[1] > now:
                return False
            self._leases[key] = (token, now + ttl_ms)
            return True

    def _join_workflow(self, task_id: str, create: dict[str, str], now: int) -> bool:
        """Index a member whose record its ``submit`` step just made (as
        ``transition.lua`` does); whether its workflow is marked cancelled."""
        key = create["wf"]
        self._workflows.setdefault(key, {})[task_id] = now
        for alias in aliases(create):
            self._workflow_aliases.setdefault(alias, key)  # the first keeps it (as Redis)
        return key in self._workflows_cancelled

    def epoch(self, task_id: str, max_age: float = 0.0) -> str:
        return self._epoch

    def recheck_master(self) -> bool:
        return False  # no Sentinel here: a refusal is final
