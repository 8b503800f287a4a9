"""Paced resubmits on the Redis sink (:mod:`jobbers_celery.pacing`): the pace's bounds, and
how a claimed entry's outcome is read from its task's record. No network."""

from __future__ import annotations

import math

import pytest

from jobbers_celery import PaceError, ResubmitPace
from jobbers_celery.pacing import MAX_RATE, MAX_WINDOW, outcome, rule_text


@pytest.mark.parametrize("rate", [0, -1, MAX_RATE + 1, math.inf, math.nan, True, "5"])
def test_rate_out_of_bounds_names_the_field(rate: object) -> None:
    with pytest.raises(PaceError) as caught:
        ResubmitPace(rate)  # type: ignore[arg-type]
    assert caught.value.field == "rate"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(("halt_after", "of_last", "field"), [
    (1, None, "of_last"), (None, 5, "halt_after"),
    (1, 0, "of_last"), (1, MAX_WINDOW + 1, "of_last"),
    (-1, 5, "halt_after"), (6, 5, "halt_after"), (1.5, 5, "halt_after"),
    (1, 5.0, "of_last"),
])
def test_stop_rule_out_of_bounds(halt_after: object, of_last: object, field: str) -> None:
    with pytest.raises(PaceError) as caught:
        ResubmitPace(10, halt_after, of_last)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(("halt_after", "of_last"), [(0, 1), (5, 5), (0, MAX_WINDOW), (None, None)])
def test_bounds_themselves_are_allowed(halt_after: int | None, of_last: int | None) -> None:
    pace = ResubmitPace(MAX_RATE, halt_after, of_last)
    assert pace.rule == rule_text(halt_after, of_last)
    ResubmitPace(0.01)


def test_rule_in_words() -> None:
    assert ResubmitPace(5, 2, 10).rule == "halt when more than 2 of the last 10 failed again"
    assert ResubmitPace(5).rule == "no stop rule"


# the record of the task of entry "t1:2" (dead at attempt 2), read after its claim
@pytest.mark.parametrize(("state", "attempt", "stale", "code"), [
    ("submitted", "2", False, ""),        # published, not started yet
    ("started", "3", False, ""),          # running again
    ("scheduled", "3", False, ""),        # waiting for a retry: not settled
    ("completed", "3", False, "c"),
    ("failed", "3", False, "f"),          # failed again (a newer dead-letter attempt)
    ("dropped", "3", False, "f"),
    ("stalled", "3", False, "f"),
    ("cancelled", "2", False, "f"),       # cancelled before it ran again
    (None, None, False, "o"),             # the record expired
    # a claim whose pass never confirmed its publish (the worker restarted)
    ("failed", "2", True, "x"),           # still dead at its attempt: never published
    ("submitted", "2", True, "p"),        # it was published after all: follow it
    ("completed", "3", True, "c"),
])
def test_outcome_from_the_record(state: str | None, attempt: str | None, stale: bool,
                                 code: str) -> None:
    assert outcome("t1:2", state, attempt, stale)[0] == code


def test_a_task_id_with_colons() -> None:
    assert outcome("a:b:7", "failed", "7", True)[0] == "x"
    assert outcome("a:b:7", "failed", "8", False)[0] == "f"
