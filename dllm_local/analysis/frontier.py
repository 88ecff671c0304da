"""Accuracy-against-speed points and their Pareto frontier, torch-free (the page uses it): a sweep's
points, and results added from elsewhere (``reports.add_points``), and each policy's AUP."""
from __future__ import annotations

import math
from numbers import Real

MAX_POINTS = 1000  # points on one chart: a sweep's grid, or a sweep with the results added to it


# A sweep's frontier: accuracy (higher is better) against forwards per answer (fewer is better).
# Both are counts, the same on every run of a setting; tokens/s is measured, and two settings that
# take the same forwards differ in it by timing noise alone, so it only places a point on the chart.
FRONTIER_AXES = (("accuracy", 1), ("nfe", -1))


def pareto(points: list[dict], axes: tuple[tuple[str, int], ...] = FRONTIER_AXES) -> list[int]:
    """Indices of the points no other point beats: as good on every one of ``axes`` ((key, +1
    where higher is better, -1 where lower is)) and better on one. Equal points tie: both stay."""
    def beats(q: dict, p: dict) -> bool:
        return all(q[k] * sign >= p[k] * sign for k, sign in axes) and any(q[k] * sign > p[k] * sign for k, sign in axes)

    return [i for i, p in enumerate(points) if not any(beats(q, p) for j, q in enumerate(points) if j != i)]


# Accuracy under parallelism (AUP), as d3LLM defines it: the area under accuracy (in percent) against
# tokens per forward, each accuracy weighted by W(y) = min(exp(-alpha (1 - y / y_max)), 1), over the
# points within ``AUP_CUT`` points of the first (least parallel) one.
AUP_ALPHA = 3.0
AUP_CUT = 5.0
# Parallelism is counted on content tokens only (the page's content tau): end-of-text padding that a
# step commits wholesale would otherwise count as parallel decoding.
PARALLELISM = "tau_content"


def aup_weight(y: float, y_max: float, alpha: float = AUP_ALPHA) -> float:
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0) if y_max > 0 else 1.0


def aup(points: list[tuple[float, float]], y_max: float | None = None, alpha: float = AUP_ALPHA,
        cut: float = AUP_CUT, fraction: bool = False) -> float:
    """d3LLM's AUP of ``(tokens per forward, accuracy)`` points, in percent-points x tokens per forward:

        AUP = rho_1 y_1 + sum_{i>=2} (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2

    over the points sorted by rho whose accuracy is at least y_1 - ``cut`` (y_1: the least parallel
    point's). ``y_max``: the best accuracy of every method compared (default: of these points).
    ``fraction``: accuracies are given in [0, 1]; they are scored as percentages either way."""
    scale = 100.0 if fraction else 1.0
    curve = sorted((float(rho), float(y) * scale) for rho, y in points if rho > 0)
    if not curve:
        return 0.0
    top = curve[0][1] - cut
    curve = [(rho, y) for rho, y in curve if y >= top]
    y_max = max(y for _, y in curve) if y_max is None else y_max * scale
    area = curve[0][0] * curve[0][1]
    for (rho_a, y_a), (rho_b, y_b) in zip(curve, curve[1:]):
        area += (rho_b - rho_a) * (y_a * aup_weight(y_a, y_max, alpha) + y_b * aup_weight(y_b, y_max, alpha)) / 2
    return area


def policy_of(row: dict) -> str:
    """"dual + threshold": the cache and unmasking policies a result row was decoded with."""
    s = row.get("settings") or {}
    return f"{s.get('cache', '?')} + {s.get('unmask', '?')}" + (f" ({row['label']})" if row.get("label") else "")


def policy_curves(rows: list[dict]) -> dict[str, dict]:
    """Per policy: its curve of accuracy (%) against content tokens per forward (the points no other
    point of that policy beats, least parallel first: on such a curve the first point is
    the most accurate, so d3LLM's cut keeps the points within 5 of the policy's best) and its AUP,
    every policy's accuracy weighted against the best accuracy of all the rows."""
    rows = [r for r in rows if isinstance(r.get(PARALLELISM), Real) and r[PARALLELISM] > 0
            and isinstance(r.get("accuracy"), Real)]
    by_policy: dict[str, list[dict]] = {}
    for row in rows:
        by_policy.setdefault(policy_of(row), []).append(row)
    y_max = max((r["accuracy"] for r in rows), default=0.0) * 100
    curves = {}
    for policy, members in by_policy.items():
        front = sorted((members[i] for i in pareto(members, (("accuracy", 1), (PARALLELISM, 1)))), key=lambda r: r[PARALLELISM])
        points = [(r[PARALLELISM], r["accuracy"] * 100) for r in front]
        curves[policy] = {"tau_content": [p[0] for p in points], "accuracy": [p[1] for p in points],
                          "aup": round(aup(points, y_max=y_max), 2),
                          # the first points, within AUP_CUT of the first (the best): those the AUP counts
                          "counted": sum(y >= points[0][1] - AUP_CUT for _, y in points) if points else 0}
    return curves
