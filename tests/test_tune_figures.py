"""The Tune tab's two charts on a sweep the tiny model runs: the frontier's numbers clear of every
marker, error bar, line and each other, keyed by their knobs; the AUP chart's area, unit and
formula, and every point of the sweep accounted for."""
from __future__ import annotations

import json
import re

import pytest

from dllm_local.analysis.reports import add_points
from dllm_local.experiments.sweep import run_sweep, sweep_job
from dllm_local.experiments.units import LocalRunner, Worker
from dllm_local.settings import Settings
from ui.tune import aup as tune_aup, figures
from ui.tune.labels import Canvas, crosses, overlaps, text_px


@pytest.fixture(scope="module")
def sweep(tiny) -> dict:
    """A Tune-tab sweep, small: the first preset's policies (dual + threshold), two thresholds ×
    three block sizes on three arithmetic problems."""
    base = Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold")
    job = sweep_job(base, {"threshold": [0.5, 0.9], "block_size": [8, 16, 32]}, "arithmetic", 3)
    return run_sweep(job, LocalRunner(Worker(job, tiny, None)))


@pytest.fixture(scope="module")
def reports(sweep) -> dict[str, dict]:
    """The sweep, and the sweep with itself added as a report: every point twice, on one spot."""
    return {"sweep": sweep, "twice": add_points(sweep, json.loads(json.dumps(sweep)), "again.json")}


def _label_boxes(fig, canvas: Canvas) -> list[tuple[str, tuple]]:
    """Each annotation's pixel box as its anchor, shift and font size put it."""
    boxes = []
    for a in fig.layout.annotations:
        text = re.sub("<[^>]+>", "", a.text)
        width, height = text_px(text, a.font.size)
        cx, cy = canvas.px(a.x, a.y)
        left = cx + a.xshift - {"left": 0, "center": width / 2, "right": width}[a.xanchor]
        bottom = cy + a.yshift - {"bottom": 0, "middle": height / 2, "top": height}[a.yanchor]
        boxes.append((text, (left, bottom, left + width, bottom + height)))
    return boxes


@pytest.mark.parametrize("which", ["sweep", "twice"])
def test_the_frontiers_numbers_cross_no_bar_line_marker_or_other_number(reports, which):
    fig = figures.sweep_figure(reports[which])
    canvas = Canvas(fig.layout.xaxis.range, fig.layout.yaxis.range)
    markers, bars = [], []
    for trace in fig.data:
        if trace.mode != "markers":
            continue
        for i, (x, y) in enumerate(zip(trace.x, trace.y)):
            markers.append(canvas.px(x, y))
            (px, top), (_, bottom) = canvas.px(x, y + trace.error_y.array[i]), canvas.px(x, y - trace.error_y.arrayminus[i])
            bars.append(((px, bottom), (px, top)))
    line = next(t for t in fig.data if t.name == "Pareto frontier")
    segments = [(canvas.px(*a), canvas.px(*b)) for a, b in zip(zip(line.x, line.y), zip(line.x[1:], line.y[1:]))]
    boxes = _label_boxes(fig, canvas)
    assert boxes
    for k, (text, box) in enumerate(boxes):
        assert not any(crosses(bar, box) for bar in bars), f"an error bar runs through label {text}"
        assert not any(crosses(s, box) for s in segments), f"the Pareto line runs through label {text}"
        assert not any(overlaps(box, (mx - 7, my - 7, mx + 7, my + 7)) for mx, my in markers), f"label {text} under a point"
        assert not any(overlaps(box, other) for _, other in boxes[k + 1:]), f"label {text} on another label"
        assert canvas.inside(box)


def test_every_pareto_point_is_numbered_on_the_chart_in_the_key_and_in_the_table(reports):
    report = reports["twice"]
    rows = report["rows"]
    front = sorted((i for i, r in enumerate(rows) if r["pareto"]), key=lambda i: rows[i]["model_tok_s"])
    fig = figures.sweep_figure(report)
    numbers = [re.sub("<[^>]+>", "", a.text) for a in fig.layout.annotations]
    assert numbers == [str(k) for k in range(1, len(front) + 1)]  # one number per red point, no knob text
    for k, i in enumerate(front, start=1):
        named = next(t for t in fig.data if t.name.startswith(f"{k}  "))
        assert figures.row_label(rows[i]) in named.name  # the key: the number and the knobs
        assert (named.x[0], named.y[0]) == (rows[i]["model_tok_s"], rows[i]["accuracy"])
        annotation = fig.layout.annotations[k - 1]
        assert (annotation.x, annotation.y) == (named.x[0], named.y[0])  # beside its own point
    table = figures.sweep_table(report)
    assert [row[-1] for row in table] == [front.index(i) + 1 if i in front else "" for i in range(len(rows))]
    beaten = next(t for t in fig.data if t.name and "beaten" in t.name)
    assert len(beaten.x) == len(rows) - len(front) and all(beaten.hovertext)  # the rest: grey, knobs on hover


def _shoelace(xs, ys) -> float:
    return abs(sum(x0 * y1 - x1 * y0 for x0, y0, x1, y1 in zip(xs, ys, xs[1:] + xs[:1], ys[1:] + ys[:1]))) / 2


@pytest.mark.parametrize("which", ["sweep", "twice"])
def test_the_aup_charts_shaded_area_is_the_aup_it_names_with_its_unit(reports, which):
    report = reports[which]
    fig = tune_aup.aup_figure(report)
    for policy, curve in report["policies"].items():
        area = next(t for t in fig.data if t.name == f"{policy}: AUP area")
        assert _shoelace(list(area.x), [100 * y for y in area.y]) == pytest.approx(curve["aup"], abs=0.01)
        named = next(t for t in fig.data if t.showlegend and t.legendgroup == policy)
        assert f"AUP {curve['aup']:.1f}" in named.name
        assert f"≈ {curve['aup'] / 100:.1f} tokens / forward at 100%" in named.name  # what the number means
    assert "% × content tokens per forward" in fig.layout.title.text  # its unit
    assert any("W(y) = min(e" in a.text and "ρ₁y₁" in a.text for a in fig.layout.annotations)  # its formula
    line = tune_aup.aup_line(report)
    assert "% × content tokens per forward" in line and "tokens / forward at 100%" in line


@pytest.mark.parametrize("which", ["sweep", "twice"])
def test_the_aup_chart_accounts_for_every_point_it_draws_and_leaves_out(reports, which):
    rows = reports[which]["rows"]
    fig = tune_aup.aup_figure(reports[which])
    note = fig.layout.title.subtitle.text
    counted = int(re.search(r"(\d+) of (\d+) settings make up", note).group(1))
    assert re.search(r"of (\d+) settings", note).group(1) == str(len(rows))
    beaten = re.search(r"(\d+) \(grey\) are beaten by a point", note)
    cut = re.search(r"(\d+) \(hollow\) are more than", note)
    said = counted + (int(beaten.group(1)) if beaten else 0) + (int(cut.group(1)) if cut else 0)
    assert said == len(rows)  # every setting is one of the kinds the note names
    grey = [t for t in fig.data if t.name and "beaten" in t.name]
    assert (len(grey[0].x) if grey else 0) == (int(beaten.group(1)) if beaten else 0)
    on_curves = sum(len(t.x) for t in fig.data if t.showlegend and t.mode == "lines+markers")
    assert on_curves == counted
    curves = reports[which]["policies"].values()
    twins = any(len(c["tau_content"]) > len(set(zip(c["tau_content"], c["accuracy"]))) for c in curves)
    assert ("on the same spot as another: hover" in note) == twins  # one dot for two settings is said


def test_tied_points_share_the_frontier_and_the_legend_says_what_beats_a_grey_one():
    """Equal accuracy in equal forwards is a tie, whatever the clock said: both points red and
    numbered; a grey point is one another matches or betters on accuracy in fewer forwards, and the
    title and legend say so rather than "beaten on both"."""
    point = {"accuracy": 0.6, "nfe": 12.0, "tau_content": 2.5, "n": 5}
    rows = [{**point, "point": {"threshold": 0.9}, "model_tok_s": 101.0},
            {**point, "point": {"threshold": 0.95}, "model_tok_s": 97.0},
            {**point, "point": {"threshold": 0.5}, "accuracy": 0.4, "nfe": 14.0, "model_tok_s": 90.0}]
    report = add_points({"problems": 5}, {"rows": rows, "problems": 5}, "tied.json")
    assert [r["pareto"] for r in report["rows"]] == [True, True, False]
    fig = figures.sweep_figure(report)
    assert [re.sub("<[^>]+>", "", a.text) for a in fig.layout.annotations] == ["1", "2"]
    beaten = next(t for t in fig.data if t.name and "beaten" in t.name)
    words = f"{fig.layout.title.text} {beaten.name}"
    assert "on both" not in words and "forwards" in words, words
