"""AUP (accuracy under parallelism), d3LLM's definition, on cases worked out by hand, on the
published figures it must reproduce, and per policy in a sweep's report."""
from __future__ import annotations

import math

import pytest

from dllm_local.analysis.frontier import aup, aup_weight, policy_curves


def test_one_point_is_its_rectangle():
    assert aup([(2.0, 80.0)]) == pytest.approx(160.0)


def test_a_flat_curve_is_the_rectangle_up_to_its_most_parallel_point():
    # rho_1 y_1 + (2 - 1)(80 + 80)/2 + (4 - 2)(80 + 80)/2 = 80 + 80 + 160
    assert aup([(4.0, 80.0), (1.0, 80.0), (2.0, 80.0)]) == pytest.approx(320.0)


def test_a_point_more_than_five_below_the_first_is_cut_and_lower_accuracy_is_weighted_down():
    w = math.exp(-3 * (1 - 78 / 80))  # W(78) with y_max 80
    by_hand = 1 * 80 + (2 - 1) * (80 * 1.0 + 78 * w) / 2
    assert aup([(1.0, 80.0), (2.0, 78.0), (3.0, 70.0)]) == pytest.approx(by_hand)  # 70 < 80 - 5: left out
    assert aup([(1.0, 80.0), (2.0, 78.0), (3.0, 75.0)]) > by_hand  # 75 = 80 - 5: kept
    assert aup_weight(90.0, 80.0) == 1.0  # never above 1


def test_accuracy_as_a_fraction_scores_as_the_same_percentage():
    points = [(1.0, 80.0), (2.5, 77.0), (4.0, 76.0)]
    assert aup([(r, y / 100) for r, y in points], fraction=True) == pytest.approx(aup(points))
    assert aup([(r, y / 100) for r, y in points], y_max=0.9, fraction=True) == pytest.approx(aup(points, y_max=90))


@pytest.mark.parametrize("points, published", [
    ([(1.00, 74.79), (2.77, 74.68)], 205.78),  # Fast-dLLM on LLaDA-8B-Instruct, GSM8K-CoT
    ([(1.00, 74.02), (9.08, 73.10)], 635.72),  # d3LLM-LLaDA, GSM8K-CoT
])
def test_the_published_leaderboard_figures_come_out(points, published):
    """d3LLM's leaderboard (its blog's dLLM_Results.csv): y_max is the best accuracy of every
    method on the task, 74.98 on LLaDA's GSM8K-CoT."""
    assert aup(points, y_max=74.98) == pytest.approx(published, abs=0.01)


def test_each_policy_gets_its_curve_and_an_aup_against_the_best_of_all():
    def row(cache, tau, acc):
        return {"settings": {"cache": cache, "unmask": "threshold"}, "tau_content": tau, "accuracy": acc}

    rows = [row("dual", 1.0, 0.80), row("dual", 2.0, 0.80), row("dual", 1.5, 0.70),  # 1.5 is beaten by 2.0
            row("none", 1.0, 0.90), {"settings": {}, "accuracy": 0.5}]  # a row without tau_content is left out
    curves = policy_curves(rows)
    assert set(curves) == {"dual + threshold", "none + threshold"}
    dual = curves["dual + threshold"]
    assert dual["tau_content"] == [2.0] and dual["accuracy"] == [80.0]
    assert dual["aup"] == pytest.approx(160.0)  # one point: no weight applies to the first term
    assert curves["none + threshold"]["aup"] == pytest.approx(90.0)
    two = policy_curves([row("dual", 1.0, 0.80), row("dual", 3.0, 0.78), row("none", 1.0, 0.90)])["dual + threshold"]
    assert two["aup"] == pytest.approx(aup([(1.0, 80.0), (3.0, 78.0)], y_max=90.0), abs=0.01)


def test_the_tune_charts_shaded_region_has_the_aup_as_its_area_where_weights_and_the_cut_apply():
    """The Tune tab shades the AUP (ui.tune.aup.aup_area): a rectangle, then trapezoids under the
    weighted accuracies of the counted points; a point past the cut adds nothing."""
    from ui.tune.aup import aup_area

    def row(cache, tau, acc):
        return {"settings": {"cache": cache, "unmask": "threshold"}, "tau_content": tau, "accuracy": acc}

    # none's best (90%) is y_max, so dual's points are weighted down; dual's 3.5 at 74% is cut (< 80 - 5).
    curves = policy_curves([row("dual", 1.0, 0.80), row("dual", 2.0, 0.78), row("dual", 3.5, 0.74),
                            row("none", 1.0, 0.90), row("none", 2.5, 0.86)])
    for curve in curves.values():
        xs, ys = aup_area(curve, y_max=90.0)
        shoelace = abs(sum(x0 * y1 - x1 * y0 for x0, y0, x1, y1 in zip(xs, ys, xs[1:] + xs[:1], ys[1:] + ys[:1]))) / 2
        assert shoelace == pytest.approx(curve["aup"], abs=0.01)
        assert max(xs) == curve["tau_content"][curve["counted"] - 1]  # the shading stops at the last counted point
    assert curves["dual + threshold"]["counted"] == 2
