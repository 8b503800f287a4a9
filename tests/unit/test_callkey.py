"""The key convention shared by ``Unique``, ``RateLimit`` and ``concurrency_key``
(core/callkey.py) and the canonical digest they name their keys by (core/keydigest.py): an
argument is its parameter however the caller passed it, a key function's failure names its
type only, and a digest is 64 hex digits, equal for equal canonical values, refused unhashed
over its bound."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from jobbers_celery.core import callkey, keydigest
from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.fairshare import ConcurrencyKey
from jobbers_celery.core.keydigest import canonical_digest, canonical_json
from jobbers_celery.core.ratelimit import RateLimit
from jobbers_celery.core.unique import Unique, key_digest


class KeyError_(ValueError):
    """The control's own error type, as each control passes its own."""


def sync(account_id: Any, region: Any = "eu", /, *, full: bool = False) -> None: ...


def work(tenant: Any, day: Any, amount: Any, note: Any = None) -> None: ...


class Bound:
    def run(self, tenant: Any, day: Any) -> None: ...


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)
PARAMS = ("tenant", "day", "amount")


def _passed(values: list[Any], by_position: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call of ``work`` passing its first ``by_position`` arguments by position, the rest
    by name."""
    return tuple(values[:by_position]), dict(zip(PARAMS[by_position:], values[by_position:],
                                                 strict=True))


@given(values=st.lists(JSON, min_size=3, max_size=3), chosen=st.sampled_from(PARAMS),
       by_position=st.integers(0, 3))
def test_an_argument_selected_by_name_is_the_same_however_it_was_passed(
        values: list[Any], chosen: str, by_position: int) -> None:
    args, kwargs = _passed(values, by_position)
    by_name = {k: v for k, v in zip(PARAMS, values, strict=True)}
    expected = by_name[chosen]
    assert callkey.select(chosen, work, args, kwargs, "k", KeyError_) == expected
    index = PARAMS.index(chosen)
    assert callkey.select(index, work, args, kwargs, "k", KeyError_) == expected
    # the three controls: the same digest as when every argument is passed by name
    assert RateLimit("1/s", on=chosen).digest(work, args, kwargs) == \
        RateLimit("1/s", on=chosen).digest(work, (), by_name)
    assert ConcurrencyKey((chosen, 0)).digest(work, args, kwargs) == \
        ConcurrencyKey((chosen, 0)).digest(work, (), by_name)
    for spec in (Unique(on=(chosen,)), Unique()):  # on=None: every argument, bound
        assert key_digest("t", spec, args, kwargs, work) == key_digest("t", spec, (), by_name,
                                                                        work)


def test_a_parameter_left_out_is_its_default_and_a_position_is_found_by_name() -> None:
    assert callkey.select("region", sync, (1,), {}, "k", KeyError_) == "eu"
    assert callkey.select("full", sync, (1,), {}, "k", KeyError_) is False
    assert callkey.select(("region", "full"), sync, (1, "us"), {"full": True}, "k",
                          KeyError_) == ["us", True]
    assert callkey.select(1, work, ("t",), {"day": 3}, "k", KeyError_) == 3
    assert callkey.select(3, work, ("t", 1, 2), {}, "k", KeyError_) is None  # note's default


def test_a_bound_task_s_self_is_not_an_argument_and_the_signature_is_read_once() -> None:
    task = Bound()
    assert callkey.select("tenant", task.run, ("acme", 1), {}, "k", KeyError_) == "acme"
    before = callkey._cached.cache_info().hits
    assert callkey.select("day", task.run, ("acme", 1), {}, "k", KeyError_) == 1
    assert callkey._cached.cache_info().hits > before  # a new bound method, the same entry


@pytest.mark.parametrize(("on", "run", "args", "kwargs", "says"), [
    ("tenant", work, (), {"day": 1}, "argument 'tenant' was not passed"),
    ("tenant", None, ("acme",), {}, "argument 'tenant' was not passed"),  # no run: as called
    (4, work, ("a", 1, 2), {}, "argument #4 was not passed"),
    ("other", work, ("a", 1, 2), {}, "argument 'other' was not passed"),
])
def test_an_argument_the_call_does_not_give_is_the_control_s_error(
        on: Any, run: Any, args: tuple[Any, ...], kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(KeyError_, match=f"^the key {says}"):
        callkey.select(on, run, args, kwargs, "the key", KeyError_)


def test_without_run_arguments_are_read_as_called() -> None:
    assert callkey.select("tenant", None, (), {"tenant": "a"}, "k", KeyError_) == "a"
    assert callkey.select(0, None, ("a",), {}, "k", KeyError_) == "a"
    assert callkey.bind_all(None, ("a",), {}) is None
    assert callkey.bind_all(work, ("a",), {}) is None  # does not fit the signature
    # an argument equal to its default is left out: given or not, one key; a parameter
    # added later with a default leaves the keys of calls that do not pass it as they were
    assert callkey.bind_all(sync, (5,), {}) == {"account_id": 5}
    assert callkey.bind_all(sync, (5, "eu"), {"full": False}) == {"account_id": 5}
    assert callkey.bind_all(sync, (5, "us"), {}) == {"account_id": 5, "region": "us"}


def test_a_key_function_s_failure_names_its_type_never_its_message() -> None:
    def leaky(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise ValueError(f"bad token {kwargs['token']}")

    with pytest.raises(KeyError_) as caught:
        callkey.call_key(leaky, (), {"token": "s3cret-value"}, "the key", KeyError_)
    assert str(caught.value) == "the key function raised ValueError"
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert callkey.call_key(lambda a, k: [a[0], k], ("x",), {"y": 1}, "k", KeyError_) == [
        "x", {"y": 1}]


@pytest.mark.parametrize("on", [True, False, -1, (), ("a", True), ("a", -2), "not a name",
                                "", 1.5, ("a", 1.5), {"a"}])
def test_a_bad_on_is_refused_when_declared(on: Any) -> None:
    with pytest.raises(InvalidTaskOption, match=r"^where: on must be"):
        callkey.check(on, None, "where")


def test_on_forms_and_key_are_checked_together() -> None:
    assert callkey.check("a", None, "w") == "a"
    assert callkey.check(0, None, "w") == 0
    assert callkey.check(["a", 0], None, "w") == ("a", 0)
    assert callkey.check(None, lambda a, k: 1, "w") is None
    for on, key in (("a", lambda a, k: 1), (None, "not callable")):
        with pytest.raises(InvalidTaskOption, match="takes the place of on"):
            callkey.check(on, key, "w")


def test_describe_says_what_a_key_is_made_of_never_a_value() -> None:
    assert callkey.describe(("account", 1), None, "-") == "argument 'account', argument #1"
    assert callkey.describe(None, None, "every call") == "every call"
    assert callkey.describe(None, sync, "-") == "function sync"


# ---- the canonical digest

EXTRA = (st.datetimes(timezones=st.just(dt.UTC)) | st.dates() | st.uuids()
         | st.decimals(allow_nan=False, allow_infinity=False) | st.binary(max_size=8)
         | st.frozensets(st.integers() | st.text(max_size=4), max_size=4))
VALUES = st.recursive(JSON | EXTRA, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@given(VALUES)
def test_a_digest_is_64_hex_and_equal_for_equal_canonical_values(value: Any) -> None:
    digest = canonical_digest(value, "k", KeyError_, 1 << 20)
    assert len(digest) == 64
    assert set(digest) <= set("0123456789abcdef")
    # the same value as a worker gets it (kombu's JSON serializer, as Celery's message
    # carries it) keeps its digest: the publisher and the worker make one key
    try:
        carried = kombu_json.loads(kombu_json.dumps(value))
    except TypeError:  # a type kombu's JSON does not carry (a set): never in a message
        assume(False)
    assert canonical_digest(carried, "k", KeyError_, 1 << 20) == digest


@given(JSON, JSON)
def test_different_canonical_values_have_different_digests(a: Any, b: Any) -> None:
    same_text = canonical_json(a) == canonical_json(b)
    assert (canonical_digest(a, "k", KeyError_) == canonical_digest(b, "k", KeyError_)) \
        == same_text


def test_values_celery_s_json_carries_are_written_canonically() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    ident = uuid.UUID(int=7)
    assert canonical_json({"b": {3, 1, 2}, "a": [when, ident, decimal.Decimal("1.50"),
                                                 b"\x00\xff", dt.date(2026, 1, 2)]}) == (
        '{"a":["2026-01-02T03:04:05+00:00","00000000-0000-0000-0000-000000000007","1.50",'
        '"00ff","2026-01-02"],"b":[1,2,3]}')
    assert canonical_json("é") == '"é"'  # UTF-8, not escaped: the bound counts its bytes
    for bad in (object(), float("nan"), float("inf")):
        with pytest.raises(KeyError_, match=r"^k is not JSON"):
            canonical_digest(bad, "k", KeyError_)


@given(st.integers(0, 40), st.sampled_from(["x", "é", "\U0001f600"]))
def test_a_value_over_the_bound_is_refused_before_it_is_hashed(n: int, char: str) -> None:
    value = char * n
    size = len(canonical_json(value).encode("utf-8"))
    hashed: list[bytes] = []

    def spy(data: bytes) -> Any:
        hashed.append(data)
        return hashlib.sha256(data)

    keydigest.hashlib = SimpleNamespace(sha256=spy)  # type: ignore[attr-defined,assignment]
    try:
        if size > 32:
            with pytest.raises(KeyError_, match="over 32 bytes"):
                canonical_digest(value, "k", KeyError_, max_bytes=32)
            assert hashed == []
        else:
            canonical_digest(value, "k", KeyError_, max_bytes=32)
            assert len(hashed) == 1
    finally:
        keydigest.hashlib = hashlib  # type: ignore[attr-defined]
