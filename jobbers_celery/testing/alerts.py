"""The alerts' dedupe marks and rate counters in memory (the store's ``AlertStore`` part).

Why: a test of alert rules, dedupe and rate limits must not need Redis. The marks expire
by the store's clock (``advance(seconds)`` moves it), as Redis expires them.
"""

from __future__ import annotations

from jobbers_celery.testing.memory import Memory

__all__ = ["MemoryAlerts"]


class MemoryAlerts(Memory):
    """``alert_mark`` / ``alert_extend`` / ``alert_unmark`` / ``alert_count``, in dicts."""

    def __init__(self) -> None:
        super().__init__()
        self._alert_marks: dict[str, int] = {}  # digest -> expires at (ms)
        self._alert_counts: dict[str, tuple[int, int]] = {}  # digest -> (count, expires at)

    def alert_mark(self, digest: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.now_ms()
            if self._alert_marks.get(digest, 0) > now:
                return False
            self._alert_marks[digest] = now + max(1, ttl_ms)
            return True

    def alert_extend(self, digest: str, ttl_ms: int) -> None:
        with self._lock:
            now = self.now_ms()
            if self._alert_marks.get(digest, 0) > now:
                self._alert_marks[digest] = now + max(1, ttl_ms)

    def alert_unmark(self, digest: str) -> None:
        with self._lock:
            self._alert_marks.pop(digest, None)

    def alert_count(self, digest: str, ttl_ms: int) -> int:
        with self._lock:
            now = self.now_ms()
            count, expires = self._alert_counts.get(digest, (0, 0))
            count = count + 1 if expires > now else 1
            self._alert_counts[digest] = (count, now + max(1, ttl_ms))
            return count
