"""The Lua scripts' text and how they are loaded, and the JSON the scripts speak.

Why apart: every part of the store sends scripts; the shebang rule (``#!lua`` on Redis 7,
dropped on older servers) and the encoding of their arguments live once.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from jobbers_celery.store import keys
from jobbers_celery.store.fastcall import without_shebang

__all__ = ["EXPIRY_SLACK_S", "LuaScript", "as_ids", "as_int", "lua_text", "maybe_json",
           "script_source", "to_json"]

#: Terminal records stay this much longer than the retention period so that the pruner,
#: which needs their name to clean the indexes, always sees them first.
EXPIRY_SLACK_S = 3600

#: Script flags (Redis >= 7) of the scripts that must run when Redis refuses writes:
#: ``prune`` only deletes, so it keeps freeing memory under ``maxmemory``.
_SCRIPT_FLAGS = {"prune": "allow-oom"}

#: What the loader puts in ``_lib.lua`` (a Lua string literal each): the key formats whose
#: one home is :mod:`jobbers_celery.store.keys`.
_FROM_KEYS = {"'$SERIES_HOUR'": keys.SERIES_HOUR, "'$SERIES_DAY'": keys.SERIES_DAY,
              "'$SERIES_CONF'": keys.SERIES_CONF}


def lua_text(name: str) -> str:
    """The text of ``lua/{name}.lua`` as it is (the scripts loaded without the library)."""
    return resources.files("jobbers_celery.store").joinpath("lua").joinpath(
        f"{name}.lua").read_text()


@cache
def script_source(name: str) -> str:
    """``_lib.lua`` then ``{name}.lua``, under a ``#!lua`` shebang: on Redis 7 a script so
    declared is refused as a whole, before it runs, when Redis refuses writes (``OOM`` under
    ``maxmemory``, ``MISCONF``, ``READONLY``, ``NOREPLICAS``), never stopped half-way.
    Redis < 7 cannot compile it: the line is dropped there (see ``without_shebang``)."""
    flags = _SCRIPT_FLAGS.get(name)
    shebang = f"#!lua flags={flags}" if flags else "#!lua"
    return shebang + "\n" + _library() + "\n" + lua_text(name)


def _library() -> str:
    """``_lib.lua`` with the key formats of :data:`_FROM_KEYS` put in."""
    text = lua_text("_lib")
    for mark, value in _FROM_KEYS.items():
        assert mark in text, mark  # renamed in one place, not the other: fail at once
        text = text.replace(mark, f"'{value}'")
    return text


class LuaScript(Script):
    """redis-py's ``Script`` that drops the shebang on a Redis < 7 (see ``without_shebang``)."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        try:
            return super().__call__(keys, args, client)
        except redis.ResponseError as exc:
            if not without_shebang(self, exc):
                raise
            return super().__call__(keys, args, client)


#: One compact encoder for every step's spec (``json.dumps`` with options makes one per call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def to_json(value: Any) -> str:
    return _COMPACT.encode(value)


def maybe_json(raw: str | None) -> Any:
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def as_ids(raw: Any) -> list[Any]:
    """A list from a script's JSON (cjson encodes an empty list as ``{}``)."""
    return list(raw) if isinstance(raw, list) else []


def as_int(raw: str | None, default: int = 0) -> int:
    return int(raw) if raw not in (None, "") else default
