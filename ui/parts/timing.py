"""Timing that admits its noise: repeated timings as a median with its min–max, and whether two
settings differ by more than their spread, by an exact rank test. Pure functions of lists of
numbers, no torch.

One run's time varies run to run (a shared CPU, caches, the OS), so a single pair of runs can
rank two settings either way. A difference is claimed when the Mann–Whitney rank test (exact,
ties included) puts it below ``ALPHA``; its size is the ratio of the two medians. Min–max
overlap is no test: one slow repeat (a busy moment) makes the ranges overlap under a steady 2×
gap, and two ranges apart by luck say nothing with two runs a side.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

REPEATS = 5  # Compare's timed repeats of each side by default, interleaved (a, b, a, b, ...), after one warm-up each
MIN_REPEATS, MAX_REPEATS = 2, 30  # the bounds of Compare's repeat count (the exact test stays instant at 30)
ALPHA = 0.05  # a difference is claimed when the rank test's two-sided p is below this
NO_DIFFERENCE = "no measurable difference"


def spread(values: Sequence[float]) -> dict:
    """``n``, ``median``, ``min`` and ``max`` of repeated measurements (empty: all None, n 0)."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(s: dict, spec: str, unit: str = "") -> str:
    """"0.412 s (0.401–0.520 s, 5 repeats)"; one run: "0.412 s (one run)"."""
    if not s["n"]:
        return "—"
    median = f"{format(s['median'], spec)}{unit}"
    if s["n"] == 1:
        return f"{median} (one run)"
    return f"{median} ({format(s['min'], spec)}–{format(s['max'], spec)}{unit}, {s['n']} repeats)"


def rank_test(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The two-sided p of the Mann–Whitney U test (the Wilcoxon rank-sum test) of ``xs`` against
    ``ys``, exact: the share of all C(n, len(xs)) ways to split the pooled values into groups of
    these sizes whose rank sum for ``xs`` lies at least as far from its mean as the observed one.
    Tied values share their mean rank, and the count is over those ranks, so ties are exact too.
    Counted by dynamic programming over doubled (integer) ranks: instant for a few dozen values."""
    pooled = sorted([*xs, *ys])
    twice_rank: dict[float, int] = {}  # 2 × the mean rank (1-based) of each distinct value
    start = 0
    while start < len(pooled):
        end = start
        while end < len(pooled) and pooled[end] == pooled[start]:
            end += 1
        twice_rank[pooled[start]] = start + 1 + end
        start = end
    ranks, k = [twice_rank[v] for v in pooled], len(xs)
    observed, mean = sum(twice_rank[v] for v in xs), k * (len(pooled) + 1)
    top = sum(ranks[-k:]) if k else 0
    ways = [[1] + [0] * top] + [[0] * (top + 1) for _ in range(k)]  # ways[j][s]: j values with rank sum s
    for r in ranks:
        for j in range(k, 0, -1):
            below, row = ways[j - 1], ways[j]
            row[r:] = [w + v for w, v in zip(row[r:], below)]
    far = sum(w for s, w in enumerate(ways[k]) if abs(s - mean) >= abs(observed - mean))
    return min(1.0, far / math.comb(len(pooled), k))


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the rank test can give with these counts (every A apart from every B)."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def repeats_needed() -> int:
    """The fewest repeats a side for which the rank test can find a difference at ``ALPHA``."""
    return next(n for n in range(1, MAX_REPEATS + 1) if smallest_p(n, n) < ALPHA)


def speedup(times_a: Sequence[float], times_b: Sequence[float], spec: str = ".3f", unit: str = " s") -> dict:
    """How many times faster B is than A, from repeated times of each (lower is faster).

    Returns ``a`` and ``b`` (their :func:`spread`), ``ratio`` (A's median over B's: > 1 means B
    is faster; None when B's median is 0), ``p`` (:func:`rank_test`'s, None with a single time on
    a side), ``verdict`` and ``text``, e.g. "2.10× faster (median 0.400 s vs A's 0.840 s, 5 runs
    each; rank test p = 0.008)". The verdict is "B faster" or "B slower" when p < ``ALPHA``,
    "no measurable difference" when not, "too few runs" when even B apart from A in every run
    could not reach ``ALPHA``, and "one run" when a side has a single time.
    """
    a, b = spread(times_a), spread(times_b)
    if not a["n"] or not b["n"]:
        return {"a": a, "b": b, "ratio": None, "p": None, "verdict": "not measured", "text": "not measured"}
    ratio = a["median"] / b["median"] if b["median"] else None
    if a["n"] < 2 or b["n"] < 2:
        return {"a": a, "b": b, "ratio": ratio, "p": None, "verdict": "one run",
                "text": f"{_times(ratio)} from one run of a side: no spread to judge by"}
    p = rank_test(times_a, times_b)
    runs = f"{a['n']} runs each" if a["n"] == b["n"] else f"{a['n']} runs of A, {b['n']} of B"
    medians = f"median {format(b['median'], spec)}{unit} vs A's {format(a['median'], spec)}{unit}, {runs}"
    if smallest_p(a["n"], b["n"]) >= ALPHA:
        verdict = "too few runs"
        text = (f"cannot tell from {runs}: the rank test cannot go below p {_p(smallest_p(a['n'], b['n']))} "
                f"(ratio of medians {_times(ratio)}; it needs at least {repeats_needed()} repeats a side)")
    elif p >= ALPHA:
        verdict = NO_DIFFERENCE
        text = f"{NO_DIFFERENCE} ({medians}, ratio {_times(ratio)}; rank test p {_p(p)}, not below {ALPHA})"
    else:
        faster = sum((x > y) - (x < y) for x in times_a for y in times_b) > 0  # A's times rank above B's
        verdict = "B faster" if faster else "B slower"
        size = _times(ratio if faster else 1 / ratio if ratio else None)
        text = f"{size} {'faster' if faster else 'slower'} ({medians}; rank test p {_p(p)})"
    return {"a": a, "b": b, "ratio": ratio, "p": p, "verdict": verdict, "text": text}


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"
