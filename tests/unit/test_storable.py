"""The storable form of a dead letter: whatever a publisher put in it, the result is JSON
without NaN, UTF-8 without NUL, within the columns' limits and the nesting bound, altered
visibly and marked; an entry every sink stores as it is comes back unchanged."""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery.core import storable as storable_module
from jobbers_celery.core.records import ALTERED, UNPUBLISHABLE, DeadLetter
from jobbers_celery.core.storable import (
    ID_LIMIT,
    MAX_DEPTH,
    TOO_DEEP,
    TOO_MANY,
    parked_json,
    storable_form,
    storable_text,
)


def _entry(**over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": "st-1", "name": "proj.charge", "version": 2, "queue": "billing",
        "reason": "failed", "args": ["card", 42, 1.5, None, True], "kwargs": {"a": {"b": [1]}},
        "exception_type": "builtins.ValueError", "exception_message": "declined",
        "traceback": "Traceback ...", "attempt": 1, "retry_attempt": 0, "worker": "w1@host",
        "failed_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "checkpoint": {"step": 3},
        "options": {"queue": "billing", "headers": {"x": 1}},
    }
    values.update(over)
    return DeadLetter(**values)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _depth(value: Any) -> int:
    """Nesting levels, iteratively (the value may be deeper than the recursion limit)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def _strings(value: Any) -> list[str]:
    """Every string of ``value``, keys included, iteratively."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def _assert_storable(entry: DeadLetter) -> None:
    """What PostgreSQL (JSONB, text and varchar(255) columns, 32-bit integers) and the Redis
    sink accept."""
    text = json.dumps(entry.to_json(), allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogate
    assert not any("\x00" in t for t in _strings(entry.to_json()))
    for name in ("task_id", "name", "queue", "worker", "exception_type"):
        value = getattr(entry, name)
        assert value is None or len(value) <= ID_LIMIT
    for name in ("args", "kwargs", "checkpoint", "options"):
        assert _depth(getattr(entry, name)) <= MAX_DEPTH
    for value in (entry.attempt, entry.retry_attempt):
        assert 0 <= value < 2**31
    assert entry.version is None or -(2**31) <= entry.version < 2**31


def test_a_normal_entry_is_returned_as_it_is() -> None:
    entry = _entry()
    assert storable_form(entry) is entry
    assert ALTERED not in entry.options


def test_each_poison_value_is_stored_visibly_altered() -> None:
    entry = _entry(
        task_id="t" * 300, name="n" * 256, queue="q\x00", worker="w" * 1000,
        exception_type="e" * 400, args=[float("nan"), float("inf"), -float("inf")],
        kwargs={"k\x00": "a\x00b", "s": "x\ud800y"}, exception_message="m\x00",
        traceback="\udfff", checkpoint=_nested(950), retry_attempt=2**40, version=2**40)
    shown = storable_form(entry)
    _assert_storable(shown)
    assert shown.args == ["NaN", "Infinity", "-Infinity"]
    assert shown.kwargs == {"k\\u0000": "a\\u0000b", "s": "x\\ud800y"}
    assert shown.queue == "q\\u0000"
    assert shown.exception_message == "m\\u0000"
    assert shown.traceback == "\\udfff"
    assert shown.task_id.startswith("t" * 200)
    assert "…" in shown.task_id
    assert len(shown.task_id) == ID_LIMIT
    assert shown.retry_attempt == 2**31 - 1
    assert shown.version is None
    # the whole values are kept where they fit, and what was altered is said
    altered = shown.options[ALTERED]
    assert altered["full"]["task_id"] == "t" * 300
    assert altered["full"]["worker"] == "w" * 1000
    assert altered["full"]["version"] == str(2**40)
    assert set(altered["fields"]) >= {"task_id", "name", "queue", "worker", "args", "kwargs",
                                      "checkpoint", "version", "retry_attempt"}
    assert shown.altered == tuple(altered["fields"])
    # publishing altered arguments would run the task with values it was never given
    assert shown.unpublishable
    assert "args" in shown.unpublishable
    # past the bound, a placeholder
    assert TOO_DEEP in json.dumps(shown.checkpoint)
    assert storable_form(shown) is shown  # idempotent


def test_two_long_ids_sharing_their_start_stay_apart() -> None:
    one, two = storable_form(_entry(task_id="x" * 300 + "1")), storable_form(_entry(task_id="x" * 300 + "2"))
    assert one.task_id != two.task_id


def test_only_what_a_resubmit_does_not_publish_altered_leaves_it_publishable() -> None:
    shown = storable_form(_entry(exception_message="boom\x00", worker="w" * 300))
    assert shown.altered == ("exception_message", "worker")
    assert shown.unpublishable is None
    assert shown.args == _entry().args


def test_an_entry_already_unpublishable_keeps_its_reason() -> None:
    entry = _entry(options={UNPUBLISHABLE: "no arguments were recorded"}, args=[math.nan])
    assert storable_form(entry).unpublishable == "no arguments were recorded"


def test_too_many_values_become_a_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storable_module, "MAX_VALUES", 1_000)
    shown = storable_form(_entry(args=[list(range(600)), list(range(600))]))
    assert TOO_MANY in shown.args
    assert shown.args.count(TOO_MANY) == 1


def test_keys_escaped_alike_are_both_kept() -> None:
    shown = storable_form(_entry(kwargs={"a\x00": 1, "a\\u0000": 2}))
    assert sorted(shown.kwargs.values()) == [1, 2]


def test_a_hostile_shape_costs_linear_time_and_no_recursion() -> None:
    deep = _nested(sys.getrecursionlimit() * 50)  # far past what any recursion survives
    started = time.perf_counter()
    shown = storable_form(_entry(args=[deep]))
    assert time.perf_counter() - started < 2.0
    _assert_storable(shown)
    parked = json.loads(parked_json(_entry(args=[deep])))
    assert TOO_DEEP in json.dumps(parked["args"])


def test_parked_json_keeps_what_json_reads_back() -> None:
    entry = _entry(args=[math.inf, "a\x00", "\ud800"])
    back = DeadLetter.from_json(json.loads(parked_json(entry)))
    assert back.args[0] == math.inf
    assert back.args[1:] == ["a\x00", "\ud800"]


# ---------------------------------------------------------------------- properties
_TEXT = st.text(alphabet=st.characters(codec=None), max_size=40) | st.sampled_from(
    ["\x00", "\ud800", "a\udfffb", "\x00\ud83d"])
_LEAVES = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | _TEXT)
_JSONISH = st.recursive(_LEAVES, lambda children: st.lists(children, max_size=4)
                        | st.dictionaries(_TEXT, children, max_size=4), max_leaves=30)
_IDS = st.text(alphabet=st.characters(codec=None), max_size=300)


@settings(max_examples=150)
@given(args=st.lists(_JSONISH, max_size=4), kwargs=st.dictionaries(_TEXT, _JSONISH, max_size=3),
       checkpoint=_JSONISH, task_id=_IDS, name=_IDS, queue=_IDS | st.none(),
       message=_TEXT | st.none(), deep=st.integers(min_value=0, max_value=300),
       retries=st.integers(min_value=0, max_value=2**40))
def test_property_any_value_becomes_storable(args: list[Any], kwargs: dict[str, Any],
                                             checkpoint: Any, task_id: str, name: str,
                                             queue: str | None, message: str | None,
                                             deep: int, retries: int) -> None:
    entry = _entry(args=[*args, _nested(deep)], kwargs=kwargs, checkpoint=checkpoint,
                   task_id=task_id, name=name, queue=queue, exception_message=message,
                   retry_attempt=retries)
    shown = storable_form(entry)
    _assert_storable(shown)
    assert storable_form(shown) is shown
    if shown is not entry:
        assert shown.altered  # never altered without saying so
    json.loads(parked_json(entry))  # always parkable


_STORABLE_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                         max_size=40)
_STORABLE = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False) | _STORABLE_TEXT,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(_STORABLE_TEXT, children, max_size=4), max_leaves=30)


@settings(max_examples=150)
@given(args=st.lists(_STORABLE, max_size=4), kwargs=st.dictionaries(_STORABLE_TEXT, _STORABLE,
                                                                      max_size=3),
       task_id=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                       max_size=ID_LIMIT))
def test_property_storable_input_is_unchanged(args: list[Any], kwargs: dict[str, Any],
                                              task_id: str) -> None:
    entry = _entry(args=args, kwargs=kwargs, task_id=task_id)
    assert storable_form(entry) is entry


@given(st.text(alphabet=st.characters(codec=None), max_size=60))
def test_property_storable_text_has_no_nul_or_surrogate(text: str) -> None:
    shown = storable_text(text)
    shown.encode("utf-8")
    assert "\x00" not in shown
    assert (shown == text) == (shown is text)


def test_a_cut_id_still_names_the_record_it_came_from() -> None:
    """``celery jobbers dlq list`` showed the task of a 1,000-character id as gone: it looked
    the record up by the cut id."""
    long_id = "L" * 1000
    stored = storable_form(_entry(task_id=long_id))
    assert len(stored.task_id) <= ID_LIMIT
    assert stored.task_id != long_id
    assert stored.recorded_task_id == long_id
    assert _entry().recorded_task_id == "st-1"
