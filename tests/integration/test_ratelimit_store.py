"""``rate_limit_by`` in the store, both layouts (one slot: checked by the start step's own
script; sharded: ``rl.lua`` in the global slot first): k starts a window per key, the rest
told to wait until their key has room, the overrides read by the next start."""

from __future__ import annotations

import pytest

from jobbers_celery.core.ratelimit import RateKey, key_digest, parse_rate
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore, StepResult, ratelimits
from tests.integration.store_helpers import NAME, create

pytestmark = [pytest.mark.redis]

S = TaskState
A, B = RateKey(key_digest("acct-a"), parse_rate("3/s")), RateKey(key_digest("b"), parse_rate("3/s"))


def start(store: RedisStore, task_id: str, rate: RateKey | None, cap: int | None = None
          ) -> StepResult:
    return store.start(task_id, name=NAME, worker="w1@host", wid="wid-1", heartbeat_ms=None,
                       cap=cap, lease_cap_ms=60_000, defer_ms=1000, fields={}, rate=rate)


@pytest.mark.parametrize("shards", [1, 16])
def test_k_start_per_window_and_the_rest_wait_for_room(make_store, shards: int) -> None:
    store = make_store(prefix=f"rl{shards}", shards=shards)
    for i in range(8):
        create(store, f"a{i}")
    create(store, "b0")
    before = store.now_ms()
    res = [start(store, f"a{i}", A) for i in range(8)]
    assert [r.state for r in res] == [S.STARTED] * 3 + [S.SCHEDULED] * 5
    # The waiting ones take their places in order, 3 a window: a3, a4, a5 one period after
    # the starts of a0, a1, a2, then a6, a7 two periods after a0, a1. Each is compared with
    # the call that made its start's entry (not with a0's: how far apart the test's calls
    # are is not the limiter's matter).

    def call(n: int) -> tuple[int, int]:
        """The Redis clock over the n-th start(): from the previous one's step to its own."""
        return (res[n - 1].now_ms if n else before), res[n].now_ms

    places = []
    for w in range(3, 8):
        i, periods = (w - 3) % 3, 1 + (w - 3) // 3
        at = round(store.get(f"a{w}").run_at.timestamp() * 1000) - periods * 1000
        (lo, hi), (w_lo, w_hi) = call(i), call(w)
        places.append((w, lo, at, hi, w_hi - w_lo))
        if shards == 1:  # the step's own script: the entry and the wait at the step's time
            assert at == hi, places
        else:  # rl.lua makes the entry within a_i's call, before its step; a_w's wait is
            # told by rl.lua and added to the time of a_w's step, later in a_w's call
            assert lo <= at <= hi + (w_hi - w_lo), places
    why = store.history("a3")[-1]
    assert (why.from_state, why.to_state) == (S.SUBMITTED, S.SCHEDULED)
    assert why.reason.startswith(f"rate limit 3/s for key {A.digest[:8]} reached: waits ")
    assert why.reason.endswith(" s, no retry used")
    assert store.get("a3").attempt == 0  # not a start, not a retry
    assert start(store, "b0", B).state is S.STARTED  # another key: its own window
    assert ratelimits.held(store, [NAME]) == {NAME: 5}
    assert "acct-a" not in " ".join(store.client.keys("*"))


@pytest.mark.parametrize("shards", [1, 16])
def test_an_override_applies_at_the_next_start_and_off_lifts_it(make_store, shards: int
                                                               ) -> None:
    store = make_store(prefix=f"ro{shards}", shards=shards)
    for i in range(6):
        create(store, f"t{i}")
    assert ratelimits.set_override(store, NAME, "1 / sec") == "1/s"
    assert start(store, "t0", A).state is S.STARTED
    res = start(store, "t1", A)
    assert res.state is S.SCHEDULED
    assert "rate limit 1/s for key" in store.history("t1")[-1].reason
    assert ratelimits.set_override(store, NAME, "off") == "off"
    assert start(store, "t2", A).state is S.STARTED
    assert start(store, "t3", A).state is S.STARTED
    assert ratelimits.overrides(store) == {NAME: "off"}
    assert ratelimits.clear_override(store, NAME)
    assert not ratelimits.clear_override(store, NAME)
    with pytest.raises(ValueError, match="not a rate"):
        ratelimits.set_override(store, NAME, "fast")


def test_a_start_that_does_not_happen_takes_no_room_sharded(make_store) -> None:
    store = make_store(prefix="rg", shards=16)
    for i in range(4):
        create(store, f"g{i}")
    store.cancel("g0", "by test")
    assert start(store, "g0", A).state is None or store.get("g0").state is S.CANCELLED
    for i in range(1, 4):
        assert start(store, f"g{i}", A).state is S.STARTED
    window = store.client.zcard(store.keys.rate_window(NAME, A.digest))
    assert window == 3


def test_a_start_refused_or_failed_gives_its_entry_back_sharded(make_store, monkeypatch
                                                                ) -> None:
    """Sharded: the entry rl.lua took is given back when the start step raises (the start
    is sent again and takes its own) and when the task is started already (a duplicate
    delivery): the window holds one entry per start that happened."""
    import redis

    from jobbers_celery.store import steps

    store = make_store(prefix="rb", shards=16)
    window = store.keys.rate_window(NAME, A.digest)
    create(store, "d0")
    real = steps._run
    calls = []

    def lost(*args, **kwargs):
        calls.append(1)
        raise redis.ConnectionError("lost on the way")

    monkeypatch.setattr(steps, "_run", lost)
    with pytest.raises(redis.ConnectionError):
        start(store, "d0", A)
    assert calls
    assert store.client.zcard(window) == 0
    monkeypatch.setattr(steps, "_run", real)
    assert start(store, "d0", A).state is S.STARTED
    assert store.client.zcard(window) == 1
    again = start(store, "d0", A)  # the same message delivered twice
    assert not again.applied
    assert again.previous == S.STARTED
    assert store.client.zcard(window) == 1


@pytest.mark.cluster
def test_on_redis_cluster_the_window_is_one_slot_and_holds(tmp_path) -> None:
    """A real Redis Cluster (3 masters): the sharded layout's rl.lua and the steps run
    without a CROSSSLOT refusal, and the limit holds as on one server."""
    from redis.cluster import RedisCluster

    from tests.integration.topology_servers import cluster_set

    with cluster_set() as cluster:
        client = RedisCluster.from_url(cluster.url(1), decode_responses=True)
        try:
            store = RedisStore(client, "rlc", 604800, 16)
            for i in range(5):
                create(store, f"c{i}")
            assert [start(store, f"c{i}", A).state for i in range(5)] == \
                [S.STARTED] * 3 + [S.SCHEDULED] * 2
            assert ratelimits.held(store, [NAME]) == {NAME: 2}
            ratelimits.set_override(store, NAME, "off")
            assert ratelimits.overrides(store) == {NAME: "off"}
        finally:
            client.close()


def test_the_script_s_waits_are_core_ratelimit_room_at_s(make_store) -> None:
    """The Lua arithmetic is the model's (``core.ratelimit.room_at``, which the hypothesis
    tests check): each caller's wait, from the window and the callers ahead read just before
    its start, is the one the model gives."""
    from jobbers_celery.core.ratelimit import turn_at

    store = make_store(prefix="rm", shards=1)
    window = store.keys.rate_window(NAME, A.digest)
    waiting = store.keys.rate_waiting(NAME, A.digest)
    for i in range(20):
        create(store, f"m{i}")
    for i in range(20):
        starts = [int(s) for _, s in store.client.zrange(window, 0, -1, withscores=True)]
        queued = {str(m): int(s) for m, s in store.client.zrange(waiting, 0, -1, withscores=True)}
        res = start(store, f"m{i}", A)
        now = res.now_ms
        expected = turn_at(starts, queued, f"m{i}", 3, 1000, now)
        if expected == now:
            assert res.state is S.STARTED, i
        else:
            assert res.state is S.SCHEDULED, i
            run_at = round(store.get(f"m{i}").run_at.timestamp() * 1000)
            assert run_at == expected, (i, run_at - now, expected - now)


def test_a_steady_stream_with_late_returns_starts_count_a_second_in_order(make_store
                                                                          ) -> None:
    """rl.lua (the same rate_wait as the one-slot step) at 5/s: a newcomer every 40 ms for
    2.4 s, each caller told to wait coming back 80 ms after its run_at (the scheduler's
    poll, the broker): 5 start in every second (none, before a returning caller kept its
    place), never more than 5 in any second of the store's clock, in about the order they
    came."""
    import heapq
    import time

    store = make_store(prefix="rs", shards=16)
    keys = ratelimits.keys_of(store, NAME, A.digest)
    take = ratelimits._rl(store)
    t0 = time.monotonic()
    returns: list[tuple[float, int]] = []
    admitted: list[tuple[int, int]] = []  # (store ms, caller)
    arrivals = 0
    while time.monotonic() - t0 < 3.6:
        now = time.monotonic() - t0
        due = []
        if now >= arrivals * 0.04 and now < 2.4:
            due.append(arrivals)
            arrivals += 1
        while returns and returns[0][0] <= now:
            due.append(heapq.heappop(returns)[1])
        for caller in due:
            wait, _, member = take(keys, ["take", f"c{caller}", "5/s", NAME, 60_000])
            if int(wait):
                heapq.heappush(returns, (time.monotonic() - t0 + int(wait) / 1000 + 0.08,
                                         caller))
            else:
                admitted.append((int(str(member).rsplit(":", 1)[1].split(".")[0]), caller))
        time.sleep(0.005)
    times = [t - admitted[0][0] for t, _ in admitted]
    assert [sum(1 for t in times if s <= t < s + 1000) for s in (0, 1000, 2000)] \
        == [5, 5, 5], times
    for i, t in enumerate(times):
        assert sum(1 for u in times[i:] if u < t + 1000) <= 5, times
    # in about the order they came: a caller back just as the window's oldest start leaves
    # it (its run_at, given before the starts ahead of it were late) may find no room and
    # wait once more, a few places (at most a period's count) later
    order = [c for _, c in admitted]
    assert all(c > max(order[:i], default=-1) - 6 for i, c in enumerate(order)), str(order)
