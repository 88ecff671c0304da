"""The figures as a browser draws them: plotly.js lays out the labels and ticks, so whether a label
overlaps another, leaves the plot or is clipped can only be read from the drawn page."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dllm_local.analysis.reports import add_points  # noqa: E402
from ui import figures as run_figures
from ui.tune import figures as tune_figures  # noqa: E402

WIDTH = 1240  # a full-width plot on the page at 1280 × 720

# A sweep the tiny model measured (dual cache, arithmetic, n = 20, gen 64): twelve points, most of
# them crowded at the top left, as a default sweep's are.
MEASURED = [((0.5, 8), 0.90, 110.4), ((0.5, 16), 0.95, 290.9), ((0.5, 32), 0.90, 596.7), ((0.7, 8), 1.0, 131.9),
            ((0.7, 16), 0.95, 112.2), ((0.7, 32), 0.90, 230.2), ((0.8, 8), 1.0, 96.9), ((0.8, 16), 0.95, 231.6),
            ((0.8, 32), 0.95, 168.7), ((0.9, 8), 1.0, 163.3), ((0.9, 16), 0.95, 390.5), ((0.9, 32), 0.95, 554.8)]


def _row(threshold: float, block: int, accuracy: float, speed: float) -> dict:
    return {"point": {"threshold": threshold, "block_size": block}, "accuracy": accuracy, "model_tok_s": speed,
            "nfe": 4.0}


@pytest.fixture(scope="module")
def draw():
    """draw(fig) -> a page showing the figure alone, ``WIDTH`` wide."""
    from plotly.offline import get_plotlyjs
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": WIDTH + 40, "height": 720})
        page.set_content(f"<html><body><script>{get_plotlyjs()}</script><div id='fig'></div></body></html>")

        def show(fig):
            page.evaluate("([spec, width]) => Plotly.newPlot('fig', spec.data, {...spec.layout, width})",
                          [json.loads(fig.to_json()), WIDTH])
            return page

        yield show
        browser.close()


def _box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def _overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def _inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - slack and inner["y"] >= outer["y"] - slack
            and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + slack
            and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + slack)


def test_sweep_labels_do_not_overlap_and_an_added_result_is_not_cut_off(draw):
    # as the Tune tab holds them: its sweep's rows, then a report added to the chart
    sweep = {"problems": 20, "rows": [dict(_row(*knobs, a, x), pareto=False) for knobs, a, x in MEASURED]}
    # As accurate as the best in as few forwards: on the frontier (timing alone decides no point), so keyed.
    report = add_points(sweep, {"problems": 20, "rows": [_row(0.9, 32, 1.0, 620.0)]}, "lm-eval-tiny.json")
    fig = tune_figures.sweep_figure(report)
    page = draw(fig)
    plot = _box(page, ".nsewdrag")  # the plot area
    labels = [t.bounding_box() for t in page.locator(".annotation-text-g").all()]
    shown = [a.text for a in fig.layout.annotations]
    assert len(labels) == len(shown) == sum(r["pareto"] for r in report["rows"])  # the Pareto points are numbered
    assert any("lm-eval-tiny.json" in (d.name or "") for d in fig.data)  # the added result, keyed in the legend
    assert all(_inside(box, plot) for box in labels)
    assert not any(_overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1:])


def test_the_cache_panels_100_percent_label_is_drawn_whole_below_the_legend(draw):
    trace = json.loads((ROOT / "tests" / "data" / "trace_small.json").read_text())
    page = draw(run_figures.cache_panel(trace))
    top = next(t for t in page.locator(".y2tick text").all() if t.text_content() == "100%").bounding_box()
    assert _inside(top, _box(page, ".main-svg")) and not _overlap(top, _box(page, ".legend"))
    plot = _box(page, ".nsewdrag")
    assert plot["y"] <= top["y"] and top["y"] + top["height"] <= plot["y"] + plot["height"]  # level with the plot


def test_drawn_step_ticks_are_the_runs_steps(draw):
    trace = json.loads((ROOT / "tests" / "data" / "trace_small.json").read_text())
    steps = [str(i) for i in range(len(trace["steps"]))]  # no "-1", no step past the last
    for fig, ticks in ((run_figures.confidence_heatmap(trace), ".ytick text"), (run_figures.kv_heatmap(trace), ".ytick text"),
                       (run_figures.cache_panel(trace), ".xtick text")):
        page = draw(fig)
        drawn = [t.text_content().replace("−", "-") for t in page.locator(ticks).all()]  # plotly writes U+2212
        assert sorted(drawn, key=int) == steps
