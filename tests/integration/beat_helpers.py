"""A stand-in for celery beat in the test process: cleaner passes from a thread."""

from __future__ import annotations

import threading
import time
from typing import Any, Self

from jobbers_celery.lifecycle.cleaner import CleanReport


class Beat:
    """Runs a cleaner pass now and every ``interval`` seconds in a thread; keeps the reports
    and, with when they happened, the errors (expected while a fault test's Redis is away;
    the stall tests assert there is none)."""

    def __init__(self, jobbers: Any, interval: float = 1.0) -> None:
        self.jobbers = jobbers
        self.interval = interval
        self.reports: list[CleanReport] = []
        self.errors: list[tuple[float, BaseException]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-beat", daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                self.reports.append(self.jobbers.cleaner.run(by="test beat"))
            except Exception as exc:  # noqa: BLE001 - kept for the test to judge
                self.errors.append((time.monotonic(), exc))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()
