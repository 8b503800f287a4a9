from __future__ import annotations

import pytest

from jobbers_celery.core.errors import InvalidTransition
from jobbers_celery.core.states import (
    RESUBMITTABLE,
    TERMINAL,
    TRANSITIONS,
    TaskState,
    allowed_from,
    can_transition,
    check_transition,
)

S = TaskState

# The state machine of docs/reference/lifecycle.md, written out independently of the module
# under test.
CONTRACT = {
    (S.UNSUBMITTED, S.SUBMITTED),
    (S.SUBMITTED, S.STARTED), (S.SUBMITTED, S.CANCELLED), (S.SUBMITTED, S.DROPPED),
    (S.SUBMITTED, S.SCHEDULED),
    (S.STARTED, S.COMPLETED), (S.STARTED, S.FAILED), (S.STARTED, S.CANCELLED),
    (S.STARTED, S.STALLED), (S.STARTED, S.DROPPED), (S.STARTED, S.SCHEDULED),
    (S.STARTED, S.UNSUBMITTED),
    (S.SCHEDULED, S.SUBMITTED), (S.SCHEDULED, S.CANCELLED),
    (S.FAILED, S.SUBMITTED), (S.STALLED, S.SUBMITTED), (S.DROPPED, S.SUBMITTED),
    (S.CANCELLED, S.SUBMITTED),
}


def test_values_are_the_lowercase_contract_names():
    assert [s.value for s in TaskState] == [
        "unsubmitted", "submitted", "started", "scheduled", "completed", "failed",
        "cancelled", "stalled", "dropped"]


@pytest.mark.parametrize("src", list(TaskState))
@pytest.mark.parametrize("dst", list(TaskState))
def test_table_matches_the_design_contract(src, dst):
    assert can_transition(src, dst) == ((src, dst) in CONTRACT)
    assert (src in allowed_from(dst)) == ((src, dst) in CONTRACT)
    if (src, dst) in CONTRACT:
        check_transition(src, dst)
    else:
        with pytest.raises(InvalidTransition, match=f"{src.value} -> {dst.value}"):
            check_transition(src, dst)


def test_every_state_has_an_entry_and_completed_is_final():
    assert set(TRANSITIONS) == set(TaskState)
    assert TRANSITIONS[S.COMPLETED] == frozenset()


def test_terminal_and_resubmittable_sets():
    expected_terminal = {S.COMPLETED, S.FAILED, S.CANCELLED, S.STALLED, S.DROPPED}
    assert set(TERMINAL) == expected_terminal
    assert set(RESUBMITTABLE) == expected_terminal - {S.COMPLETED}
    assert all(can_transition(s, S.SUBMITTED) for s in RESUBMITTABLE)
