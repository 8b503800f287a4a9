"""Which store errors are an outage, and the ``#!lua`` shebang's fallback on Redis < 7."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

from jobbers_celery.store import UNREACHABLE, WritesRefused, is_outage
from jobbers_celery.store.fastcall import as_refusal, without_shebang
from jobbers_celery.store.scripts import script_source as _script_source

MISCONF = ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to "
           "persist to disk.")


@pytest.mark.parametrize("exc", [
    RedisConnectionError("gone"), OutOfMemoryError("command not allowed when used memory > "
                                                   "'maxmemory'."),
    ReadOnlyError("You can't write against a read only replica."),
    WritesRefused(MISCONF), MasterDownError("Link with MASTER is down and "
                                            "replica-serve-stale-data is set to 'no'."),
])
def test_outages_are_unreachable(exc: Exception) -> None:
    assert isinstance(exc, UNREACHABLE)
    assert is_outage(exc)


@pytest.mark.parametrize("text", [MISCONF, "NOREPLICAS Not enough good replicas to write.",
                                  ("BUSY Redis is busy running a script. You can only "
                                   "call SCRIPT KILL or SHUTDOWN NOSAVE.")])
def test_plain_refusals_become_writes_refused(text: str) -> None:
    refused = as_refusal(ResponseError(text))
    assert isinstance(refused, WritesRefused)
    assert str(refused) == text
    assert is_outage(ResponseError(text))


@pytest.mark.parametrize("text", ["WRONGTYPE Operation against a key holding the wrong kind",
                                  "ERR user_script:3: attempt to compare nil with number"])
def test_other_errors_are_not_outages(text: str) -> None:
    assert as_refusal(ResponseError(text)) is None
    assert not is_outage(ResponseError(text))
    assert not is_outage(NoScriptError("No matching script."))
    assert as_refusal(ResponseError("BUSYGROUP Consumer Group name already exists")) is None


def test_every_step_script_starts_with_its_shebang() -> None:
    assert _script_source("transition").startswith("#!lua\n-- _lib.lua")
    assert _script_source("prune").startswith("#!lua flags=allow-oom\n")


def test_the_shebang_is_dropped_when_the_server_cannot_compile_it() -> None:
    text = _script_source("heartbeat")
    script: Any = SimpleNamespace(script=text, sha="old")
    # what Redis 6 answers to SCRIPT LOAD of a script whose first line is #!lua
    error = ResponseError("Error compiling script (new function): user_script:1: "
                          "unexpected symbol near '#'")
    assert without_shebang(script, error)
    assert script.script == text.split("\n", 1)[1]
    assert script.script.startswith("-- _lib.lua")
    assert script.sha == hashlib.sha1(script.script.encode()).hexdigest()
    assert not without_shebang(script, error)  # no shebang left: the error is raised
    assert not without_shebang(SimpleNamespace(script=text, sha="x"),
                               ResponseError("ERR unknown command"))
