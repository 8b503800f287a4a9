"""Rate limits keyed by arguments in the store (``rate_limit_by``; the arithmetic is
``_lib.lua``'s ``rate_wait``, modelled by :func:`jobbers_celery.core.ratelimit.room_at`).

On one slot the start step checks and records the key's window in the same script: no
extra round trip. In the sharded layout the window lives in the global slot: ``rl.lua``
asks for room first (one call), and the step is told the wait; a start that then does not
happen (cancelled, over ``max_concurrent``, refused) gives its entry back. Also here: the
operators' overrides (task name -> rate or ``off``, read by every start: no restart) and
the count of tasks each name has waiting on its limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any
from weakref import WeakKeyDictionary

import redis

from jobbers_celery.core.ratelimit import WAIT_GRACE_MS, RateKey, parse_override
from jobbers_celery.store.fastcall import FastScript
from jobbers_celery.store.scripts import LuaScript, script_source
from jobbers_celery.store.sharded import Sharded

__all__ = ["clear_override", "give_back", "held", "keys_of", "overrides", "prepare",
           "set_override"]


#: Each store's ``rl.lua``, called as the steps are (``FastScript``: ``EVALSHA`` on a
#: per-thread connection, the same outage wait as the steps), made at first use.
_RL: WeakKeyDictionary[Sharded, FastScript] = WeakKeyDictionary()


def _rl(s: Sharded) -> FastScript:
    fast = _RL.get(s)
    if fast is None:
        fast = _RL[s] = FastScript(s.client, LuaScript(s.client, script_source("rl")))
    fast.outage_wait_s = s._transition.outage_wait_s
    return fast


def keys_of(s: Sharded, name: str, digest: str) -> list[str]:
    """The keys ``rate_wait`` reads, in its order (all in the global slot)."""
    k = s.keys
    return [k.rate_window(name, digest), k.rate_limits, k.rate_waiting(name, digest),
            k.rate_held(name)]


def prepare(s: Sharded, spec: dict[str, Any], name: str, rate: RateKey) -> str:
    """Make the start step ``spec`` check ``rate``'s key: on one slot the step's script
    does it (``_run`` adds the keys), in the sharded layout ``rl.lua`` asks first and the
    step is told the wait. Returns the entry taken there ('' if none) for
    :func:`give_back`."""
    rl: dict[str, Any] = {"lim": str(rate.rate), "name": name, "d": rate.digest,
                          "g": WAIT_GRACE_MS}
    spec["rl"] = rl
    if not s.sharded:
        return ""
    wait, lim, member = _rl(s)(keys_of(s, name, rate.digest),
                               ["take", str(spec["id"]), str(rl["lim"]), name,
                                str(WAIT_GRACE_MS)])
    rl["wait"], rl["lim"] = int(wait), str(lim)
    return str(member)


def give_back(s: Sharded, name: str, rate: RateKey, member: str, *, once: bool = False
              ) -> None:
    """The start that took ``member`` in the global slot did not happen: the entry goes.
    ``once``: after a step that failed on an outage, one try and no outage wait (the step
    waited already); if it fails too, the entry stays until it leaves the window."""
    if not once:
        _rl(s)(keys_of(s, name, rate.digest), ["give", member])
        return
    with contextlib.suppress(redis.RedisError, OSError):
        _rl(s).script(keys=keys_of(s, name, rate.digest), args=["give", member])


def set_override(s: Sharded, name: str, text: str) -> str:
    """Override ``name``'s declared rate (``"10/s"``, or ``"off"``: unlimited) from the next
    start on, in every worker; returns the canonical text. Raises ``ValueError``."""
    value = parse_override(text)
    s.client.hset(s.keys.rate_limits, name, value)
    return value


def clear_override(s: Sharded, name: str) -> bool:
    """Back to the declared rate; false if ``name`` had no override."""
    return bool(s.client.hdel(s.keys.rate_limits, name))


def overrides(s: Sharded) -> dict[str, str]:
    """Every override: task name -> rate text or ``off``."""
    return {str(k): str(v) for k, v in s.client.hgetall(s.keys.rate_limits).items()}


def held(s: Sharded, names: Iterable[str]) -> dict[str, int]:
    """How many tasks of each name wait on their rate limit now (told to wait, run_at not
    reached; a task cancelled meanwhile counts until its run_at)."""
    names = list(names)
    now = s.now_ms()
    pipe = s.client.pipeline(transaction=False)
    for name in names:
        pipe.zcount(s.keys.rate_held(name), f"({now}", "+inf")
    return {name: int(n) for name, n in zip(names, pipe.execute(), strict=True)}
