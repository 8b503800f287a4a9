"""``rate_limit_by``'s pure parts: the rate's text, the key's digest and arguments, and the
window arithmetic the start step's Lua applies (``room_at``)."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.options import validate_options
from jobbers_celery.core.ratelimit import (
    MAX_COUNT,
    MAX_KEY_BYTES,
    MAX_RATE_TEXT,
    PERIODS_MS,
    WAIT_GRACE_MS,
    Rate,
    RateLimit,
    RateLimitKeyError,
    key_digest,
    parse_override,
    parse_rate,
    room_at,
    turn_at,
    wait_place,
)


@pytest.mark.parametrize(("text", "rate"), [
    ("10/s", Rate(10, "s")), ("5/m", Rate(5, "m")), ("100/h", Rate(100, "h")),
    ("1000/d", Rate(1000, "d")), (" 7 / Min ", Rate(7, "m")), ("1/hours", Rate(1, "h")),
    ("2/sec", Rate(2, "s")), ("3/day", Rate(3, "d")), (f"{MAX_COUNT}/s", Rate(MAX_COUNT, "s")),
])
def test_rates_read(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize(("text", "says"), [
    ("fast", "not a rate"), ("10", "not a rate"), ("10/w", "unit must be s, m, h or d"),
    ("0/s", "between 1 and"), (f"{MAX_COUNT + 1}/s", "between 1 and"), ("-1/s", "not a rate"),
    ("1.5/s", "not a rate"), ("10/ms", "unit"), ("1" * 40 + "/s", "at most"), (10, "text"),
    (None, "text"),
])
def test_bad_rates_say_what_is_wrong(text: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_rate(text)


@given(st.text(max_size=80))
def test_any_text_is_a_rate_or_a_clear_value_error(text: str) -> None:
    try:
        rate = parse_rate(text)
    except ValueError as exc:
        said = str(exc)
        assert said
        assert len(said) < 200 + MAX_RATE_TEXT * 4
    else:
        assert 1 <= rate.count <= MAX_COUNT
        assert rate.unit in PERIODS_MS
        assert parse_rate(str(rate)) == rate


@given(st.integers(1, MAX_COUNT), st.sampled_from(sorted(PERIODS_MS)), st.booleans())
def test_the_canonical_text_round_trips(count: int, unit: str, spaced: bool) -> None:
    text = f" {count} / {unit} " if spaced else f"{count}/{unit}"
    assert str(parse_rate(text)) == f"{count}/{unit}"
    assert parse_override(text) == f"{count}/{unit}"


def test_off_is_an_override_only() -> None:
    assert parse_override(" OFF ") == "off"
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate("off")


def test_the_option_is_validated_when_the_task_is_declared() -> None:
    assert validate_options({"rate_limit_by": "5/m"}).rate_limit_by == RateLimit("5/m")
    opts = validate_options({"rate_limit_by": RateLimit("10/s", on="account")})
    assert opts.rate_limit_by is not None
    assert opts.rate_limit_by.limit == Rate(10, "s")
    for bad in ("10/w", 10, RateLimit):
        with pytest.raises(InvalidTaskOption, match="rate_limit_by"):
            validate_options({"rate_limit_by": bad})
    for bad in (-1, (), ("a", 1.5), True):
        with pytest.raises(InvalidTaskOption, match="on must be"):
            RateLimit("1/s", on=bad)


def _task(account: str, region: str = "eu", *, dry: bool = False) -> None: ...


@pytest.mark.parametrize(("on", "args", "kwargs", "value"), [
    ("account", ("a1",), {}, "a1"), ("account", (), {"account": "a2"}, "a2"),
    ("region", ("a", "us"), {}, "us"), (0, ("a3",), {}, "a3"), (None, ("x",), {}, None),
    ("region", ("a",), {}, "eu"), ("dry", ("a",), {}, False), (0, (), {"account": "a6"}, "a6"),
    (("account", "region"), ("a5",), {"region": "us"}, ["a5", "us"]),
])
def test_the_key_is_read_from_the_arguments(on, args, kwargs, value) -> None:
    assert RateLimit("1/s", on=on).value_of(_task, args, kwargs) == value


def test_a_key_function_gets_args_and_kwargs_as_unique_s_does() -> None:
    limit = RateLimit("1/s", key=lambda args, kwargs: args[0].upper())
    assert limit.value_of(_task, ("a4",), {}) == "A4"
    with pytest.raises(InvalidTaskOption, match="takes the place of on"):
        RateLimit("1/s", on="account", key=lambda a, k: 1)


def test_a_key_that_cannot_be_read_is_an_error_never_no_limit() -> None:
    with pytest.raises(RateLimitKeyError, match="'account' was not passed"):
        RateLimit("1/s", on="account").value_of(_task, (), {"region": "us"})
    with pytest.raises(RateLimitKeyError, match="raised ZeroDivisionError"):
        RateLimit("1/s", key=lambda a, k: 1 / 0).value_of(_task, ("a",), {})
    with pytest.raises(RateLimitKeyError, match="over 1024 bytes"):
        key_digest("x" * MAX_KEY_BYTES)
    with pytest.raises(RateLimitKeyError, match="not JSON"):
        key_digest(object())


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8))
def test_the_digest_is_the_canonical_json_s_and_hides_the_value(value: object) -> None:
    try:
        d = key_digest(value)
    except RateLimitKeyError:
        return
    assert len(d) == 64
    assert int(d, 16) >= 0
    if isinstance(value, dict):
        assert key_digest(dict(reversed(list(value.items())))) == d  # key order: no matter


# ---- the window: never more than count starts in any period, and room when it says so

def _simulate(arrivals: list[int], count: int, period: int,
              late: list[int] | None = None) -> list[tuple[int, int]]:
    """Callers arrive; each starts if turn_at says now, else comes back at the time it
    said (as the scheduler re-publishes it), ``late[k]`` ms after it for its k-th return
    (the scheduler's poll, the broker, the worker's queue): the (start, caller)s."""
    starts: list[tuple[int, int]] = []
    waiting: dict[str, int] = {}  # caller -> run_at, of callers told to wait
    queue = [(t, i) for i, t in enumerate(arrivals)]
    heapq.heapify(queue)
    returns = 0
    while queue:
        assert returns < 100 * len(arrivals), "a caller never starts"
        now, caller = heapq.heappop(queue)
        at = turn_at([t for t, _ in starts], waiting, str(caller), count, period, now)
        place = wait_place(waiting, str(caller), at, now)
        waiting = {c: t for c, t in waiting.items() if t > now - WAIT_GRACE_MS}
        waiting.pop(str(caller), None)
        if at == now:
            starts.append((now, caller))
        else:
            assert at > now
            waiting[str(caller)] = place
            lag = late[returns % len(late)] if late else 0
            returns += 1
            heapq.heappush(queue, (at + lag, caller))
    return starts


def _at_most_count_per_window(starts: list[int], count: int, period: int) -> None:
    starts = sorted(starts)
    for i, t in enumerate(starts):
        assert sum(1 for u in starts[i:] if u < t + period) <= count


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=60), st.integers(1, 6),
       st.sampled_from([10, 100, 1000]))
def test_no_window_ever_holds_more_than_count_and_everyone_starts(
        arrivals: list[int], count: int, period: int) -> None:
    starts = [t for t, _ in _simulate(arrivals, count, period)]
    assert len(starts) == len(arrivals)
    _at_most_count_per_window(starts, count, period)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.sampled_from([100, 1000]), st.integers(2, 10),
       st.lists(st.integers(0, 400), min_size=1, max_size=20))
def test_a_steady_stream_with_late_returns_keeps_count_per_period(
        count: int, period: int, faster: int, late: list[int]) -> None:
    """More callers than the limit, one every period/(count*faster) ms, each coming back up
    to 400 ms after the run_at it was given: never more than count per window, everyone
    starts, and count start in every stretch of a period and the lateness (no stall)."""
    gap = max(1, period // (count * faster))
    arrivals = list(range(0, 8 * period, gap))
    starts = _simulate(arrivals, count, period, late)
    times = [t for t, _ in starts]
    assert len(starts) == len(arrivals)
    _at_most_count_per_window(times, count, period)
    lag = max(late)
    for t0 in range(period, 8 * period, period // 2):  # while the stream lasts
        assert sum(1 for t in times if t0 <= t < t0 + period + lag + 1) >= count, t0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.sampled_from([100, 1000]), st.integers(2, 10),
       st.integers(0, 400))
def test_callers_told_to_wait_start_in_order_whatever_their_lateness(
        count: int, period: int, faster: int, late: int) -> None:
    """The same stream, each caller coming back ``late`` ms after its run_at: they start in
    the order they arrived (none is passed by a later one)."""
    gap = max(1, period // (count * faster))
    arrivals = list(range(0, 8 * period, gap))
    order = [c for _, c in sorted(_simulate(arrivals, count, period, [late]))]
    assert order == sorted(order)


@given(st.lists(st.integers(0, 999), max_size=12), st.integers(1, 6), st.integers(0, 10))
def test_the_time_it_gives_has_room(starts: list[int], count: int, waiting: int) -> None:
    now = 1000
    at = room_at(starts, count, 1000, now, waiting=waiting)
    live = [t for t in starts if t > now - 1000]
    if len(live) + waiting < count:
        assert at == now
    else:
        assert at > now
    if waiting == 0:  # nobody ahead: room then, and not a moment before
        assert room_at(starts, count, 1000, at) == at
        if at > now:
            assert room_at(starts, count, 1000, at - 1) != at - 1


# ---- the in-memory test kit holds the same limit

def test_the_in_memory_store_holds_the_limit_and_its_overrides() -> None:
    from jobbers_celery.core.ratelimit import RateKey
    from jobbers_celery.core.states import TaskState as S
    from jobbers_celery.testing import InMemoryStore

    store = InMemoryStore()
    rate = RateKey(key_digest("acct"), parse_rate("2/s"))

    def start(task_id: str):
        store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name="t.x",
                     create={"name": "t.x", "queue": "q", "ver": "1"})
        return store.start(task_id, name="t.x", worker="w", wid="wid", heartbeat_ms=None,
                           cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={}, rate=rate)

    assert [start(f"m{i}").state for i in range(4)] == [S.STARTED] * 2 + [S.SCHEDULED] * 2
    reason = store.history("m2")[-1].reason or ""
    assert reason.startswith(f"rate limit 2/s for key {rate.digest[:8]} reached: waits ")
    assert store.rate_held(["t.x"]) == {"t.x": 2}
    store.set_rate_override("t.x", "off")
    assert start("m4").state is S.STARTED
    store.clear_rate_override("t.x")
    store.advance(1.1)
    # m2 and m3 are due, on their way back: their places are kept from a newcomer
    assert start("m5").state is S.SCHEDULED
    store.advance(WAIT_GRACE_MS / 1000 + 2)  # none came back: forgotten
    assert start("m6").state is S.STARTED
    assert store.rate_overrides() == {}


def test_a_start_works_out_its_key_once() -> None:
    """The key function runs once per start (it may be costly), also when the start is
    sent again (a record missing: submitted late, then started)."""
    from types import SimpleNamespace
    from typing import Any

    from jobbers_celery.core.options import TaskOptions
    from jobbers_celery.store import StepResult
    from jobbers_celery.worker.outage import Delivery
    from jobbers_celery.worker.start import Starter

    calls: list[object] = []

    def key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        calls.append(kwargs["acct"])
        return kwargs["acct"]

    rates: list[object] = []
    results = [StepResult(applied=False, previous="missing", now_ms=0, attempt=0),
               StepResult(applied=True, previous="submitted", now_ms=0, attempt=1)]

    class Recorder:
        def start(self, *args: Any, rate: object = None, **kwargs: Any) -> StepResult:
            rates.append(rate)
            return results.pop(0)

    starter = Starter(store=SimpleNamespace(epoch=lambda _id: None, recheck_master=lambda: False),  # type: ignore[arg-type]
                      recorder=Recorder(), publisher=None, handover=None,  # type: ignore[arg-type]
                      lost_after=10.0)
    starter._record_late_submit = lambda d, opts, made: None  # type: ignore[method-assign]
    d = Delivery(name="t.x", task_id="k1", retries=0, worker="w",
                 request=SimpleNamespace(args=(), kwargs={"acct": "a"}, headers={}),
                 signature=lambda: None)  # type: ignore[arg-type,return-value]
    opts = TaskOptions(rate_limit_by=RateLimit("2/s", key=key))
    assert starter.start(d, opts).applied
    assert calls == ["a"]
    assert len(rates) == 2
    assert rates[0] == rates[1] is not None
