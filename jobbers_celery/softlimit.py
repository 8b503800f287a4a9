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
"""

from __future__ import annotations

import signal
import threading
from contextlib import AbstractContextManager

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


def _main_thread() -> bool:
    return _SIG is not None and threading.current_thread() is _MAIN


class _Shielded:
    """``shielded()``: a plain context manager (a generator-based one costs a few
    microseconds more, on every task)."""

    __slots__ = ("drop", "old")

    def __init__(self, drop: bool) -> None:
        self.drop = drop
        self.old: set[int | signal.Signals] | None = None

    def __enter__(self) -> None:
        if _main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)

    def __exit__(self, *exc: object) -> None:
        old = self.old
        if old is None:
            return
        if self.drop and _SIG in signal.sigpending():
            signal.sigtimedwait(_SOFT, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held-back SIGTERM lands now


class _Allowed:
    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False

    def __enter__(self) -> None:
        if _main_thread():
            self.active = True
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def shielded(drop: bool = True) -> AbstractContextManager[None]:
    """Defer the soft limit for the block; drop one that arrived meanwhile, unless
    ``drop=False`` (a heartbeat inside the task body: the limit then lands right after)."""
    return _Shielded(drop)


def allowed() -> AbstractContextManager[None]:
    """Let the soft limit interrupt the block (the task body)."""
    return _Allowed()
