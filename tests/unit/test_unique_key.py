"""The unique key's digest (core/unique.py): deterministic, bounded, never the raw values,
and different selections make different keys; the spec's validation and its field."""

from __future__ import annotations

import datetime as dt
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.unique import (
    KEY_INPUT_MAX,
    Unique,
    UniqueKeyError,
    Until,
    field_value,
    key_digest,
    parse_field,
    validate_unique,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
args_st = st.lists(json_values, max_size=4)
kwargs_st = st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=8), json_values,
                            max_size=4)
HEX = set("0123456789abcdef")


@given(args=args_st, kwargs=kwargs_st)
def test_the_digest_is_64_hex_digits_and_the_same_for_the_same_call(args, kwargs) -> None:
    spec = Unique()
    one = key_digest("t.a", spec, args, kwargs)
    assert len(one) == 64
    assert set(one) <= HEX
    assert key_digest("t.a", spec, list(args), dict(reversed(list(kwargs.items())))) == one
    assert key_digest("t.b", spec, args, kwargs) != one  # the task name is part of it


@given(args=st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=4))
def test_different_selections_make_different_keys(args) -> None:
    every = key_digest("t", Unique(), args, {})
    first = key_digest("t", Unique(on=(0,)), args, {})
    second = key_digest("t", Unique(on=(1,)), args, {})
    by_key = key_digest("t", Unique(key=lambda a, k: str(a[0])), args, {})
    assert len({every, first, second, by_key}) == 4
    # the selected values alone decide: what is not selected does not count
    assert key_digest("t", Unique(on=(0,)), [args[0], "other"], {}) == first


@given(secret=st.text(min_size=8, max_size=40))
def test_the_field_never_holds_the_values(secret) -> None:
    spec = Unique(on=("token",))
    field = field_value(spec, key_digest("t", spec, [], {"token": secret}))
    assert secret not in field
    parsed = parse_field(field)
    assert parsed is not None
    assert parsed.until is Until.END


def test_no_separator_in_a_value_can_forge_another_selection() -> None:
    spec = Unique(on=(0, 1))
    assert key_digest("t", spec, ["a:b", "c"], {}) != key_digest("t", spec, ["a", "b:c"], {})
    assert key_digest("t", Unique(), ["a", "b"], {}) != key_digest("t", Unique(), ["a,b"], {})


def test_the_input_is_bounded_before_hashing() -> None:
    with pytest.raises(UniqueKeyError, match="over"):
        key_digest("t", Unique(), ["x" * (KEY_INPUT_MAX + 1)], {})
    with pytest.raises(UniqueKeyError, match="over"):
        key_digest("t", Unique(key=lambda a, k: "y" * (KEY_INPUT_MAX + 1)), [], {})


def test_values_json_lacks_are_canonical_and_others_refused() -> None:
    when = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    assert key_digest("t", Unique(), [when], {}) == key_digest("t", Unique(), [when], {})
    with pytest.raises(UniqueKeyError, match="not JSON"):
        key_digest("t", Unique(), [object()], {})
    with pytest.raises(UniqueKeyError, match="'account' was not passed"):
        key_digest("t", Unique(on=("account",)), [], {})
    with pytest.raises(UniqueKeyError, match="argument #3 was not passed"):
        key_digest("t", Unique(on=(3,)), [1], {})
    with pytest.raises(UniqueKeyError, match=r"^the unique key function raised KeyError$"):
        key_digest("t", Unique(key=lambda a, k: k["secret"]), [], {})


def sync(account_id: int, full: bool = False) -> None: ...


def test_a_named_argument_is_found_by_position_and_every_argument_by_its_name() -> None:
    spec = Unique(on=("account_id",))
    assert key_digest("t", spec, [5], {}, sync) == key_digest("t", spec, [], {"account_id": 5},
                                                              sync)
    every = key_digest("t", Unique(), [5], {}, sync)
    assert every == key_digest("t", Unique(), [], {"account_id": 5}, sync)
    assert every == key_digest("t", Unique(), [5, False], {}, sync)  # the default, given
    assert every != key_digest("t", Unique(), [5, True], {}, sync)
    # no run (a task unknown here), or a call that does not fit it: as called
    assert key_digest("t", Unique(), [5], {}) != key_digest("t", Unique(), [], {"account_id": 5})
    assert key_digest("t", Unique(), [5, 6, 7], {}, sync) == key_digest("t", Unique(),
                                                                        [5, 6, 7], {})


def test_a_key_function_returns_any_json_value() -> None:
    spec = Unique(key=lambda a, k: {"shop": k["order"]["shop"], "day": a[0]})
    one = key_digest("t", spec, ["mon"], {"order": {"shop": 3, "id": 1}})
    assert one == key_digest("t", spec, ["mon"], {"order": {"id": 2, "shop": 3}})
    assert one != key_digest("t", spec, ["tue"], {"order": {"shop": 3}})


@pytest.mark.parametrize("bad", [
    Unique(until=Until.WINDOW),  # a window without ttl
    Unique(ttl=0), Unique(ttl=-1), Unique(ttl=float("inf")),
    Unique(on=()), Unique(on=(-1,)), Unique(on=(True,)), Unique(on="not a name"),
    Unique(on=(0,), key=lambda a, k: ""),
    "yes",
])
def test_bad_specs_are_refused_when_declared(bad) -> None:
    with pytest.raises(InvalidTaskOption):
        validate_unique(bad)


def test_the_field_carries_until_and_expiry() -> None:
    spec = validate_unique(Unique(until=Until.WINDOW, ttl=dt.timedelta(seconds=90)))
    assert spec is not None
    parsed = parse_field(field_value(spec, "a" * 64))
    assert parsed is not None
    assert (parsed.until, parsed.hold_ms) == (Until.WINDOW, 90_000)
    assert validate_unique(True) == Unique()
    assert validate_unique(None) is None
    assert validate_unique(False) is None


@given(st.text(max_size=120))
def test_parse_field_reads_outside_input_without_raising(text) -> None:
    parsed = parse_field(text)
    assert parsed is None or len(parsed.digest) == 64


def test_a_default_no_key_can_be_made_of_is_left_out_of_an_all_argument_key() -> None:
    """``on=None`` binds the arguments, those equal to their defaults left out: a sentinel
    default (not JSON) does not fail the publish, and a call passing the same values by
    name or by position, or leaving them to their defaults, makes one key."""
    sentinel = object()

    def run(account: int, since: str | None = None, client: object = sentinel) -> None:
        pass

    one = key_digest("t", Unique(), [5], {}, run)
    assert one == key_digest("t", Unique(), [], {"account": 5}, run)
    assert one == key_digest("t", Unique(), [5, None], {}, run)
    assert one != key_digest("t", Unique(), [6], {}, run)
    with pytest.raises(UniqueKeyError):
        key_digest("t", Unique(on="client"), [5], {}, run)


@given(value=st.one_of(st.text(max_size=120), st.binary(max_size=8), st.integers(), st.none(),
                       st.builds(lambda u, n, d: f"{u}:{n}:{d}",
                                 st.sampled_from(["s", "e", "w", "x"]),
                                 st.text(max_size=14), st.text(alphabet="0123456789abcdef",
                                                               min_size=63, max_size=65))))
def test_a_forged_field_is_refused_never_raised(value: object) -> None:
    """A ``jobbers_unique`` header is outside input (a worker records a late copy's lock
    from it): a malformed one reads as none, never raises, never holds for 0 ms."""
    parsed = parse_field(value)
    assert parsed is None or parsed.hold_ms >= 1


def test_a_digit_int_refuses_and_a_zero_hold_are_malformed() -> None:
    assert parse_field("e:\u00b2:" + "a" * 64) is None
    assert parse_field("e:0:" + "a" * 64) is None
    assert parse_field("e:5:" + "a" * 64) is not None
