"""``jobbers_celery.core.progress``: a reported progress shown as a bar where it is a part of a
whole (``{x, of|total}`` for any key name, ``done``/``total``, ``percent``, ``fraction``), a
bare number as a counter (never a percentage), anything else as compact ``key: value`` text;
every label bounded and printable, whatever the value."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import ProgressShown, progress_shown
from jobbers_celery.core.progress import LABEL_MAX

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(ANY_TEXT, inner, max_size=5),
    max_leaves=30)


@pytest.mark.parametrize(("value", "fraction", "label"), [
    ({"chunk": 11, "of": 60}, 11 / 60, "chunk 11 of 60"),  # the example project's own shapes
    ({"batch": 51, "of": 400}, 51 / 400, "batch 51 of 400"),
    ({"rows": 3, "total": 8}, 3 / 8, "rows 3 of 8"),
    ({"done": 3, "total": 8}, 3 / 8, "3 of 8 done"),
    ({"total": 8, "done": 3, "file": "a.csv"}, 3 / 8, "3 of 8 done, file: a.csv"),
    ({"chunk": 11, "of": 60, "resumed_from": 3}, 11 / 60, "chunk 11 of 60, resumed_from: 3"),
    ({"page": 7, "of": 5}, 1.0, "page 7 of 5"),  # past the whole: a full bar, the truth said
    ({"percent": 42.5}, 0.425, "42.5%"),
    ({"fraction": 0.25}, 0.25, "25%"),
])
def test_a_part_of_a_whole_is_a_bar(value: Any, fraction: float, label: str) -> None:
    shown = progress_shown(value)
    assert shown is not None
    assert shown.label == label
    assert shown.fraction is not None
    assert math.isclose(shown.fraction, fraction)


@pytest.mark.parametrize(("value", "label"), [
    (1, "1"),  # README's progress=1: a counter, never "100%"
    (0.5, "0.5"),
    (42, "42"),
    (2.0, "2"),
    (True, "true"),
    ("uploading", "uploading"),
    ({"phase": "upload", "file": "a.csv"}, "phase: upload, file: a.csv"),
    ({"chunk": 3, "of": 0}, "chunk: 3, of: 0"),  # no whole: text, not a division by zero
    ({"chunk": "3", "of": 60}, "chunk: 3, of: 60"),  # a part that is no number
    ({"step": {"name": "x", "n": [1, 2]}}, 'step: {"name":"x","n":[1,2]}'),
    ([1, 2], "[1,2]"),
    ({}, "{}"),
])
def test_anything_else_is_text_without_a_bar(value: Any, label: str) -> None:
    assert progress_shown(value) == ProgressShown(None, label)


def test_no_progress_is_none_and_text_is_escaped_and_cut() -> None:
    assert progress_shown(None) is None
    shown = progress_shown({"file": "a\x1b]0;pwned\x07.csv\u202e"})
    assert shown is not None
    assert shown.label == "file: a\\x1b]0;pwned\\x07.csv\\u202e"
    long = progress_shown({"chunk": 1, "of": 2, "note": "x" * 10_000})
    assert long is not None
    assert len(long.label) == LABEL_MAX
    assert long.label.endswith("...")
    assert long.percent == 50


@given(JSONISH)
def test_any_value_has_a_bounded_printable_label(value: Any) -> None:
    shown = progress_shown(value)
    if value is None:
        assert shown is None
        return
    assert shown is not None
    assert len(shown.label) <= LABEL_MAX
    assert shown.label.isprintable()
    if shown.fraction is not None:
        assert 0.0 <= shown.fraction <= 1.0
        assert isinstance(value, dict)
    if isinstance(value, int | float) and not isinstance(value, bool):
        assert shown.fraction is None  # a counter is never read as a percentage


@given(st.text(min_size=1, max_size=20).filter(lambda k: k not in ("of", "total", "done")),
       st.integers(min_value=-10**30, max_value=10**30) | st.floats(allow_nan=False),
       st.sampled_from(["of", "total"]),
       st.integers(min_value=1, max_value=10**30) | st.floats(min_value=1e-9, max_value=1e30))
def test_any_key_of_a_whole_draws_a_bar(key: str, part: Any, name: str, whole: Any) -> None:
    shown = progress_shown({key: part, name: whole})
    assert shown is not None
    if isinstance(part, float) and not math.isfinite(part):
        assert shown.fraction is None
        return
    assert shown.fraction is not None
    assert 0.0 <= shown.fraction <= 1.0
    assert shown.label.endswith(f" of {shown.label.rsplit(' of ', 1)[1]}")


def test_an_integer_past_what_a_float_holds_is_shown_as_text() -> None:
    """``math.isfinite(10**400)`` raises OverflowError: a task reporting such a number must
    not break the pages and the CLI that draw its progress."""
    for value in ({"percent": 10**400}, {"chunk": 1, "of": 10**400},
                  {"fraction": 10**400}, {"done": 10**400, "of": 5}):
        shown = progress_shown(value)
        assert shown is not None
        assert shown.fraction is None
        assert "~2^" in shown.label
