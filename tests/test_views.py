"""The replay, the token grid and the figures against a real recorded trace (tiny model, dual cache, threshold unmasking, full level)."""
from __future__ import annotations

import copy
import html
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dllm_local.trace import KV_VIEWS  # noqa: E402
from ui.grid import tokens as grid
from ui.parts import replay
from ui import figures as run_figures
from ui.parts import tables
from ui.tune import figures as tune_figures  # noqa: E402

TRACE_PATH = ROOT / "tests" / "data" / "trace_small.json"


@pytest.fixture(scope="module")
def trace() -> dict:
    return json.loads(TRACE_PATH.read_text())


def _nan(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def _trace_named(fig, name):
    return next(d for d in fig.data if d.name == name)


def _annotations(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def _summary_level(trace: dict) -> dict:
    """The same run as a "summary" trace: no recomputed positions, KV reduced to mean/min."""
    t = copy.deepcopy(trace)
    for s in t["steps"]:
        s["recomputed"] = None
        s["kv"] = {layer: {"k_mean": 0.99, "k_min": 0.5, "v_mean": 0.99, "v_min": 0.5} for layer in s["kv"]}
    t["settings"]["trace"] = "summary"
    return t


# ----------------------------------------------------------------------------- state

def test_state_before_and_after(trace):
    n = trace["gen_length"]
    before = replay.state_at(trace, -1)
    assert before["ids"] == [None] * n and before["masked"] == n and before["step"] == -1
    last = len(trace["steps"]) - 1
    after = replay.state_at(trace, last)
    assert after["ids"] == trace["final_ids"] and after["masked"] == 0
    assert replay.state_at(trace, last + 50)["step"] == last  # clamped


def test_state_records_commit_step_and_confidence(trace):
    P = len(trace["prompt_ids"])
    state = replay.state_at(trace, 0)
    first = trace["steps"][0]["committed"]
    assert len(first) == trace["gen_length"] - state["masked"]
    for position, token, conf in first:
        p = position - P
        assert state["ids"][p] == token and state["commit_step"][p] == 0 and state["confidence"][p] == conf
    # A position committed at step 1 is still masked after step 0.
    p1 = trace["steps"][1]["committed"][0][0] - P
    assert state["ids"][p1] is None and replay.state_at(trace, 1)["commit_step"][p1] == 1


# ----------------------------------------------------------------------------- token grid

def test_token_grid_hover_escape_and_outline(trace):
    P = len(trace["prompt_ids"])
    page = grid.token_grid_html(trace, 2)
    position, token, conf = trace["steps"][1]["committed"][1]  # " The" at step 1
    text = trace["vocab"][str(token)].replace(" ", "␣")
    assert f"title=\"pos {position - P} · token '{text}' · step 1 · confidence {conf:.2f}\"" in page
    # <|endoftext|> committed at step 0: drawn as the end marker, faded, never as its raw text.
    assert grid.token_label(trace, trace["model"]["stop_ids"][0]) in page and "<|endoftext|>" not in page and "&lt;|endoftext|&gt;" not in page
    assert "dl-end" in page
    assert page.count("dl-new") == len(trace["steps"][2]["committed"])
    masked = replay.state_at(trace, 2)["masked"]
    assert page.count("dl-masked") == masked and page.count("▢") == masked
    assert "dl-legend" in page


def test_token_grid_by_confidence_and_bad_mode(trace):
    page = grid.token_grid_html(trace, len(trace["steps"]) - 1, color_by="confidence")
    assert "dl-masked" not in page and "confidence at commit" in page
    assert "dl-masked" in grid.token_grid_html(trace, -1)
    with pytest.raises(ValueError):
        grid.token_grid_html(trace, 0, color_by="colour")


def test_token_grid_numbers_positions_collapses_padding_and_marks_tokens_after_the_end(trace):
    last = len(trace["steps"]) - 1
    n, stop = trace["gen_length"], set(trace["model"]["stop_ids"])
    page = grid.token_grid_html(trace, last)
    numbers = re.findall(r'class="dl-pos"[^>]*>(\d+)<', page)
    assert numbers == [str(p) for p in range(n)]  # every position, in order, padding included
    final = trace["final_ids"]
    first_end = next(p for p, t in enumerate(final) if t in stop)
    # the ends fold into chips (this step's commits apart from earlier ones); a run of this step's
    # commits too short to fold stays boxes: chips and boxes together hold every end
    folded = [int(k) for k in re.findall(r"× (\d+) end of text", page)]
    unfolded = re.sub(r"<details.*?</details>", "", page, flags=re.S).count(" dl-end")
    assert 1 <= page.count("dl-pad-chip") == len(folded) <= 2 and sum(folded) + unfolded == n - first_end
    assert "dl-after-end" not in page
    # A content token committed after the first end of text is marked, and the padding run after it
    # is what collapses.
    stray = copy.deepcopy(trace)
    token = final[first_end - 2]
    for record in stray["steps"]:
        record["committed"] = [[pos, token if pos - len(trace["prompt_ids"]) == first_end + 3 else tok, c]
                               for pos, tok, c in record["committed"]]
    page = grid.token_grid_html(stray, last)
    assert page.count("dl-after-end") == 1 and "committed after the end of text" in page
    spans = [(int(a), int(b)) for a, b in re.findall(r'data-from="(\d+)" data-to="(\d+)"', page)]
    assert spans and all(a > first_end + 3 for a, _ in spans) and max(b for _, b in spans) == n - 1
    # Before the run ends nothing is collapsed: the masked tail stays position by position.
    assert "dl-pad-chip" not in grid.token_grid_html(trace, -1)


# ----------------------------------------------------------------------------- confidence

def test_confidence_heatmap_cells_and_commits(trace):
    P, n, steps = len(trace["prompt_ids"]), trace["gen_length"], trace["steps"]
    fig = run_figures.confidence_heatmap(trace)
    z = _trace_named(fig, "confidence").z
    assert (len(z), len(z[0])) == (len(steps), n)
    s1 = steps[1]
    for position, conf in zip(s1["masked_positions"], s1["masked_confidence"]):
        assert z[1][position - P] == conf
    for i, s in enumerate(steps):
        for position, _, _ in s["committed"]:
            assert all(_nan(z[j][position - P]) for j in range(i + 1, len(steps)))
    marks = _trace_named(fig, "commit")
    assert len(marks.x) == sum(len(s["committed"]) for s in steps)
    position, _, _ = steps[2]["committed"][0]
    assert (position - P, 2) in set(zip(marks.x, marks.y))
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    heat = _trace_named(fig, "confidence")
    assert (heat.zmin, heat.zmax) == (0, 1)
    json.loads(fig.to_json())


def test_confidence_heatmap_upto_step(trace):
    fig = run_figures.confidence_heatmap(trace, upto_step=3)
    assert len(_trace_named(fig, "confidence").z) == 4
    assert len(_trace_named(fig, "commit").x) == sum(len(s["committed"]) for s in trace["steps"][:4])


def test_theorem1_marks_each_step(trace):
    full_pair = replay.theorem1({"committed": [[40, 7, 0.4], [41, 9, 0.6]]})
    assert full_pair["verdict"] == "no guarantee" and full_pair["epsilon"] == pytest.approx(0.6)
    assert full_pair["bound"] == pytest.approx(1.8) and "1.80 > 1" in full_pair["text"]
    sure = replay.theorem1({"committed": [[40, 7, 0.95], [41, 9, 0.99], [42, 1, 0.9]]})
    assert sure["verdict"] == "guaranteed" and sure["bound"] == pytest.approx(0.4)
    edge = replay.theorem1({"committed": [[40, 7, 0.75], [41, 9, 0.8], [42, 1, 0.9]]})  # (3 + 1) x 0.25 = 1
    assert edge["verdict"] == "guaranteed"
    assert replay.theorem1({"committed": [[40, 7, 0.2]]})["verdict"] == "serial"
    fig = run_figures.confidence_heatmap(trace)
    marked = [*_trace_named(fig, "Theorem 1: guaranteed").y, *_trace_named(fig, "Theorem 1: no guarantee").y]
    assert sorted(marked) == [i for i, s in enumerate(trace["steps"]) if len(s["committed"]) > 1]
    i = next(i for i, s in enumerate(trace["steps"]) if len(s["committed"]) > 1)
    page = grid.token_grid_html(trace, i)
    assert f'data-verdict="{replay.theorem1(trace["steps"][i])["verdict"]}"' in page and f"Step {i}: Theorem 1" in page


def test_what_if_threshold_replays_the_stored_confidences(trace):
    P, steps = len(trace["prompt_ids"]), trace["steps"]
    actual = [sorted(p - P for p, _, _ in s["committed"]) for s in steps]
    # The run's own threshold (0.7) reproduces every step's commits: the replay never diverges.
    same = replay.what_if(trace, trace["settings"]["unmask_params"]["threshold"])
    assert same["diverges_at"] is None and same["commits"] == actual
    # A stricter τ′ commits a subset at the first step, and the replay stops there.
    strict = replay.what_if(trace, 0.8)
    first = steps[0]
    scored = dict(zip(first["masked_positions"], first["masked_confidence"]))
    assert strict["diverges_at"] == 0 and strict["commits"] == [sorted(p - P for p, c in scored.items()
                                                                       if c >= 0.8 and p - P < 16)]
    # Equal commits up to the divergence step, which is the first where the sets differ.
    later = replay.what_if(trace, 0.72)
    d = later["diverges_at"]
    assert d == 1 and later["commits"][:d] == actual[:d] and later["commits"][d] != actual[d]
    # The grid frames what τ′ would commit and says where it diverges.
    page = grid.token_grid_html(trace, 1, what_if_threshold=0.72)
    assert page.count("dl-whatif-box") == len(later["commits"][1]) and "diverges here" in page
    assert "dl-whatif-box" not in grid.token_grid_html(trace, 1)
    assert "diverged at step 1" in grid.token_grid_html(trace, 3, what_if_threshold=0.72)
    sampled = copy.deepcopy(trace)
    sampled["settings"]["temperature"] = 1.0
    assert "greedy" in replay.what_if(sampled, 0.5)["reason"]


# ----------------------------------------------------------------------------- KV

def test_kv_drift_cached_vs_recomputed(trace):
    P, n, steps = len(trace["prompt_ids"]), trace["gen_length"], trace["steps"]
    fig = run_figures.kv_heatmap(trace, layer=0, which="k")
    drift, cached = _trace_named(fig, "drift").z, _trace_named(fig, "cached").z
    assert (len(drift), len(drift[0])) == (len(cached), len(cached[0])) == (len(steps), n)
    i = next(i for i, s in enumerate(steps) if not s["full_refresh"])
    recomputed = steps[i]["recomputed"]
    reused = next(p for p in range(n) if P + p not in recomputed)
    assert cached[i][reused] == 1.0 and _nan(drift[i][reused])
    # Each recomputed cell holds its cosine in one layer: the drift, or the commit's own change.
    commit = _trace_named(fig, "commit: mask → token").z
    for j, position in enumerate(recomputed):
        p = position - P
        shown = [z[i][p] for z in (drift, commit) if not _nan(z[i][p])]
        assert shown == [np.float32(steps[i]["kv"]["0"]["k"][j])] and _nan(cached[i][p])
    # A full refresh recomputes everything: nothing in the cached layer on that row.
    r = next(i for i, s in enumerate(steps) if s["full_refresh"])
    assert all(_nan(v) for v in cached[r])
    json.loads(fig.to_json())


def test_kv_views_share_one_fixed_scale_mean_layers_and_mark_commits(trace):
    steps = trace["steps"]
    for view in KV_VIEWS:
        for layer in ("mean", 0, 3):
            heat = _trace_named(run_figures.kv_heatmap(trace, layer=layer, which="v", view=view), view)
            bar = next(t for t in run_figures.kv_heatmap(trace, layer=layer, which="v", view=view).data
                       if t.type == "scatter" and t.marker.showscale)
            assert (heat.zmin, heat.zmax) == (0.0, 1.0) and "0.99" in bar.marker.colorbar.ticktext
    # "mean": the mean over every layer's cosine, cell by cell.
    mean = _trace_named(run_figures.kv_heatmap(trace, layer="mean", which="k"), "drift").z
    layers = [_trace_named(run_figures.kv_heatmap(trace, layer=l, which="k"), "drift").z for l in steps[1]["kv"]]
    np.testing.assert_allclose(mean[1][3], np.mean([z[1][3] for z in layers]), rtol=1e-5)
    assert "all layers (mean)" in run_figures.kv_heatmap(trace).layout.title.text
    # The staircase sits under each position's commit step.
    line = _trace_named(run_figures.kv_heatmap(trace, layer=2), "committed below")
    commit = replay.state_at(trace, len(steps) - 1)["commit_step"]
    assert list(line.y[::2]) == [c + 0.5 for c in commit]
    one = copy.deepcopy(trace)
    one["steps"] = one["steps"][:1]
    assert any("one step only" in a for a in _annotations(run_figures.kv_heatmap(one, layer=0)))


def test_kv_step_without_drift_record(trace):
    # A first forward into an empty cache may record kv == {}: its recomputed cells are not "cached".
    t = copy.deepcopy(trace)
    t["steps"][0]["kv"] = {}
    fig = run_figures.kv_heatmap(t)
    assert all(_nan(v) for v in _trace_named(fig, "cached").z[0])
    assert all(_nan(v) for v in _trace_named(fig, "drift").z[0])


def test_kv_refresh_rows_marked_and_upto(trace):
    steps = trace["steps"]
    fig = run_figures.kv_heatmap(trace, layer="2", which="v")
    assert list(_trace_named(fig, "refresh").y) == [i for i, s in enumerate(steps) if s["full_refresh"]]
    short = run_figures.kv_heatmap(trace, upto_step=3)
    assert len(_trace_named(short, "drift").z) == 4
    assert list(_trace_named(short, "refresh").y) == [0]


def test_kv_exact_views(trace):
    P, n, steps = len(trace["prompt_ids"]), trace["gen_length"], trace["steps"]
    fig = run_figures.kv_heatmap(trace, layer=0, view="true_drift")
    # the commit's own change is a layer of its own; together they are the trace's row
    true = np.fmax(_trace_named(fig, "true_drift").z, _trace_named(fig, "commit: mask → token").z).tolist()
    assert all(_nan(v) for v in true[0])  # no previous exact K at the first step
    # the figure holds float32 grids
    np.testing.assert_allclose(true[1], np.array(steps[1]["exact"]["true_drift"]["0"]["k"][P:P + n], float), rtol=1e-6)
    err = _trace_named(run_figures.kv_heatmap(trace, layer=1, which="v", view="cache_error"), "cache_error").z.tolist()
    np.testing.assert_allclose(err[5], np.array(steps[5]["exact"]["cache_vs_exact"]["1"]["v"][P:P + n], float), rtol=1e-6)
    no_exact = copy.deepcopy(trace)
    for s in no_exact["steps"]:
        s["exact"] = None
    assert any("exact" in a for a in _annotations(run_figures.kv_heatmap(no_exact, view="true_drift")))
    with pytest.raises(ValueError):
        run_figures.kv_heatmap(trace, view="nope")
    with pytest.raises(ValueError):
        run_figures.kv_heatmap(trace, which="q")


def test_summary_level_trace(trace):
    t = _summary_level(trace)
    fig = run_figures.kv_heatmap(t)
    assert run_figures.SUMMARY_MESSAGE in _annotations(fig)
    assert "per-position KV data needs trace level 'full'" in _annotations(fig)
    json.loads(fig.to_json())
    # Everything that does not need per-position KV still works.
    assert len(_trace_named(run_figures.confidence_heatmap(t), "commit").x) == len(trace["final_ids"])
    run_figures.cache_panel(t).to_json()
    grid.token_grid_html(t, 3)


# ----------------------------------------------------------------------------- real runs of the tiny model

POKER = "Kate is playing cards. Name a poker hand Kate could hold."
SHELLS = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"


def _run(tiny, prompt: str, **settings) -> dict:
    import dllm_local
    from dllm_local.settings import Settings

    return dllm_local.generate(tiny, prompt, Settings(trace="full", **settings)).trace.to_dict()


@pytest.fixture(scope="module")
def drift_run(tiny) -> dict:
    """Elastic-Cache's drift-triggered refresh, one token per step: a probe at every step inside a block."""
    return _run(tiny, SHELLS, gen_length=64, block_size=16, cache="drift_refresh",
                cache_params={"gamma": 0.99, "top_k": 8}, unmask="fixed")


@pytest.fixture(scope="module")
def revise_run(tiny) -> dict:
    """WINO-style revise on the poker prompt: short (a few steps), two blocks, tokens taken back."""
    return _run(tiny, POKER, gen_length=64, block_size=32, cache="dual", unmask="revise",
                unmask_params={"draft_threshold": 0.3, "verify_threshold": 0.9, "max_revisions": 1})


def _step_axes(fig) -> list:
    """The figure's step axis: y for the heatmaps, x for the cache panel."""
    return fig.layout.yaxis if fig.layout.yaxis.title.text.startswith("step") else fig.layout.xaxis


def test_every_step_axis_runs_from_0_to_the_last_step_live_and_final(trace, drift_run, revise_run):
    for run in (trace, drift_run, revise_run):
        total = len(run["steps"])
        for upto in (0, 3, 15, None):  # mid-run (live) redraws and the final one
            shown = total if upto is None else min(upto + 1, total)
            for fig in (run_figures.confidence_heatmap(run, upto), run_figures.kv_heatmap(run, upto_step=upto),
                        run_figures.cache_panel(run, upto)):
                if not fig.layout.annotations:  # e.g. "one step only" for the KV panel
                    axis = _step_axes(fig)
                    assert axis.title.text.startswith("step") and axis.autorange is False
                    assert sorted(axis.range) == [-0.5, shown - 0.5]  # the cells, half a step either side
                    assert axis.tickvals[0] == 0 and axis.tickvals[-1] <= shown - 1
                    if shown <= 24:
                        assert list(axis.tickvals) == list(range(shown))
    assert run_figures.axis_ticks(64) == [0, 10, 20, 30, 40, 50, 60]
    # The answer-position axes start at 0 too, though markers sit left of position 0.
    assert run_figures.confidence_heatmap(trace).layout.xaxis.tickvals[0] == 0


def test_cache_bars_are_one_step_wide_on_a_short_run(revise_run):
    fig = run_figures.cache_panel(revise_run)
    full = _trace_named(fig, "G, full refresh")
    assert len(full.x) >= 2 and min(np.diff(full.x)) > 1  # refreshes steps apart: what widened the bars
    assert all(bar.width == 0.8 for bar in fig.data if bar.type == "bar")
    assert list(fig.layout.xaxis.range) == [-0.5, len(revise_run["steps"]) - 0.5]


def test_drift_probes_have_a_column_of_their_own_on_the_step_axis(drift_run, revise_run):
    fig = run_figures.kv_heatmap(drift_run, layer=3)
    probe = _trace_named(fig, "attention drift probe")
    measured = [(i, s["policy"]["drift"]) for i, s in enumerate(drift_run["steps"]) if s["policy"]["drift"] is not None]
    assert probe.xaxis == "x2" and list(zip(probe.y, probe.x)) == measured  # x: the drift itself, per step
    grid_right, (column_left, _) = fig.layout.xaxis.domain[1], fig.layout.xaxis2.domain
    assert grid_right < column_left and fig.layout.xaxis2.anchor == "y"  # beside the grid, same steps
    gamma = drift_run["settings"]["cache_params"]["gamma"]
    assert list(_trace_named(fig, f"γ {gamma}").x) == [gamma, gamma]
    low, high = fig.layout.xaxis2.range
    assert low < min(gamma, *probe.x) and max(probe.x) < high
    assert len({round(x, 3) for x in probe.x}) > 5  # spread out, not one strip
    # A run without probes keeps the grid the whole width.
    plain = run_figures.kv_heatmap(revise_run).layout
    assert "xaxis2" not in plain and plain.xaxis.domain[1] == 1


def _first_recompute_after(steps: list[dict], P: int, p: int, step: int) -> int | None:
    return next((i for i in range(step + 1, len(steps)) if P + p in (steps[i]["recomputed"] or [])), None)


def test_drift_view_marks_the_commits_own_change_apart_from_later_drift(trace, revise_run):
    P, n, steps = len(trace["prompt_ids"]), trace["gen_length"], trace["steps"]
    fig = run_figures.kv_heatmap(trace, layer=3, which="v")
    commit, drift = _trace_named(fig, "commit: mask → token"), _trace_named(fig, "drift")
    marked = {(i, p) for i in range(len(steps)) for p in range(n) if not _nan(commit.z[i][p])}
    # Independently: a commit's change shows where the position is next recomputed, against the
    # K/V cached while it was still masked.
    expected = {(later, position - P) for c, s in enumerate(steps) for position, _, _ in s["committed"]
                if (later := _first_recompute_after(steps, P, position - P, c)) is not None}
    assert marked == expected and marked
    for i, p in marked:  # the trace's cosine, in the commit layer alone
        j = steps[i]["recomputed"].index(P + p)
        assert commit.z[i][p] == np.float32(steps[i]["kv"]["3"]["v"][j]) and _nan(drift.z[i][p])
    # every other recomputed cell is drift, unmarked
    others = [(i, position - P) for i, s in enumerate(steps) for position, cos in zip(s["recomputed"], s["kv"]["3"]["v"])
              if 0 <= position - P < n and (i, position - P) not in marked and cos is not None]
    assert others and all(not _nan(drift.z[i][p]) for i, p in others)
    assert "mask → token" in commit.hovertemplate and "not drift" in commit.hovertemplate
    # True drift compares consecutive exact forwards: the commit shows at the very next step.
    true = _trace_named(run_figures.kv_heatmap(trace, layer=3, view="true_drift"), "commit: mask → token")
    assert {(i, p) for i in range(len(steps)) for p in range(n) if not _nan(true.z[i][p])} == {
        (c + 1, position - P) for c, s in enumerate(steps[:-1]) for position, _, _ in s["committed"]}
    assert "commit: mask → token" not in {d.name for d in run_figures.kv_heatmap(trace, view="cache_error").data}
    # A token taken back (revise) changes the input too: its own layer, at its next recompute.
    revise, P = revise_run["steps"], len(revise_run["prompt_ids"])
    taken = {(later, pos - P) for r, s in enumerate(revise) for pos, *_ in s["revoked"]
             if (later := _first_recompute_after(revise, P, pos - P, r)) is not None}
    assert taken, "the revise run should take a token back"
    back = _trace_named(run_figures.kv_heatmap(revise_run, layer=3), "taken back: token → mask")
    assert {(i, p) for i in range(len(revise)) for p in range(len(back.z[0])) if not _nan(back.z[i][p])} == taken


def test_a_later_blocks_masked_position_shows_its_confidence_and_why_no_candidates(revise_run):
    P, block = len(revise_run["prompt_ids"]), revise_run["settings"]["block_size"]
    i, record = next((i, s) for i, s in enumerate(revise_run["steps"])
                     if any(pos - P >= block for pos in s["masked_positions"]))
    assert all(pos - P < block for pos, _ in record["top_candidates"])  # the trace: the current block's only
    titles = dict(re.findall(r'title="pos (\d+) · masked([^"]*)"', grid.token_grid_html(revise_run, i)))
    still_masked = {str(p) for p, t in enumerate(replay.state_at(revise_run, i)["ids"]) if t is None}
    assert set(titles) == still_masked and any(int(p) >= block for p in still_masked)
    for position, conf in zip(record["masked_positions"], record["masked_confidence"]):
        if str(position - P) not in still_masked:  # committed at this step: no longer a masked box
            continue
        p, title = position - P, html.unescape(titles[str(position - P)])
        if p < block:
            assert f"step {i}'s top candidates: " in title
        else:
            assert f"step {i}'s confidence {conf:.2f} (top-k is recorded for the current block only)" in title


def test_a_one_step_runs_legend_names_its_one_step(tiny, trace):
    one = _run(tiny, "Give two numbers whose sum is 9.", gen_length=8, block_size=8, unmask="threshold",
               unmask_params={"threshold": 0.01})
    assert len(one["steps"]) == 1
    legend = grid.token_grid_html(one, 0).split('class="dl-legend"')[1]
    assert "step 0" in legend and "→ step" not in legend
    assert "step 0 → step 8" in grid.token_grid_html(trace, 2)


# ----------------------------------------------------------------------------- cache, numbers

def test_cache_panel(trace):
    steps = trace["steps"]
    fig = run_figures.cache_panel(trace)
    full, partial = _trace_named(fig, "G, full refresh"), _trace_named(fig, "G, partial")
    assert list(full.x) == [i for i, s in enumerate(steps) if s["full_refresh"]]
    assert sorted([*full.x, *partial.x]) == list(range(len(steps)))
    assert dict(zip([*full.x, *partial.x], [*full.y, *partial.y])) == {i: s["g"] for i, s in enumerate(steps)}
    no_cache = copy.deepcopy(trace)
    no_cache["settings"]["cache"] = "none"
    assert any("no cache" in a for a in _annotations(run_figures.cache_panel(no_cache)))
    rate = _trace_named(fig, "hit rate").y
    assert rate[1] == pytest.approx(steps[1]["reads"] / (steps[1]["reads"] + steps[1]["g"]))
    assert _trace_named(fig, "cumulative").y[-1] == pytest.approx(trace["stats"]["cache_hit_rate"], abs=1e-4)
    # 100% is a tick, with room above it for its label inside the plot
    assert 1.0 in fig.layout.yaxis2.tickvals and fig.layout.yaxis2.range[1] >= 1.1
    assert len(_trace_named(run_figures.cache_panel(trace, upto_step=2), "hit rate").y) == 3
    json.loads(fig.to_json())


def test_numbers_match_engine_stats(trace):
    st = trace["stats"]
    nums = replay.numbers(trace)
    assert nums["finished"] and nums["nfe"] == st["nfe"] and nums["committed"] == trace["gen_length"]
    assert nums["tau"] == pytest.approx(st["tokens_per_forward"], abs=1e-3)
    assert nums["content_tau"] == st["content_tokens_per_forward"]
    assert nums["mean_g"] == pytest.approx(st["mean_g"], abs=0.01)
    assert nums["hit_rate"] == pytest.approx(st["cache_hit_rate"], abs=1e-4)
    assert nums["tokens_per_s"] == pytest.approx(st["tokens_per_s"], rel=1e-3)
    assert nums["content_tokens_per_s"] == pytest.approx(st["content_tokens_per_s"], rel=1e-3)
    assert nums["content_tokens_per_s"] < nums["tokens_per_s"]  # padding is not answer
    assert nums["wall_s"] == st["wall_s"]
    assert nums["other_share"] == pytest.approx(st["other_s"] / (st["model_s"] + st["other_s"]), rel=1e-3)
    partial = replay.numbers(trace, upto_step=3)
    assert not partial["finished"] and partial["content_tau"] is None and partial["steps"] == 4
    assert partial["committed"] == sum(len(s["committed"]) for s in trace["steps"][:4])
    assert partial["wall_s"] == pytest.approx(sum(s["model_ms"] + s["other_ms"] for s in trace["steps"][:4]) / 1e3)
    page = tables.numbers_html(nums)
    assert "NFE" in page and "tokens / s" in page and f">{st['nfe']}<" in page
    # The first card, the headline, is the answer-token speed, not the rate that counts padding.
    first = re.search(r'dl-card.*?</div><div[^>]*>([^<]*)</div>', page)
    assert first.group(1) == f"{st['content_tokens_per_s']:.1f}"
    content_before = sum(1 for t in replay.state_at(trace, 3)["ids"][:replay.first_end(trace, replay.state_at(trace, 3)["ids"])]
                         if t is not None)
    assert partial["content_tokens_per_s"] == pytest.approx(content_before / partial["model_s"])
    assert "—" in tables.numbers_html(partial)  # content tau not known yet


# ----------------------------------------------------------------------------- compare

def test_compare_changes_to_b_are_parsed_against_the_policies():
    from dllm_local.policies import registry
    from dllm_local.settings import Settings
    from ui.compare.tab import apply_changes

    specs = registry.all_specs()
    base = {"cache": "dual", "unmask": "threshold", "unmask_params": {"threshold": 0.9}, "cache_params": {},
            "block_size": 32, "seed": 3}
    out = apply_changes(base, "threshold=0.5, block_size=16, cache=prefix", specs)
    assert out["unmask_params"] == {"threshold": 0.5} and out["block_size"] == 16 and out["cache"] == "prefix"
    assert base["unmask_params"] == {"threshold": 0.9}  # the preset is not changed in place
    with pytest.raises(Exception, match="neither a setting nor a parameter"):
        apply_changes(base, "rho=0.5", specs)
    with pytest.raises(Exception, match="not key=value"):
        apply_changes(base, "threshold", specs)
    with pytest.raises(ValueError, match="must be one of"):  # checked where every setting is
        Settings.from_dict(apply_changes(base, "cache=turbo", specs))


# ----------------------------------------------------------------------------- edge cases, purity

def test_empty_trace_does_not_crash(trace):
    empty = copy.deepcopy(trace)
    empty["steps"], empty["final_ids"] = [], []
    for fig in (run_figures.confidence_heatmap(empty), run_figures.kv_heatmap(empty), run_figures.cache_panel(empty),
                run_figures.kv_heatmap(empty, view="cache_error")):
        assert "no steps yet" in _annotations(fig)
        json.loads(fig.to_json())
    assert "no steps yet" in _annotations(run_figures.confidence_heatmap(trace, upto_step=-1))
    assert replay.numbers(empty)["nfe"] == 0 and not replay.numbers(empty)["finished"]
    assert grid.token_grid_html(empty, 0).count("dl-masked") == trace["gen_length"]


# ----------------------------------------------------------------------------- tuning

def test_sweep_figure_labels_points_zooms_to_the_data_and_shows_intervals():
    rows = [({"threshold": 0.9, "block_size": 32}, 0.95, 50.0, True), ({"threshold": 0.5, "block_size": 8}, 0.9, 80.0, True),
            ({"threshold": 0.7, "block_size": 16}, 0.85, 40.0, False)]
    report = {"problems": 20, "rows": [{"point": p, "accuracy": a, "model_tok_s": x, "pareto": f} for p, a, x, f in rows]}
    fig = tune_figures.sweep_figure(report)
    assert _annotations(fig) == ["<b>1</b>", "<b>2</b>"]
    beaten = next(d for d in fig.data if d.name.startswith("1 beaten: as accurate or more in fewer forwards"))
    assert list(beaten.hovertext) == ["τ 0.7 · B 16"]
    low, high = fig.layout.yaxis.range
    assert 0.4 < low < 0.85 and 0.95 < high <= 1.05  # zoomed to the points and their intervals, not 0-100%
    assert "n = 20" in fig.layout.yaxis.title.text
    assert tune_figures.wilson_interval(1.0, 20) == pytest.approx((0.8389, 1.0), abs=1e-4)
    assert _trace_named(fig, "1  τ 0.9 · B 32").error_y.arrayminus[0] == pytest.approx(
        0.95 - tune_figures.wilson_interval(0.95, 20)[0])
    _trace_named(fig, "2  τ 0.5 · B 8")
    assert list(_trace_named(fig, "Pareto frontier").x) == [50.0, 80.0]
    # The table gives accuracy in the chart's unit.
    assert [row[2] for row in tune_figures.sweep_table({**report, "rows": [dict(r, nfe=4) for r in report["rows"]]})] == [
        "95%", "90%", "85%"]
    assert tune_figures.percent(0.925) == "92.5%" and tune_figures.percent(0.99996) == "100%"


def test_sweep_inputs_are_read_by_the_page_and_checked_once_by_the_settings():
    from dllm_local.errors import SettingsError
    from dllm_local.experiments.sweep import plan
    from dllm_local.policies import registry
    from dllm_local.settings import Settings
    from ui.tune.tab import parse_numbers, sweep_axes

    assert parse_numbers("0.5, 0.9", float, "Values", "in (0, 1]") == [0.5, 0.9]
    with pytest.raises(SettingsError, match=r"Values: 'abc' is not a number; give values in \(0, 1\]"):
        parse_numbers("0.5, abc", float, "Values", "in (0, 1]")
    with pytest.raises(SettingsError, match="Block sizes: '8.5' is not a number"):
        parse_numbers("8, 8.5", int, "Block sizes", "whole numbers >= 1")
    with pytest.raises(SettingsError, match="no values"):
        parse_numbers(" , ", float, "Values", "in (0, 1]")

    specs = registry.all_specs()
    base = {"cache": "dual", "unmask": "threshold", "gen_length": 64}
    assert sweep_axes(specs, base, "unmask.threshold", "0.5, 0.9", "16, 32") == {"threshold": [0.5, 0.9],
                                                                                 "block_size": [16, 32]}
    assert sweep_axes(specs, base, "cache.refresh_every", "0, 4", "32") == {"refresh_every": [0, 4], "block_size": [32]}
    assert sweep_axes(specs, {"cache": "none", "unmask": "fixed"}, None, "", "32") == {"block_size": [32]}
    with pytest.raises(SettingsError, match="Knob: 'unmask.rho' is not a numeric parameter of dual \\+ threshold"):
        sweep_axes(specs, base, "unmask.rho", "0.5", "32")
    # A knob both policies have is named with its kind, and reaches that policy alone.
    both = {"cache": "drift_refresh", "unmask": "guided"}
    axes = sweep_axes(specs, both, "unmask.top_k", "2, 3", "32")
    assert axes == {"unmask.top_k": [2, 3], "block_size": [32]}
    _, settings = plan(Settings.from_dict(both), axes)[0]
    assert settings.unmask_params == {"top_k": 2} and settings.cache_params == {}
    # The range is the settings' to check, once, naming the knob (the sweep checks every point first).
    with pytest.raises(SettingsError, match=r"threshold must be less than or equal to 1 \(not 1.5\)"):
        plan(Settings.from_dict(base), sweep_axes(specs, base, "unmask.threshold", "0.9, 1.5", "32"))
    with pytest.raises(SettingsError, match=r"block_size must be greater than or equal to 1 \(not 0\)"):
        plan(Settings.from_dict(base), sweep_axes(specs, base, "unmask.threshold", "0.9", "0"))


# ----------------------------------------------------------------------------- concurrency

def _teaching_curve(tau: float = 4.0):
    from dllm_local.devices import DEVICES
    from dllm_local.analysis.costmodel import TEACHING_EXAMPLE, concurrency_crossovers, concurrency_curve

    t = TEACHING_EXAMPLE
    crossovers = concurrency_crossovers(t.model, DEVICES[t.device], t.g, tau)
    return concurrency_curve(t.model, DEVICES[t.device], t.g, tau, [2**k for k in range(11)]), crossovers


def test_concurrency_figure_plots_both_decoders_on_log_axes_and_marks_the_crossovers():
    rows, crossovers = _teaching_curve()
    fig = tune_figures.concurrency_figure(rows, crossovers, "teaching 7B on H100")
    diffusion, ar = _trace_named(fig, "diffusion"), _trace_named(fig, "autoregressive")
    assert list(diffusion.x) == [2**k for k in range(11)]
    assert list(ar.y) == [r["ar_tokens_per_s"] for r in rows] and list(diffusion.y) == [r["diffusion_tokens_per_s"] for r in rows]
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [2**k for k in range(11)]
    assert fig.layout.yaxis.type == "log"
    labels = {a.text: a for a in fig.layout.annotations}
    saturates, overtakes = labels["<b>diffusion saturates ≈ 9</b>"], labels["<b>AR overtakes ≈ 37</b>"]
    # Annotations on a log axis sit at log10 of the value.
    assert saturates.x == pytest.approx(math.log10(crossovers["diffusion_saturates"]))
    assert overtakes.x == pytest.approx(math.log10(crossovers["ar_overtakes"]))
    markers = [d for d in fig.data if d.showlegend is False]  # the dashed verticals
    assert sorted(d.x[0] for d in markers) == pytest.approx(
        sorted([crossovers["diffusion_saturates"], crossovers["ar_overtakes"], crossovers["ar_saturates"]]))
    # Read from the back of the hall: the same style as the other figures, labels larger still.
    assert fig.layout.plot_bgcolor == "white" and fig.layout.xaxis.tickfont.size >= 14
    assert all(a.font.size >= 16 for a in fig.layout.annotations)
    assert tune_figures.concurrency_line(crossovers) == (
        "Diffusion saturates at ≈ 9 (9.2) concurrent requests; AR overtakes at ≈ 37 (36.9).")
    never = dict(crossovers, ar_overtakes=math.inf)
    assert "never overtakes" in tune_figures.concurrency_line(never)
    assert not any("AR overtakes" in a.text for a in tune_figures.concurrency_figure(rows, never).layout.annotations)


def test_changing_tau_in_the_concurrency_view_changes_the_stated_crossover():
    import asyncio
    from types import SimpleNamespace

    import gradio as gr
    from gradio.state_holder import SessionState

    from ui.tune.tab import ConcurrencyView, show_concurrency

    with gr.Blocks() as demo:
        view = ConcurrencyView()
        view.wire()
    w = SimpleNamespace(conc_plot=view.plot, conc_line=view.line, conc_device=view.device, conc_model=view.model,
                        conc_g=view.g, conc_tau=view.tau)
    assert w.conc_plot.elem_id == "tune-concurrency" and w.conc_line.elem_id == "tune-concurrency-line"
    # The view opens on the write-up's teaching example.
    assert (w.conc_device.value, w.conc_g.value, w.conc_tau.value) == ("H100", 32, 4)
    assert "AR overtakes at ≈ 37 (36.9)" in w.conc_line.value
    # Every input redraws the view; τ's change event, run as Gradio runs it:
    wired = {target for fn in demo.fns.values() for target, event in fn.targets if event == "change"
             if fn.fn is show_concurrency and fn.outputs == [w.conc_plot, w.conc_line]}
    assert wired == {w.conc_device._id, w.conc_model._id, w.conc_g._id, w.conc_tau._id}
    on_tau = next(fn for fn in demo.fns.values() if fn.targets == [(w.conc_tau._id, "change")])

    def event(tau, g=32):
        out = asyncio.run(demo.process_api(on_tau, ["H100", w.conc_model.value, g, tau], state=SessionState(demo)))
        return out["data"]

    figure, line = event(8)
    assert line == "Diffusion saturates at ≈ 9 (9.2) concurrent requests; AR overtakes at ≈ 74 (73.8)."
    assert any("AR overtakes ≈ 74" in a["text"] for a in json.loads(figure["plot"])["layout"]["annotations"])
    assert "AR overtakes at ≈ 18 (18.4)" in event(2)[1]
    assert event(4, g=0)[1].startswith("⚠ G (positions recomputed per forward) must be from 1 to 1,000,000, not 0")


IDENTIFIER = re.compile(r"\b[a-z]+_[a-z_]+\b")  # true_drift, low_confidence: a value's name, not words


def _labels(fig) -> list[str]:
    """What a reader sees a figure name things by: its title, its axes' and colour bars' titles, its
    legend's entries and its notes."""
    layout = fig.to_plotly_json()["layout"]
    texts = [(layout.get("title") or {}).get("text")]
    texts += [(axis.get("title") or {}).get("text") for key, axis in layout.items() if key.startswith(("xaxis", "yaxis"))]
    texts += [note.get("text") for note in layout.get("annotations", [])]
    for t in fig.data:
        # In the legend: a trace that says so, or a line's or marks' by default (a heatmap's never).
        texts.append(t.name if (t.showlegend if t.showlegend is not None else t.type != "heatmap") else None)
        bar = getattr(getattr(t, "marker", None), "colorbar", None) or getattr(t, "colorbar", None)
        texts.append(bar.title.text if bar is not None and bar.title is not None else None)
    return [text for text in texts if text]


def test_labels_are_words_and_the_identifiers_stay_the_values(trace):
    """Issue 59, item 10: the KV view's choices and a policy parameter's choices are shown in words
    (``true_drift`` reads "True KV drift (exact)", ``low_confidence`` "low confidence"), the value
    each gives is still the identifier; a KV figure's title, axes and legend name no identifier."""
    from dllm_local.policies import registry
    from ui.run.widgets import knob_widget

    assert set(run_figures.KV_VIEW_NAMES) == set(KV_VIEWS)
    assert not [name for name in run_figures.KV_VIEW_NAMES.values() if IDENTIFIER.search(name)]
    for view in KV_VIEWS:
        labels = _labels(run_figures.kv_heatmap(trace, layer="0", which="v", view=view))
        assert labels and not [text for text in labels if IDENTIFIER.search(text)], (view, labels)
    params = [p for specs in registry.all_specs().values() for spec in specs for p in spec["params"] if p["choices"]]
    assert any("low_confidence" in p["choices"] for p in params)
    for param in params:
        menu = knob_widget(param, param["default"], True, param["name"])
        assert [value for _, value in menu.choices] == param["choices"]
        assert not [shown for shown, _ in menu.choices if IDENTIFIER.search(shown)], menu.choices
        assert not IDENTIFIER.search(param["help"]), param["help"]
