"""Rate limits keyed by arguments in memory (``rate_limit_by``; the Redis side is
:mod:`jobbers_celery.store.ratelimits` and ``_lib.lua``'s ``rate_wait``).

Why it can be trusted: the decision is not copied here; the window's entries and the
waiting callers go to :func:`jobbers_celery.core.ratelimit.turn_at` and ``wait_place``, the
model the Lua is tested against. The check runs under the store's lock with the start step, as one script.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from jobbers_celery.core.ratelimit import (
    OFF,
    WAIT_GRACE_MS,
    Rate,
    RateKey,
    parse_override,
    parse_rate,
    turn_at,
    wait_place,
)

__all__ = ["MemoryRates", "reason"]


@dataclass
class MemoryRates:
    """The windows, the waiting callers and the overrides of the in-memory store."""

    #: (name, digest) -> the starts (ms) of the key's window
    windows: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: (name, digest) -> {task id: run_at} of the callers told to wait
    waiting: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    #: name -> {task id: run_at} of the callers told to wait (the operators' counts)
    until: dict[str, dict[str, int]] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    def wait(self, name: str, rate: RateKey, task_id: str, now: int) -> tuple[int, Rate] | None:
        """``None`` when the key has room now, else the wait (ms) and the rate applied."""
        text = self.overrides.get(name)
        if text == OFF:
            return None
        lim = parse_rate(text) if text else rate.rate
        key = (name, rate.digest)
        window = [t for t in self.windows.get(key, []) if t > now - lim.period_ms]
        self.windows[key] = window
        queue = self.waiting.get(key, {})
        at = turn_at(window, queue, task_id, lim.count, lim.period_ms, now)
        place = wait_place(queue, task_id, at, now)
        queue = {i: t for i, t in queue.items() if t > now - WAIT_GRACE_MS and i != task_id}
        self.waiting[key] = queue
        if at == now:
            return None
        queue[task_id] = place
        until = self.until[name] = {i: t for i, t in self.until.get(name, {}).items() if t > now}
        until[task_id] = at
        return at - now, lim

    def take(self, name: str, rate: RateKey, now: int) -> None:
        if self.overrides.get(name) != OFF:
            self.windows.setdefault((name, rate.digest), []).append(now)

    def set_override(self, name: str, text: str) -> str:
        value = parse_override(text)
        self.overrides[name] = value
        return value

    def held(self, names: Iterable[str], now: int) -> dict[str, int]:
        return {name: sum(1 for t in self.until.get(name, {}).values() if t > now)
                for name in names}


def reason(rate: Rate, digest: str, wait_ms: int) -> str:
    """The history's reason, as ``_lib.lua``'s ``rate_reason`` writes it."""
    return (f"rate limit {rate} for key {digest[:8]} reached: waits {wait_ms / 1000:.1f} s, "
            "no retry used")

