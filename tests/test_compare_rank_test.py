"""Compare's speed verdict on constructed samples: the exact rank test against a count of every
split by brute force, and the verdict's wording for a steady gap, no gap and too few runs,
including the steady 2× gap whose min–max ranges overlap (once called "no measurable difference")."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from ui.parts.timing import ALPHA, NO_DIFFERENCE, rank_test, repeats_needed, smallest_p, speedup

# A steady 2× gap with one slow repeat of B (a busy moment): B's slowest, 1.97 s, is slower than
# A's two fastest, so the min–max ranges overlap, yet every other pair of runs is 2× apart.
STEADY_A = [2.0, 2.1, 1.9, 2.05, 1.95]
STEADY_B = [1.0, 0.95, 1.05, 1.0, 1.97]


def brute_force_p(xs: list[float], ys: list[float]) -> float:
    """The two-sided p by listing every way to split the pooled values into groups of len(xs) and
    len(ys), with mean ranks for ties worked out as (values below) + (equal values + 1) / 2."""
    pooled = [*xs, *ys]
    rank = {v: sum(u < v for u in pooled) + (sum(u == v for u in pooled) + 1) / 2 for v in pooled}
    mean = len(xs) * (len(pooled) + 1) / 2
    observed = abs(sum(rank[v] for v in xs) - mean)
    splits = list(itertools.combinations(range(len(pooled)), len(xs)))
    far = sum(abs(sum(rank[pooled[i]] for i in split) - mean) >= observed - 1e-9 for split in splits)
    return far / len(splits)


@pytest.mark.parametrize("xs, ys", [
    (STEADY_A, STEADY_B),
    ([1.0, 1.0, 2.0, 3.0, 3.0], [1.0, 2.0, 2.0, 4.0]),  # ties within and across the groups
    ([0.5, 0.7, 0.6], [0.55, 0.65, 0.9, 0.4, 0.75, 0.8]),
    ([1.0, 1.0, 1.0], [1.0, 1.0]),  # all tied: nothing to tell
    ([3.0], [1.0, 2.0]),
])
def test_the_rank_test_counts_every_split_exactly(xs, ys):
    assert rank_test(xs, ys) == pytest.approx(brute_force_p(xs, ys), abs=1e-12)
    assert rank_test(ys, xs) == pytest.approx(rank_test(xs, ys), abs=1e-12)  # two-sided


def test_the_rank_test_on_random_samples_agrees_with_brute_force():
    rng = random.Random(42)
    for _ in range(20):
        xs = [round(rng.gauss(1.0, 0.2), 1) for _ in range(rng.randint(2, 6))]  # rounded: ties happen
        ys = [round(rng.gauss(1.1, 0.2), 1) for _ in range(rng.randint(2, 6))]
        assert rank_test(xs, ys) == pytest.approx(brute_force_p(xs, ys), abs=1e-12), (xs, ys)


def test_the_smallest_p_is_two_over_the_number_of_splits():
    apart = rank_test([2.0, 2.1, 2.2, 2.3, 2.4], [1.0, 1.1, 1.2, 1.3, 1.4])
    assert apart == pytest.approx(2 / math.comb(10, 5)) == smallest_p(5, 5)  # 0.0079: "p = 0.008"
    assert smallest_p(3, 3) == pytest.approx(0.1) and smallest_p(4, 4) < ALPHA
    assert repeats_needed() == 4


def test_a_steady_2x_gap_is_found_though_the_ranges_overlap():
    assert min(STEADY_A) <= max(STEADY_B)  # the ranges overlap: the old rule said "no measurable difference"
    result = speedup(STEADY_A, STEADY_B)
    assert result["verdict"] == "B faster" and result["ratio"] == pytest.approx(2.0)
    assert result["p"] == pytest.approx(8 / 252) and result["p"] < ALPHA  # 2 of 25 pairs out of order
    assert result["text"] == "2.00× faster (median 1.000 s vs A's 2.000 s, 5 runs each; rank test p = 0.032)"
    slower = speedup(STEADY_B, STEADY_A)
    assert slower["verdict"] == "B slower" and slower["ratio"] == pytest.approx(0.5)
    assert slower["text"] == "2.00× slower (median 2.000 s vs A's 1.000 s, 5 runs each; rank test p = 0.032)"


def test_the_same_times_interleaved_are_no_measurable_difference_with_the_ratio_and_p_said():
    a, b = [1.00, 1.02, 1.04, 1.06, 1.08], [1.01, 1.03, 1.05, 1.07, 1.09]
    result = speedup(a, b)
    assert result["verdict"] == NO_DIFFERENCE and result["p"] == pytest.approx(brute_force_p(a, b))
    assert result["text"] == (f"{NO_DIFFERENCE} (median 1.050 s vs A's 1.040 s, 5 runs each, ratio 0.99×; "
                              f"rank test p = {result['p']:.3f}, not below 0.05)")


def test_too_few_runs_cannot_tell_even_when_apart_and_unequal_counts_are_named():
    two = speedup([2.0, 2.1], [1.0, 1.1])
    assert two["verdict"] == "too few runs" and two["ratio"] == pytest.approx(2.05 / 1.05)
    assert "cannot tell from 2 runs each: the rank test cannot go below p = 0.333" in two["text"]
    assert two["text"].endswith("(ratio of medians 1.95×; it needs at least 4 repeats a side)")
    uneven = speedup(STEADY_A, STEADY_B[:4])  # Stop after A's 5th repeat, before B's
    assert uneven["verdict"] == "B faster" and "5 runs of A, 4 of B" in uneven["text"]
    assert speedup([2.0], [1.0])["verdict"] == "one run" and speedup([], [1.0])["verdict"] == "not measured"


def test_the_exact_test_stays_instant_at_the_most_repeats():
    import time

    from ui.parts.timing import MAX_REPEATS
    rng = random.Random(7)
    a = [rng.random() for _ in range(MAX_REPEATS)]
    b = [rng.random() + 0.5 for _ in range(MAX_REPEATS)]
    start = time.perf_counter()
    p = rank_test(a, b)
    assert time.perf_counter() - start < 5.0 and 0 < p < ALPHA
