"""Paced resubmits on the Redis sink (:mod:`jobbers_celery.resubmit.pace`): the pace's bounds, and
how a claimed entry's outcome is read from its task's record. No network."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery import PaceError, ResubmitPace
from jobbers_celery.resubmit.pace import (
    MAX_RATE,
    MAX_RUN_ENTRIES,
    MAX_RUN_SECONDS,
    MAX_WINDOW,
    MIN_RATE,
    RATE_MESSAGE,
    RunOutcome,
    allowance,
    halt_reason,
    rule_text,
    run_outcome,
    stop_rule,
)


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
    ResubmitPace(MIN_RATE)


def test_rule_in_words() -> None:
    assert ResubmitPace(5, 2, 10).rule == "halt when more than 2 of the last 10 failed again"
    assert ResubmitPace(5).rule == "no stop rule"


# the record of the task of entry "t1:2" (dead at attempt 2), read after its claim
@pytest.mark.parametrize(("state", "attempt", "stale", "code"), [
    ("submitted", "2", False, None),      # published, not started yet
    ("started", "3", False, None),        # running again
    ("scheduled", "3", False, None),      # waiting for a retry: not settled
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
                                 code: str | None) -> None:
    got = run_outcome(state, attempt, 2 if stale else None)[0]
    assert got == (RunOutcome(code) if code is not None else None)


def test_the_outcome_codes_are_the_letters_the_run_keeps() -> None:
    # run_settle.lua counts these letters: the enum's values must not change
    assert {o.name: o.value for o in RunOutcome} == {
        "PUBLISHED": "p", "SKIPPED": "s", "PUBLISH_FAILED": "x", "COMPLETED": "c",
        "FAILED_AGAIN": "f", "ENDED_OTHERWISE": "o"}


@pytest.mark.parametrize(("last", "halt_after", "of_last", "why"), [
    ("ff", None, None, ""),                     # no stop rule
    ("fcf", 2, 3, ""),                          # 2 of 3: not more than 2
    ("fff", 2, 3, halt_reason(3, 3, 2, 3)),
    ("ffcff", 1, 2, halt_reason(2, 2, 1, 2)),   # the newest two only
    ("sfpfx", 1, 3, halt_reason(2, 2, 1, 3)),   # unsettled codes are not in the window
    ("ooc", 0, 3, ""),                          # ended otherwise is not failed again
])
def test_the_stop_rule(last: str, halt_after: int | None, of_last: int | None,
                       why: str) -> None:
    assert stop_rule(list(last), halt_after, of_last) == why


def test_the_halt_reason_reads_as_the_runs_say_it() -> None:
    assert halt_reason(3, 3, 2, 4) == ("3 of the last 3 resubmitted tasks failed again "
                                       "(the rule: halt when more than 2 of the last 4)")


# ---------------------------------------------------------------------- a run always ends
@pytest.mark.parametrize("rate", [1e-300, 5e-324, MIN_RATE / 2, math.nextafter(MIN_RATE, 0)])
def test_a_pace_too_slow_to_end_is_refused(rate: float) -> None:
    with pytest.raises(PaceError) as caught:
        ResubmitPace(rate)
    assert caught.value.field == "rate"
    assert f"at least {MIN_RATE:g}" in caught.value.message


@settings(max_examples=300)
@given(rate=st.one_of(st.floats(), st.floats(min_value=0, max_value=2 * MIN_RATE),
                      st.integers(-10, 1000)),
       halt_after=st.one_of(st.none(), st.integers(-2, MAX_WINDOW + 2)),
       of_last=st.one_of(st.none(), st.integers(-2, MAX_WINDOW + 2)))
def test_every_accepted_pace_publishes_the_largest_run_within_the_longest_run(
        rate: float, halt_after: int | None, of_last: int | None) -> None:
    refused: PaceError | None = None
    try:
        pace = ResubmitPace(rate, halt_after, of_last)
    except PaceError as exc:
        refused = exc
    if refused is not None:  # every refusal names its field and says why
        assert refused.field in ("rate", "halt_after", "of_last")
        assert str(refused) == f"{refused.field}: {refused.message}"
        fast_enough = isinstance(rate, int | float) and not isinstance(rate, bool) \
            and math.isfinite(rate) and MIN_RATE <= rate <= MAX_RATE
        assert (refused.field == "rate") == (not fast_enough)
        if refused.field == "rate":
            assert refused.message == RATE_MESSAGE
        return
    # the pace both sinks apply (run_claim.lua and the Django run's step: one at once, then
    # rate per second) lets the last of the largest run go by the longest run's end
    assert allowance(pace.rate, MAX_RUN_SECONDS) >= MAX_RUN_ENTRIES
    assert (MAX_RUN_ENTRIES - 1) / pace.rate <= MAX_RUN_SECONDS


def test_the_bounds_are_stated() -> None:
    assert (ResubmitPace.min_rate, ResubmitPace.max_run_entries,
            ResubmitPace.max_run_seconds) == (MIN_RATE, MAX_RUN_ENTRIES, MAX_RUN_SECONDS)
    assert MAX_RUN_ENTRIES / MIN_RATE <= MAX_RUN_SECONDS
    assert allowance(MIN_RATE, 0) == 1
    assert allowance(2, 1.5) == 4


def test_a_run_of_more_entries_than_the_largest_is_refused_before_the_store() -> None:
    from jobbers_celery.core.options import ResubmitVersion
    from jobbers_celery.core.records import DeadLetter
    from jobbers_celery.resubmit.pacer import start

    entry = DeadLetter(task_id="t", name="n", version=None, queue="q", reason="failed",
                       args=[], kwargs={}, exception_type="E", exception_message="",
                       traceback="", attempt=1, retry_attempt=0, worker=None,
                       failed_at=datetime.now(UTC), checkpoint=None, options={})
    many = [dataclasses.replace(entry, task_id=f"t{n}") for n in range(MAX_RUN_ENTRIES + 1)]
    with pytest.raises(PaceError) as caught:
        start(None, many, ResubmitPace(5), reset_retry_count=True,  # type: ignore[arg-type]
              version=ResubmitVersion.ENTRY, selection=None, source="code", username="")
    assert caught.value.field == "entries"


def test_a_task_id_with_colons() -> None:
    from jobbers_celery.resubmit.pacer import _split

    assert _split("a:b:7") == ("a:b", 7)
