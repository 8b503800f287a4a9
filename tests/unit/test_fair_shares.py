"""Fair shares without a network: the key's digest (canonical, bounded), the option, the
key of a call, and the rules on the in-memory kit (tests/integration/fair_cases.py, which
tests/integration/test_fair_store.py runs on Redis)."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.fairshare import (
    DIGEST_LEN,
    MAX_KEY_BYTES,
    ConcurrencyKey,
    ConcurrencyKeyError,
    FairKey,
    key_digest,
    validate_concurrency_key,
)
from jobbers_celery.core.options import validate_options
from jobbers_celery.testing import InMemoryStore
from tests.integration import fair_cases

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@given(JSON)
def test_a_digest_is_64_hex_digits_and_the_same_for_an_equal_value(value: Any) -> None:
    digest = key_digest(value)
    assert len(digest) == DIGEST_LEN
    assert set(digest) <= set(string.hexdigits.lower())
    assert key_digest(json.loads(json.dumps(value))) == digest  # a copy through JSON


@given(st.dictionaries(st.text(max_size=8), st.integers(), min_size=2, max_size=6))
def test_a_mapping_digest_does_not_depend_on_its_order(value: dict[str, int]) -> None:
    assert key_digest(dict(reversed(list(value.items())))) == key_digest(value)


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_different_values_have_different_digests(a: str, b: str) -> None:
    assert (key_digest(a) == key_digest(b)) == (a == b)


def test_a_key_over_the_bound_or_not_json_is_refused_unhashed() -> None:
    with pytest.raises(ConcurrencyKeyError, match="over 1024 bytes"):
        key_digest("x" * MAX_KEY_BYTES)
    with pytest.raises(ConcurrencyKeyError, match="not JSON"):
        key_digest(float("nan"))
    with pytest.raises(ConcurrencyKeyError, match="not JSON"):
        key_digest(object())


def _run(account: str, amount: int, *, note: str = "") -> None:
    """A task's function: the key is found by name even when passed by position."""


@pytest.mark.parametrize(("key", "args", "kwargs", "value"), [
    ("account", ("acme", 3), {}, "acme"),
    ("account", (), {"account": "acme", "amount": 3}, "acme"),
    (0, ("acme", 3), {}, "acme"),
    (0, (), {"account": "acme"}, "acme"),
    (("account", "note"), ("acme", 3), {}, ["acme", ""]),
    (lambda a, k: [a[0], k.get("note")], ("acme", 3), {"note": "x"}, ["acme", "x"]),
])
def test_the_key_of_a_call(key: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                           value: Any) -> None:
    spec = ConcurrencyKey(key)
    assert spec.value(_run, args, kwargs) == value
    assert spec.digest(_run, args, kwargs) == key_digest(value)


@pytest.mark.parametrize(("key", "args", "match"), [
    ("account", (), "'account' was not passed"),
    (2, ("acme", 3), "argument #2 was not passed"),
    (lambda a, k: 1 / 0, (), "raised ZeroDivisionError"),
])
def test_a_call_without_its_key_is_refused(key: Any, args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ConcurrencyKeyError, match=match):
        ConcurrencyKey(key).value(_run, args, {})


def test_the_option_needs_max_concurrent_and_a_key_it_can_read() -> None:
    assert validate_options({"max_concurrent": 2, "concurrency_key": "account"}
                            ).concurrency_key == ConcurrencyKey("account")
    assert validate_options({}).concurrency_key is None
    with pytest.raises(InvalidTaskOption, match="needs max_concurrent"):
        validate_concurrency_key("account", None)
    assert validate_concurrency_key(("account", 1), 2) == ConcurrencyKey(("account", 1))
    for bad in ("not a name", -1, True, 2.5, (), ("account", -1)):
        with pytest.raises(InvalidTaskOption, match="concurrency_key must be"):
            validate_concurrency_key(bad, 2)


def test_the_parked_reason_names_the_key_by_its_digest_only() -> None:
    key = FairKey(key_digest("secret-tenant"), 3)
    assert key.parked_reason == f"key {key.digest[:8]} at max_concurrent=3: parked, no retry used"
    assert "secret" not in key.parked_reason


@pytest.mark.parametrize("case", [
    fair_cases.case_publish_parks_past_the_room_and_releases_in_order,
    fair_cases.case_start_parks_an_unthrottled_publish_past_the_cap,
    fair_cases.case_a_cancelled_parked_task_is_skipped,
    fair_cases.case_a_refused_publish_holds_no_place_of_its_key,
    fair_cases.case_a_bulk_publish_parks_its_members_past_the_room,
    fair_cases.case_a_parked_task_come_due_is_published_once_and_no_longer_parked,
    fair_cases.case_a_task_parked_again_keeps_its_place,
    fair_cases.case_a_task_first_parked_at_its_start_is_placed_by_its_submission,
])
def test_the_in_memory_kit_keeps_the_rules(case: Any) -> None:
    case(InMemoryStore())


def test_the_kits_on_their_way_entries_expire_on_its_clock() -> None:
    """As in Redis, a publish let through (or a parked task released) whose task has not
    started stops holding its key's room ``ON_THE_WAY_MS`` after it was sent (its message
    lost); the kit's entries never expired (found by review)."""
    from jobbers_celery.store.fairshare import ON_THE_WAY_MS

    A, S, publish, release = fair_cases.A, fair_cases.S, fair_cases.publish, fair_cases.release
    store = InMemoryStore()
    assert [publish(store, f"e{i}", A) for i in range(4)] == [
        S.SUBMITTED, S.SUBMITTED, S.SCHEDULED, S.SCHEDULED]
    store.advance(ON_THE_WAY_MS / 1000 - 1)
    assert release(store) == []  # e0 and e1 still on their way
    assert [(h.parked, h.released) for h in store.fair_held()] == [(2, 2)]
    store.advance(1)
    assert [(h.parked, h.released) for h in store.fair_held()] == [(2, 0)]
    assert release(store) == ["e2", "e3"]  # their room is back, first in first out
    store.advance(ON_THE_WAY_MS / 1000)
    assert publish(store, "e4", A) is S.SUBMITTED  # the released ones expired too
    assert fair_cases.start(store, "e0", A) is S.STARTED  # a late message still runs
