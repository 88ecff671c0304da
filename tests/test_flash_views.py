"""The page's views of Flash-dLLM as released (cache ``flash``, unmasking ``flash_verify``) on a real
trace of the tiny model, the "Flash-dLLM as released" preset's run: the grid bars the sliding window
and ticks the accepted drafts, the cache panel maps the window and the tracked positions, the
verdict counts the accepted drafts; the what-if replay follows the window. Every figure is read back
from the trace by this file's own code."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import dllm_local
from dllm_local.settings import Settings
from ui.lessons import acceptance, verdicts
from ui.grid import tokens as grid, policy_marks
from ui.parts import replay
from ui import figures
from ui.parts.presets import load_presets
from ui.figures import tracked
from ui.parts.figure_style import LEGEND_ROW, legend_entries
from ui.run.views import draw

PRESET = load_presets()[0]["Flash-dLLM as released"]
BOX = re.compile(r'<span class="(dl-tok[^"]*)" title="pos (\d+) ')


@pytest.fixture(scope="module")
def trace(tiny) -> dict:
    run = dllm_local.generate(tiny, PRESET["prompt"], Settings.from_dict(PRESET["settings"]))
    return json.loads(json.dumps(run.trace.to_dict()))  # as the page holds it: plain JSON


@pytest.fixture(scope="module")
def other() -> dict:
    """A DualCache + threshold trace: no window, no tracked positions, no verify forward."""
    return json.loads((Path(__file__).parent / "data" / "trace_small.json").read_text())


def _boxes(html: str, css: str) -> list[int]:
    return sorted(int(p) for classes, p in BOX.findall(html) if css in classes.split())


def _cells(fig, name: str) -> list[list[int]]:
    """Per row (step) of the map's heatmap ``name``, the answer positions of its cells."""
    found = [t for t in fig.data if t.name == name]
    if not found:
        return []
    t = found[0]
    return [[int(x) for x, z in zip(t.x, row) if z == 1] for row in t.z]


def test_the_preset_run_slides_its_window_tracks_and_accepts(trace):
    """The run the views are checked on has what they show: a window across fixed blocks, tracked
    positions after step 0, and drafts the verify forward accepted."""
    steps, P = trace["steps"], len(trace["prompt_ids"])
    assert len(steps) > 1 and all(s["policy"]["window"] for s in steps)
    assert steps[0]["policy"]["tracked"] == [] and all(s["policy"]["tracked"] for s in steps[1:])
    block = PRESET["settings"]["block_size"]  # a window that is no fixed block: it straddles two
    assert any((min(s["policy"]["window"]) - P) // block != (max(s["policy"]["window"]) - P) // block for s in steps)
    assert sum(len(s["policy"]["accepted_at"]) for s in steps) > 0


def test_grid_bars_the_window_and_ticks_accepted_drafts_at_every_step(trace, other):
    P = len(trace["prompt_ids"])
    for shown, record in enumerate(trace["steps"]):
        html = grid.token_grid_html(trace, shown)
        window = sorted(p - P for p in record["policy"]["window"])
        assert _boxes(html, "dl-window") == window
        assert _boxes(html, "dl-accepted") == sorted(p - P for p, _, _ in record["policy"]["accepted_at"])
        assert f"the {len(window)} positions Flash-Cache scored this step" in html
        assert html.count("0 8px 0 -1px " + policy_marks.WINDOW_COLOUR) >= len(window) - 1  # a chip may hold several
        for p, _, q in record["policy"]["accepted_at"]:
            assert f"title=\"pos {p - P} · " in html and f"accepted by the verify forward (P(draft | masked) {q:.2f})" in html
    plain = grid.token_grid_html(other, len(other["steps"]) - 1)
    assert "dl-window" not in plain and "sliding window" not in plain and "dl-tail" not in plain


def test_grid_folds_the_masked_tail_after_the_end_of_text_into_one_chip(trace):
    last = len(trace["steps"]) - 1
    state = replay.state_at(trace, last)
    end = replay.first_end(trace, state["ids"])
    assert end is not None
    start = max(p for p, t in enumerate(state["ids"]) if t is not None) + 1
    n = trace["gen_length"]
    html = grid.token_grid_html(trace, last)
    assert f"× {n - start} masked after the end of text (pos {start}–{n - 1})" in html
    # Every masked box after the end is inside that chip, none before it.
    chip = html[html.index("dl-tail"):]
    assert all(f'title="pos {p} · masked' in chip for p in range(start, n))


def test_cache_panel_maps_window_tracked_next_masks_and_reads(trace, other):
    P, n = len(trace["prompt_ids"]), trace["gen_length"]
    steps = trace["steps"]
    for upto in range(len(steps)):
        fig = figures.cache_panel(trace, upto)
        # The map's height, and a line for each legend entry below it.
        assert fig.layout.height == tracked.HEIGHT + legend_entries(fig) * LEGEND_ROW
        window, kept = _cells(fig, "window"), _cells(fig, "tracked")
        assert len(window) == upto + 1
        for row, record in enumerate(steps[: upto + 1]):
            assert window[row] == sorted(p - P for p in record["policy"]["window"])
            assert (kept[row] if kept else []) == sorted(p - P for p in record["policy"]["tracked"])
    fig = figures.cache_panel(trace)
    reads = _cells(fig, "read from cache")
    masks = _cells(fig, next(name for name, _, _ in tracked.KINDS if name.startswith("next masks")))
    for row, record in enumerate(steps):
        recomputed = {p - P for p in record["recomputed"]}
        marked = {p - P for p in record["policy"]["window"] + record["policy"]["tracked"]}
        assert (reads[row] if reads else []) == sorted(set(range(-P, n)) - recomputed - marked)
        assert masks[row] == sorted(recomputed - marked)
    assert any(reads), "positions past the next masks are read from the cache"
    # Each kind is a legend entry (a line each at the figure's foot, never cut by a narrow panel).
    assert {t.name for t in fig.data if t.type == "heatmap" and t.showlegend} == {name for name, _, _ in tracked.KINDS}
    assert not any(t.type == "heatmap" for t in figures.cache_panel(other).data)


def test_a_summary_trace_maps_window_and_tracked_and_says_the_rest_needs_a_full_trace(trace):
    summary = json.loads(json.dumps(trace))
    for s in summary["steps"]:
        s["recomputed"] = None
    fig = figures.cache_panel(summary)
    assert {t.name for t in fig.data if t.type == "heatmap"} == {"window", "tracked"}
    assert any("a full trace lists the rest" in a.text for a in fig.layout.annotations)


def test_acceptance_verdict_counts_accepted_drafts_and_verify_forwards(trace, other):
    steps = trace["steps"]
    accepted = {i: len(s["policy"]["accepted_at"]) for i, s in enumerate(steps) if s["policy"]["accepted_at"]}
    forwards = sum(s["forwards"] - 1 for s in steps)  # a verify forward is a step's second
    checked = sum(s["policy"]["verify_candidates"] for s in steps)
    verdict = acceptance.acceptance_verdict(trace)
    assert verdict.status == verdicts.HOLDS
    assert verdict.numbers == {"accepted": sum(accepted.values()), "checked": checked, "verify_forwards": forwards,
                               "accepted_at_steps": accepted}
    total = sum(accepted.values())
    assert verdict.detail.startswith(f"{total} draft{'s' if total > 1 else ''} accepted over {forwards} verify forward")
    assert ", ".join(f"{a} at step {i}" for i, a in accepted.items()) in verdict.detail
    shown = draw(trace, None, "step", "3", "v", "drift", with_plots=False)["grid_verdicts"]
    assert 'data-lesson="acceptance"' in shown and verdict.detail in shown
    first = min(accepted)  # up to a step, only the steps so far count
    assert acceptance.acceptance_verdict(trace, first).numbers["accepted"] == accepted[first]
    assert acceptance.acceptance_verdict(other) is None
    assert 'data-lesson="acceptance"' not in draw(other, None, "step", "3", "v", "drift", with_plots=False)["grid_verdicts"]


def _verify_trace(per_step: list[tuple[int, int]]) -> dict:
    steps = [{"committed": [], "forwards": 2 if c else 1, "policy": {"verify_candidates": c, "verify_accepted": a,
                                                                      "accepted_at": [[0, 0, 0.9]] * a}}
             for a, c in per_step]
    return {"prompt_ids": [], "gen_length": 8, "steps": steps, "settings": {"unmask": "flash_verify"}}


def test_acceptance_verdict_summarises_many_steps_and_says_when_nothing_was_accepted_or_checked():
    many = acceptance.acceptance_verdict(_verify_trace([(1, 2), (3, 4), (0, 1), (3, 3), (1, 1), (2, 2), (0, 0)]))
    assert many.status == verdicts.HOLDS
    assert many.detail == ("10 drafts accepted over 6 verify forwards (13 checked), at 5 steps; "
                           "most at steps 1 (3), 3 (3), 5 (2)")
    few = acceptance.acceptance_verdict(_verify_trace([(0, 2), (2, 3)]))
    assert few.detail == "2 drafts accepted over 2 verify forwards (5 checked): 2 at step 1"
    none = acceptance.acceptance_verdict(_verify_trace([(0, 2), (0, 1)]))
    assert none.status == verdicts.FAILS and none.detail.startswith("0 drafts accepted over 2 verify forwards")
    idle = acceptance.acceptance_verdict(_verify_trace([(0, 0)]))
    assert idle.status == verdicts.UNMEASURABLE and "no verify forward up to step 0" in idle.detail


def test_what_if_replays_the_threshold_over_the_window(trace):
    """At the run's own threshold, the replay commits what the threshold committed: every window
    position at or above it, the verify forward's accepted drafts apart; it diverges at the first
    step where drafts were accepted."""
    P, tau = len(trace["prompt_ids"]), PRESET["settings"]["unmask_params"]["threshold"]
    result = replay.what_if(trace, tau)
    first = next(i for i, s in enumerate(trace["steps"]) if s["policy"]["accepted_at"])
    assert result["diverges_at"] == first and len(result["commits"]) == first + 1
    for i, commits in enumerate(result["commits"]):
        record = trace["steps"][i]
        by_threshold = {p - P for p, _, _ in record["committed"]} - {p - P for p, _, _ in record["policy"]["accepted_at"]}
        assert set(commits) == by_threshold
        assert set(commits) <= {p - P for p in record["policy"]["window"]}
