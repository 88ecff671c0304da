"""Timing that admits its noise: repeated timings as a median with its min–max, and whether two
settings differ by more than that spread. Pure functions of lists of numbers, no torch.

One run's time varies run to run (a shared CPU, caches, the OS), so a single pair of runs can
rank two settings either way. A difference is claimed only
when the two sides' ranges over their repeats do not overlap.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

REPEATS = 5  # timed repeats of each side in Compare, interleaved (a, b, a, b, ...), after one warm-up each
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


def speedup(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """How many times faster B is than A, from repeated times of each (lower is faster).

    Returns ``a`` and ``b`` (their :func:`spread`), ``ratio`` (A's median over B's: > 1 means B
    is faster; None when B's median is 0), ``low`` and ``high`` (the ratio's range: A's fastest
    over B's slowest, A's slowest over B's fastest), ``overlap`` (whether the two min–max ranges
    share a value), ``verdict`` and ``text``. The verdict is "no measurable difference" when the
    ranges overlap, "B faster" or "B slower" when they do not, and "one run" when a side has a
    single time: one run has no spread to judge by.
    """
    a, b = spread(times_a), spread(times_b)
    if not a["n"] or not b["n"]:
        return {"a": a, "b": b, "ratio": None, "low": None, "high": None, "overlap": None,
                "verdict": "not measured", "text": "not measured"}
    ratio = a["median"] / b["median"] if b["median"] else None
    low = a["min"] / b["max"] if b["max"] else None
    high = a["max"] / b["min"] if b["min"] else None
    overlap = a["min"] <= b["max"] and b["min"] <= a["max"]
    if a["n"] < 2 or b["n"] < 2:
        verdict = "one run"
        text = f"{_times(ratio)} from one run of a side: no spread to judge by"
    elif overlap:
        verdict = NO_DIFFERENCE
        text = (f"{NO_DIFFERENCE} (A {a['min']:.3f}–{a['max']:.3f} s, "
                f"B {b['min']:.3f}–{b['max']:.3f} s)")
    else:
        verdict = "B faster" if a["min"] > b["max"] else "B slower"
        text = f"{_times(ratio)} (range {_times(low, '')}–{_times(high)})"
    return {"a": a, "b": b, "ratio": ratio, "low": low, "high": high, "overlap": overlap,
            "verdict": verdict, "text": text}


def _times(value: float | None, sign: str = "×") -> str:
    return "—" if value is None else f"{value:.2f}{sign}"
