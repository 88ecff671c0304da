"""The Run tab's heatmaps of real tiny-model runs with the presets' settings: the KV colour bar
spends itself on cosines near 1 and white cells are named where they occur; marks of different
kinds never share a place and dense ones stay apart; the empty KV figure claims no layer; the
confidence plot says what a row is in forwards."""
from __future__ import annotations

import numpy as np
import pytest

from preset_runs import preset_trace
from ui.parts import replay
from ui import figures
from ui.figures import axes
from ui.figures.cosine_scale import COS_SCALE, NINES, nines


def _named(fig, name):
    return next(t for t in fig.data if t.name == name)


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[k:k + 2], 16) for k in (1, 3, 5)], dtype=float)


def _colour(scale, t: float) -> np.ndarray:
    """The colour a plotly colour scale gives at ``t`` in [0, 1]."""
    for (a, ca), (b, cb) in zip(scale, scale[1:]):
        if a <= t <= b:
            f = 0.0 if b == a else (t - a) / (b - a)
            return _rgb(ca) + (_rgb(cb) - _rgb(ca)) * f
    raise ValueError(t)


def test_the_kv_colour_bar_spends_itself_on_cosines_near_one_and_agrees_with_the_cells():
    fig = figures.kv_heatmap(preset_trace("several steps"), which="v")
    heat, bar = _named(fig, "drift"), next(t for t in fig.data if t.type == "scatter" and t.marker.showscale)
    assert not heat.showscale and (heat.zmin, heat.zmax) == (0.0, 1.0)  # the cells keep the cosine itself
    low, high = bar.marker.cmin, bar.marker.cmax
    place = dict(zip(bar.marker.colorbar.ticktext, bar.marker.colorbar.tickvals))
    assert {"0.9", "0.99", "0.999"} <= set(place)
    # 0.9 to 1 takes most of the bar (it took a tenth), each nine as much as 0 to 0.9
    assert (high - place["0.9"]) / (high - low) >= 0.7
    assert place["0.99"] - place["0.9"] == pytest.approx(place["0.9"] - low)
    # a cell's colour is the bar's colour at its cosine
    for cosine in (0.3, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 1.0):
        cell = _colour(COS_SCALE, cosine)
        on_bar = _colour(bar.marker.colorscale, (nines(cosine) - low) / (high - low))
        assert np.abs(cell - on_bar).max() <= 12, cosine
    # the cosines that matter are told apart: 0.99, 0.999 and 0.9999 are different colours
    steps = [_colour(COS_SCALE, c) for c in (0.99, 0.999, 1 - 10 ** -NINES)]
    assert min(np.abs(a - b).sum() for a, b in zip(steps, steps[1:])) > 100


def test_white_cells_are_named_where_they_occur():
    adaptive = figures.kv_heatmap(preset_trace("adaptive"), which="v")
    layers = [np.asarray(t.z, dtype=float) for t in adaptive.data if t.type == "heatmap"]
    white = np.logical_and.reduce([np.isnan(z) for z in layers])
    assert white[1:].sum() > 0, "the budget's evictions leave cells white after the first forward"
    legend = [t.name for t in adaptive.data if t.name and t.name.startswith("white:")]
    assert len(legend) == 1 and "evicted" in legend[0]
    assert "evicted" in figures.CAPTIONS["kv"] and "White cells" in figures.CAPTIONS["kv"]
    # no white cell, no legend entry: cache vs exact on DualCache compares every cell
    lesson = figures.kv_heatmap(preset_trace("several steps", exact_drift=True), which="v", view="cache_error")
    lesson_layers = [np.asarray(t.z, dtype=float) for t in lesson.data if t.type == "heatmap"]
    assert not np.logical_and.reduce([np.isnan(z) for z in lesson_layers]).any()
    assert not any(t.name and t.name.startswith("white:") for t in lesson.data)


def _beside_the_grid(fig, name: str) -> None:
    """A per-step mark lies in a column of its own, left of the grid's cells and apart from them."""
    marks = _named(fig, name)
    column = getattr(fig.layout, "xaxis" + marks.xaxis[1:])
    assert marks.xaxis != "x" and column.domain[1] < fig.layout.xaxis.domain[0]
    assert fig.layout.xaxis.range[0] == -0.5  # the grid's axis holds the cells only


@pytest.mark.parametrize("word", ("self-verifying", "several steps", "paper default"))
def test_marks_of_different_kinds_never_share_a_place_and_dense_ones_stay_apart(word):
    trace = preset_trace(word)
    n, rows = replay.answer_length(trace), len(trace["steps"])
    fig = figures.confidence_heatmap(trace)
    for verdict in ("guaranteed", "no guarantee"):
        if any(t.name == f"Theorem 1: {verdict}" for t in fig.data):
            _beside_the_grid(fig, f"Theorem 1: {verdict}")
            size = _named(fig, f"Theorem 1: {verdict}").marker.size
            assert size <= 0.8 * axes.PLOT_ROWS_HEIGHT / rows  # 32 rows: 32 dots, not a bar
    dots = _named(fig, "Theorem 1: guaranteed") if any(t.name == "Theorem 1: guaranteed" for t in fig.data) else None
    if dots is not None:
        assert dots.marker.line.color == "white"  # outlined: touching dots stay apart
    cell = min(axes.PLOT_ROWS_HEIGHT / rows, axes.PLOT_WIDTH * (1 - axes.MARK_COLUMN) / n)
    assert _named(fig, "commit").marker.size <= max(3, cell)
    kv = figures.kv_heatmap(trace)
    if list(_named(kv, "refresh").y):
        _beside_the_grid(kv, "refresh")
    # the step axis is drawn at the figure's edge, outside the column of marks
    assert fig.layout.yaxis.anchor == "free" and fig.layout.yaxis.position == 0


def test_the_empty_kv_figure_claims_no_layer():
    for layer in ("mean", 3):
        title = figures.kv_heatmap({}, layer=layer, which="v").layout.title.text
        assert "layer" not in title and title.endswith("· V"), title
    # with steps the title names the layer shown
    trace = preset_trace("several steps")
    assert "layer 3" in figures.kv_heatmap(trace, layer=3, which="v").layout.title.text


@pytest.mark.parametrize("word, forwards", (("self-verifying", "1–2 forwards"), ("paper default", "1 forward each")))
def test_the_confidence_plot_says_what_a_row_is(word, forwards):
    trace = preset_trace(word)
    fig = figures.confidence_heatmap(trace)
    ran = [s["forwards"] + s.get("guider_forwards", 0) for s in trace["steps"]]
    assert len(_named(fig, "confidence").z) == len(trace["steps"])  # a row per step, whatever its forwards
    assert fig.layout.yaxis.title.text.startswith("step") and forwards in fig.layout.yaxis.title.text
    assert (max(ran) > 1) == ("–" in fig.layout.yaxis.title.text)
    caption = figures.CAPTIONS["confidence"]
    assert "one step, not one forward" in caption and "each row is one forward" not in caption.lower()
