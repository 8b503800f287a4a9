"""The alerts' marks and counters: dedupe and rate limit across processes.

A mark (``SET NX PX``) per rule, kind and thing: the process that sets it sends the alert,
every other one within ``min_interval`` finds it set and sends nothing. A counter per rate
rule, thing and window (``INCR`` + ``PEXPIRE`` in one round trip) counts dead letters.
Both under the global hash tag; the callers hash what they name (bounded keys whatever a
task name holds).
"""

from __future__ import annotations

from jobbers_celery.store.sharded import Sharded

__all__ = ["alert_count", "alert_extend", "alert_mark", "alert_unmark"]


def alert_mark(s: Sharded, digest: str, ttl_ms: int) -> bool:
    """Set the mark ``digest`` for ``ttl_ms`` if it is not set; whether this call set it."""
    return bool(s.client.set(s.keys.alert_mark(digest), "1", nx=True, px=max(1, ttl_ms)))


def alert_extend(s: Sharded, digest: str, ttl_ms: int) -> None:
    """Keep the mark ``digest`` set ``ttl_ms`` more (a condition that lasts)."""
    s.client.pexpire(s.keys.alert_mark(digest), max(1, ttl_ms))


def alert_unmark(s: Sharded, digest: str) -> None:
    """Clear the mark ``digest`` (the alert could not be delivered: the next may be)."""
    s.client.delete(s.keys.alert_mark(digest))


def alert_count(s: Sharded, digest: str, ttl_ms: int) -> int:
    """Add one to the counter ``digest`` (expiring ``ttl_ms`` after its last count: the
    caller names one counter per window); returns the count now."""
    key = s.keys.alert_count(digest)
    pipe = s.client.pipeline(transaction=False)
    pipe.incr(key)
    pipe.pexpire(key, max(1, ttl_ms))
    count, _ = pipe.execute()
    return int(count)
