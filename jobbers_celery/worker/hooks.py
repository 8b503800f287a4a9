"""Connecting jobbers' handlers to Celery's signals, written once: strongly (``weak=False``:
a handler must outlive whatever referenced it) and once per process, however often a
module's ``connect()`` runs (``dispatch_uid``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from celery.utils.dispatch import Signal

__all__ = ["Hook", "connect_each"]

#: A signal, the handler it calls, and the handler's ``dispatch_uid``.
Hook = tuple[Signal, Callable[..., Any], str]


def connect_each(hooks: Iterable[Hook]) -> None:
    """Connect each handler to its signal under its ``dispatch_uid``."""
    for signal, handler, uid in hooks:
        signal.connect(handler, weak=False, dispatch_uid=uid)
