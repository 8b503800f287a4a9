"""Keep Celery's soft time limit out of jobbers' own bookkeeping.

On prefork, ``soft_time_limit`` (and so the ``timeout`` option) is enforced by sending SIGUSR1
to the pool child, which raises ``SoftTimeLimitExceeded`` wherever the child happens to be.
If that is inside a lifecycle step, nobody knows whether the step was applied: a record could
stay ``submitted`` or ``started`` forever, or a retry be recorded and never published. So the
signal is blocked while jobbers records, and allowed only around the task body; a limit that
lands during the bookkeeping after the body is discarded (the outcome is already decided).
The signals that interrupt a prefork child (SIGTERM, SIGQUIT, SIGHUP) are held back the same
way, but never dropped: they land as soon as the bookkeeping is done. Only the main thread
is affected (prefork children and solo); elsewhere these are no-ops.

A signal mask is per thread, and billiard signals the whole process: with another thread in
the process (an OpenTelemetry SDK's exporter thread in a pool child, say), the kernel hands
the signal to that thread and Python still runs the handler in the main thread, mask or no
mask. So while other threads run, the Python-level handlers are also swapped, for the
bookkeeping only, for ones that note the signal; the noted ones land (a soft limit is
dropped) when the bookkeeping is done. With the main thread alone the mask suffices.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any

__all__ = ["allowed", "shielded"]

_SIG = getattr(signal, "SIGUSR1", None)
#: Signals that interrupt a prefork child (billiard raises SystemExit for them). Held back,
#: never dropped, while jobbers records: a second SIGTERM in the middle of applying a
#: shutdown policy would otherwise kill the child before the policy is recorded.
_TERM = {getattr(signal, n) for n in ("SIGTERM", "SIGQUIT", "SIGHUP") if hasattr(signal, n)}
#: Built once: every task's lifecycle masks and unmasks them (a per-task cost).
_HELD: frozenset[signal.Signals] = frozenset({_SIG, *_TERM}) if _SIG is not None else frozenset()
_SOFT: frozenset[signal.Signals] = frozenset({_SIG}) if _SIG is not None else frozenset()
_MAIN = threading.main_thread()
#: ``signal.signal``'s C function: the public wrapper converts the old handler to an enum,
#: which costs ~2 us a call (a ValueError caught per callable handler), and a task with
#: other threads in its process swaps handlers 16 times.
_set_handler: Callable[[int, Any], Any] = signal._signal.signal  # type: ignore[attr-defined]


def _main_thread() -> bool:
    return _SIG is not None and threading.current_thread() is _MAIN


#: The interrupting signals first: should one land, it is the one that matters.
_ORDER: tuple[signal.Signals, ...] = tuple(sorted(_HELD, key=lambda sig: sig == _SIG))


class _Deferral:
    """The handlers of the held signals, swapped for ones that note them (main thread)."""

    __slots__ = ("handlers", "noted")

    def __init__(self) -> None:
        self.noted: list[int] = []
        self.handlers: dict[signal.Signals, Any] = {}

    def swap(self) -> None:
        for sig in _ORDER:
            self.handlers[sig] = _set_handler(sig, self._note)

    def unswap(self) -> None:
        for sig, handler in self.handlers.items():
            _set_handler(sig, handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.noted.append(signum)

    def land(self, drop: bool) -> None:
        """Run the handlers of the noted signals, as unmasking lets held-back ones land
        (a soft limit only unless ``drop``)."""
        noted, self.noted = self.noted, []
        for sig in _ORDER:
            if sig in noted and not (drop and sig == _SIG):
                handler = self.handlers[sig]
                if callable(handler):
                    handler(sig, None)  # billiard's: raises SystemExit or the soft limit
                elif handler == signal.SIG_DFL and sig != _SIG:
                    signal.raise_signal(sig)


#: The deferral whose handlers are in place now, if any (main thread only).
_active: _Deferral | None = None


class _Shielded:
    """``shielded()``: a plain context manager (a generator-based one costs a few
    microseconds more, on every task)."""

    __slots__ = ("deferral", "drop", "old")

    def __init__(self, drop: bool) -> None:
        self.drop = drop
        self.old: set[int | signal.Signals] | None = None
        self.deferral: _Deferral | None = None

    def __enter__(self) -> None:
        global _active
        if _main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
            if _active is None and threading.active_count() > 1:
                self.deferral = _active = _Deferral()
                _active.swap()

    def __exit__(self, *exc: object) -> None:
        global _active
        old = self.old
        if old is None:
            return
        if self.drop and _SIG in signal.sigpending():
            signal.sigtimedwait(_SOFT, 0)
        deferral, self.deferral = self.deferral, None
        if deferral is not None:
            deferral.unswap()
            _active = None
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held-back SIGTERM lands now
        if deferral is not None:
            deferral.land(self.drop)


class _Allowed:
    __slots__ = ("active", "paused")

    def __init__(self) -> None:
        self.active = False
        self.paused: _Deferral | None = None

    def __enter__(self) -> None:
        global _active
        if _main_thread():
            self.active = True
            paused = _active
            if paused is not None:  # the body runs with the real handlers
                self.paused, _active = paused, None
                paused.unswap()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
            if paused is not None:
                paused.land(drop=False)  # what came during the bookkeeping lands now

    def __exit__(self, *exc: object) -> None:
        global _active
        if self.active:
            signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
            paused, self.paused = self.paused, None
            if paused is not None:
                paused.swap()
                _active = paused


def shielded(drop: bool = True) -> AbstractContextManager[None]:
    """Defer the soft limit for the block; drop one that arrived meanwhile, unless
    ``drop=False`` (a heartbeat inside the task body: the limit then lands right after)."""
    return _Shielded(drop)


def allowed() -> AbstractContextManager[None]:
    """Let the soft limit interrupt the block (the task body)."""
    return _Allowed()
