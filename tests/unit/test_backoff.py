from __future__ import annotations

import random

import pytest

from jobbers_celery.core.backoff import BackoffStrategy, compute_delay

B = BackoffStrategy


@pytest.mark.parametrize(("strategy", "expected"), [
    (B.CONSTANT, [10, 10, 10, 10]),
    (B.LINEAR, [10, 20, 30, 40]),
    (B.EXPONENTIAL, [20, 40, 80, 160]),
])
def test_exact_formulas(strategy, expected):
    assert [compute_delay(strategy, 10, n, cap=10_000) for n in (1, 2, 3, 4)] == expected


@pytest.mark.parametrize("strategy", list(B))
def test_every_strategy_is_capped(strategy):
    rng = random.Random(1)
    for n in range(1, 200):
        assert compute_delay(strategy, 7, n, cap=100, rng=rng) <= 100


def test_huge_retry_numbers_do_not_overflow():
    assert compute_delay(B.EXPONENTIAL, 1, 10_000, cap=3600) == 3600


def test_jitter_is_uniform_over_zero_to_d_times_two_to_the_n():
    rng = random.Random(42)
    samples = [compute_delay(B.EXPONENTIAL_JITTER, 10, 3, cap=10_000, rng=rng)
               for _ in range(20_000)]
    assert min(samples) >= 0
    assert max(samples) <= 80
    mean = sum(samples) / len(samples)
    assert 38 < mean < 42  # uniform(0, 80) has mean 40
    assert sum(s < 40 for s in samples) / len(samples) == pytest.approx(0.5, abs=0.02)


def test_jitter_respects_a_low_cap_without_collapsing():
    rng = random.Random(7)
    samples = {compute_delay(B.EXPONENTIAL_JITTER, 10, 10, cap=5, rng=rng) for _ in range(100)}
    assert max(samples) <= 5
    assert len(samples) > 50


@pytest.mark.parametrize(("base", "n", "cap"), [(-1, 1, 10), (1, 0, 10), (1, 1, -5)])
def test_bad_arguments(base, n, cap):
    with pytest.raises(ValueError, match=">="):
        compute_delay(B.CONSTANT, base, n, cap)
