"""Retry delay strategies. Pure: the formulas of docs/howto/retries.md, capped by ``max_retry_delay``.

``n`` is the number of the retry being scheduled, 1 for the first retry, so ``linear`` waits
d, 2d, 3d ... and ``exponential`` waits 2d, 4d, 8d ... (d·2^n exactly as documented).
"""

from __future__ import annotations

import random
from enum import StrEnum

__all__ = ["BackoffStrategy", "compute_delay"]


class BackoffStrategy(StrEnum):
    CONSTANT = "constant"
    LINEAR = "linear"
    EXPONENTIAL = "exponential"
    EXPONENTIAL_JITTER = "exponential_jitter"


# 2**n overflows float for large n; beyond this exponent every realistic cap is reached anyway.
_MAX_EXPONENT = 64


def compute_delay(
    strategy: BackoffStrategy,
    base: float,
    n: int,
    cap: float,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``n`` (1-based), never more than ``cap``."""
    if n < 1:
        raise ValueError(f"retry number must be >= 1, got {n}")
    if base < 0 or cap < 0:
        raise ValueError("base delay and cap must be >= 0")
    if strategy is BackoffStrategy.CONSTANT:
        delay = base
    elif strategy is BackoffStrategy.LINEAR:
        delay = base * n
    else:
        delay = base * 2.0 ** min(n, _MAX_EXPONENT)
        if strategy is BackoffStrategy.EXPONENTIAL_JITTER:
            # Jitter over the capped range: uniform(0, min(cap, d*2^n)), so a low cap does not
            # collapse every retry onto the same instant.
            delay = (rng or random).uniform(0.0, min(cap, delay))
    return min(delay, cap)
