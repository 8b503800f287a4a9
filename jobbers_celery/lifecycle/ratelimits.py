"""The operators' view of rate limits keyed by arguments: every limit this app's tasks
declare (``rate_limit_by``) or an operator set, with how many tasks wait on each now; and
the overrides, set and cleared at run time (read by every worker's next start: no restart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobbers_celery.core.ratelimit import (
    MAX_RATE_NAME,
    MAX_RATE_TEXT,
    RateLimit,
    RateLimitInfo,
    describe_key,
)

if TYPE_CHECKING:
    from jobbers_celery.store.parts import RateLimitStore

__all__ = ["declared", "read", "refuse_undeclared", "set_override"]


def declared(app: Any) -> dict[str, RateLimit]:
    """The task names of ``app`` declaring ``rate_limit_by``."""
    out: dict[str, RateLimit] = {}
    for name, task in list(app.tasks.items()):
        limit = getattr(getattr(task, "jobbers_options", None), "rate_limit_by", None)
        if isinstance(limit, RateLimit):
            out[name] = limit
    return out


def refuse_undeclared(app: Any, name: str, rate: str | None) -> None:
    """Raise ``ValueError`` when an override is set (``rate`` not ``None``) for ``name`` and
    no task of ``app`` declares ``rate_limit_by`` under it: only such tasks read overrides,
    so it would never apply (clearing one is always allowed)."""
    if rate is not None and name not in declared(app):
        raise ValueError(f"{name[:MAX_RATE_NAME]!r} is not a task with rate_limit_by here: "
                         "an override of it would never apply")


def read(app: Any, store: RateLimitStore) -> list[RateLimitInfo]:
    """Every limit declared here or overridden in the store, by name."""
    limits = declared(app)
    overrides = store.rate_overrides()
    names = sorted(set(limits) | set(overrides))
    held = store.rate_held(names)
    return [RateLimitInfo(name, str(limits[name].limit) if name in limits else None,
                          overrides.get(name), describe_key(limits.get(name)),
                          held.get(name, 0)) for name in names]


def set_override(store: RateLimitStore, name: str, rate: str | None) -> str | None:
    """Set ``name``'s override (``rate``: ``"10/s"`` or ``"off"``) or clear it (``None``);
    returns what is in force now for it, as stored. Raises ``ValueError``."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_RATE_NAME:
        raise ValueError(f"a task name is 1 to {MAX_RATE_NAME} characters")
    if rate is None:
        store.clear_rate_override(name)
        return None
    if not isinstance(rate, str) or len(rate) > MAX_RATE_TEXT:
        raise ValueError(f"a rate is text of at most {MAX_RATE_TEXT} characters, like '10/s'")
    return store.set_rate_override(name, rate)
