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
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["allowed", "shielded"]

_SIG = getattr(signal, "SIGUSR1", None)
#: Signals that interrupt a prefork child (billiard raises SystemExit for them). Held back,
#: never dropped, while jobbers records: a second SIGTERM in the middle of applying a
#: shutdown policy would otherwise kill the child before the policy is recorded.
_TERM = {getattr(signal, n) for n in ("SIGTERM", "SIGQUIT", "SIGHUP") if hasattr(signal, n)}


def _main_thread() -> bool:
    return _SIG is not None and threading.current_thread() is threading.main_thread()


@contextmanager
def shielded(drop: bool = True) -> Iterator[None]:
    """Defer the soft limit for the block; drop one that arrived meanwhile, unless
    ``drop=False`` (a heartbeat inside the task body: the limit then lands right after)."""
    if not _main_thread():
        yield
        return
    assert _SIG is not None
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {_SIG, *_TERM})
    try:
        yield
    finally:
        if drop and _SIG in signal.sigpending():
            signal.sigtimedwait({_SIG}, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held-back SIGTERM lands now


@contextmanager
def allowed() -> Iterator[None]:
    """Let the soft limit interrupt the block (the task body)."""
    if not _main_thread():
        yield
        return
    assert _SIG is not None
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {_SIG, *_TERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {_SIG, *_TERM})
