"""The worker's intake limits (issue 24): depth and size of what a message holds, and the
lengths of the fields jobbers makes keys of, checked without recursion."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery.core import intake
from jobbers_celery.core.intake import (
    MAX_DEPTH,
    MAX_HEADER_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_VALUES,
    identity_over_limits,
    message_over_limits,
    nesting_over_limits,
)


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


def _depth(value: Any) -> int:
    """The reference: levels of containers (recursive; fine for what hypothesis makes)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _count(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_count(v) for v in value.values())
    if isinstance(value, list | tuple):
        return len(value) + sum(_count(v) for v in value)
    return 0


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=4),
                    max_leaves=40)


@settings(max_examples=200)
@given(JSON, st.integers(0, MAX_DEPTH + 3))
def test_depth_is_judged_as_the_reference_does(value: Any, wrap: int) -> None:
    value = _nested(wrap, value)
    too_deep = _depth(value) > MAX_DEPTH
    assert (nesting_over_limits([value]) is not None) == too_deep
    assert (message_over_limits("id", "name", {"args": [value], "kwargs": {}})
            is not None) == (_depth([value]) > MAX_DEPTH)


def test_far_too_deep_is_judged_without_recursion() -> None:
    for depth in (MAX_DEPTH + 1, 500, 100_000):
        why = nesting_over_limits([_nested(depth)])
        assert why == f"its arguments or headers are nested deeper than {MAX_DEPTH} levels"
    assert nesting_over_limits([_nested(MAX_DEPTH)]) is None


def test_too_many_values(monkeypatch: Any) -> None:
    monkeypatch.setattr(intake, "MAX_VALUES", 1000)
    assert nesting_over_limits([[0] * 999]) is None
    assert nesting_over_limits([list(range(1001))]) is not None
    assert nesting_over_limits([[[0] * 500, {"a": [0] * 499}]]) is not None
    assert _count([[0] * 500, {"a": [0] * 499}]) > 1000
    assert MAX_VALUES == 1_000_000


def test_lengths_of_what_becomes_a_key() -> None:
    assert identity_over_limits("x" * MAX_ID_CHARS, "n" * MAX_NAME_CHARS) is None
    assert identity_over_limits("x" * (MAX_ID_CHARS + 1), "n") == (
        f"its task id has {MAX_ID_CHARS + 1} characters, over the limit of {MAX_ID_CHARS}")
    assert identity_over_limits("x", "n" * (MAX_NAME_CHARS + 1)) is not None
    # no character is refused but a lone surrogate: no UTF-8 form, so no key holds it
    for odd in ("", "|", "a\nb", "\x1b]0;x\x07", "é😀", "../..", "%2F", "<script>"):
        assert message_over_limits(odd, odd, {"id": odd, "args": [odd], "kwargs": {}}) is None
    assert identity_over_limits("a\ud800b", "n") == (
        "its task id holds a lone surrogate (no UTF-8 form)")
    assert identity_over_limits("id", "proj.\udc80") == (
        "its task name holds a lone surrogate (no UTF-8 form)")
    assert identity_over_limits("😀\U0010ffff", "\u2028") is None  # paired and odd: UTF-8
    headers = {"jobbers_epoch": "e" * (MAX_HEADER_CHARS + 1), "args": [], "kwargs": {}}
    assert message_over_limits("id", "n", headers) == (
        f"its jobbers_epoch header has {MAX_HEADER_CHARS + 1} characters, over the limit of "
        f"{MAX_HEADER_CHARS}")
    # another header's long string is the publisher's business; a body kept as bytes is not
    # walked (the pool passes it on as it is)
    assert message_over_limits("id", "n", {"custom": "c" * 100_000}, b"[" * 10_000) is None
    assert message_over_limits("id", "n", {}, ([_nested(MAX_DEPTH + 1)], {}, {})) is not None
