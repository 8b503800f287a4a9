"""Terminal output of ``run.py``: numbered steps, a transient status line, colours."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: The numbered steps ``run.py`` shows: environment, Redis, database, services, scenario,
#: summary.
STEPS = 6


class UI:
    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.color = self.tty and not os.environ.get("NO_COLOR") and os.environ.get(
            "TERM") != "dumb"
        self.step_no = 0
        self._status = False  # a status line is on screen (TTY only)

    @property
    def width(self) -> int:
        return max(60, shutil.get_terminal_size((120, 40)).columns) if self.tty else 160

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self.paint(text, "1")

    def dim(self, text: str) -> str:
        return self.paint(text, "2")

    def state(self, state: str, width: int = 0) -> str:
        code = {"completed": "32", "failed": "31", "stalled": "31", "dropped": "31",
                "cancelled": "33", "scheduled": "33", "started": "36",
                "submitted": "34"}.get(state, "0")
        return self.paint(f"{state:<{width}}", code)

    def out(self, text: str = "") -> None:
        self.clear_status()
        print(text, flush=True)

    def status(self, text: str) -> None:
        """A transient progress line (TTY), or nothing (plain output gets the results)."""
        if self.tty:
            sys.stdout.write("\r\x1b[2K    " + self.dim(text[: self.width - 5]))
            sys.stdout.flush()
            self._status = True

    def clear_status(self) -> None:
        if self._status:
            sys.stdout.write("\r\x1b[2K")
            sys.stdout.flush()
            self._status = False

    def header(self, title: str, note: str = "") -> None:
        self.step_no += 1
        self.out(self.bold(f"[{self.step_no}/{STEPS}] {title}") + self.dim(note))

    @contextmanager
    def step(self, title: str) -> Iterator[list[str]]:
        """``[n/N] title`` ... ``done in 1.2 s``, then the lines the step added."""
        self.step_no += 1
        started = time.monotonic()
        self.out(self.bold(f"[{self.step_no}/{STEPS}] {title}"))
        notes: list[str] = []
        yield notes
        for note in notes:
            self.out(f"    {note}")
        self.out(self.dim(f"    done in {time.monotonic() - started:.1f} s"))

