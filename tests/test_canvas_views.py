"""The views of a canvas model's trace (DiffusionGemma), read against real runs of the tiny random
DiffusionGemma: the grid marks what each step's sampler accepted and renoised and which drafts
moved; the side panel tells a position's drafts; the verdicts say how each canvas ended, with the
trace's own numbers; the figures show the entropy, the decoder's K/V drift beside the encoder's
exact cache, and the encoder's passes, at trace levels full and summary; a masked model's trace
is drawn as before."""
from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest

import dllm_local
from dllm_local.models.loading.loader import load
from dllm_local.decoding.sampler import generate
from dllm_local.settings import Settings
from ui.lessons import verdicts as lessons
from ui.grid.tokens import token_grid_html, token_label
from ui.run.position_panel import position_panel_html
from ui.parts.replay import numbers
from ui.figures import cache_panel, confidence_heatmap, kv_heatmap
from ui.figures.canvas_kv import ENCODER_EXACT
from ui.canvas.views import ACCEPTED, RENOISED
from ui.run.views import draw

PROMPT = "What is 2 plus 3?"
# Every canvas ends early: the sampler keeps nearly every sample at a low temperature, so the draft
# settles, and the bar for "confident" is high.
STOPS_EARLY = {"confidence_threshold": 2.0, "stability_threshold": 2, "entropy_bound": 4.0, "t_min": 0.05,
               "t_max": 0.1}
# No canvas ends early: eight steps each, never confident enough.
RUNS_ALL = {"max_denoising_steps": 8, "confidence_threshold": 0.005, "stability_threshold": 1}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    model = load("tiny-diffusiongemma")

    def run(params: dict, level: str) -> dict:
        settings = Settings(gen_length=32, block_size=32, seed=1, trace=level, canvas_params=params)  # two canvases
        return generate(model, PROMPT, settings).trace.to_dict()

    return {"stops": run(STOPS_EARLY, "full"), "runs_all": run(RUNS_ALL, "full"),
            "summary": run(STOPS_EARLY, "summary")}


_BOX = re.compile(r'<span class="(dl-tok[^"]*)" title="([^"]*)" data-pos="(\d+)"(?: data-token="\d+")? style="[^"]*">'
                  r'<span class="dl-pos"[^>]*>\d+</span>(.*?)</span>')


def _boxes(grid: str) -> dict[int, tuple[set[str], str, str]]:
    """Answer position -> (classes, hover title, shown text) of every box of the grid."""
    return {int(p): (set(classes.split()), html.unescape(title), html.unescape(text))
            for classes, title, p, text in _BOX.findall(grid)}


def _canvases(trace: dict) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for i, step in enumerate(trace["steps"]):
        found.setdefault(step["canvas"]["canvas"], []).append(i)
    return found


def test_the_grid_marks_each_steps_accepted_renoised_and_changed_positions(runs):
    for trace in (runs["stops"], runs["runs_all"]):
        P, L = len(trace["prompt_ids"]), trace["model"]["canvas_length"]
        last_draft = {c: trace["steps"][rows[-1]]["canvas"]["draft"] for c, rows in _canvases(trace).items()}
        for t, step in enumerate(trace["steps"]):
            canvas = step["canvas"]
            boxes = _boxes(token_grid_html(trace, t, color_by="confidence"))
            assert sorted(boxes) == list(range(trace["gen_length"]))
            on = {p for p, (classes, _, _) in boxes.items() if "dl-canvas" in classes}
            assert on == set(range(canvas["start"] - P, canvas["start"] - P + L))
            accepted = {p for p, (classes, _, _) in boxes.items() if "dl-canvas-accepted" in classes}
            renoised = {p for p, (classes, _, _) in boxes.items() if "dl-canvas-renoised" in classes}
            changed = {p for p, (classes, _, _) in boxes.items() if "dl-canvas-changed" in classes}
            assert accepted == {p - P for p in canvas["accepted"]}
            assert renoised == on - accepted
            assert changed == {p - P for p in canvas["changed"]}
            for offset, token in enumerate(canvas["draft"]):  # the box shows this step's draft, entropy in its hover
                _, title, text = boxes[canvas["start"] - P + offset]
                assert text == token_label(trace, token)
                assert f"entropy {canvas['entropy'][offset]:.3f}" in title
            for c in range(canvas["canvas"]):  # an earlier canvas: its last draft
                assert all(boxes[c * L + i][2] == token_label(trace, token) for i, token in enumerate(last_draft[c]))
            later = {p for p, (classes, _, _) in boxes.items() if "dl-canvas-pending" in classes}
            assert later == set(range((canvas["canvas"] + 1) * L, trace["gen_length"]))
            assert all(boxes[p][1].endswith("not started yet") for p in later)  # each canvas of the run begins


def test_a_boxs_hover_says_since_when_its_draft_stands(runs):
    trace = runs["stops"]
    P, rows = len(trace["prompt_ids"]), _canvases(trace)[0]
    shown = rows[-1]
    boxes = _boxes(token_grid_html(trace, shown))
    for p in range(trace["model"]["canvas_length"]):
        moved = [i for i in rows if P + p in trace["steps"][i]["canvas"]["changed"]]
        since = moved[-1] if moved else rows[0]
        assert f"since step {since} ·" in boxes[p][1]
    assert "accepted: kept by the sampler" in token_grid_html(trace, shown)


def test_the_verdicts_say_where_each_canvas_stopped_with_the_traces_numbers(runs):
    trace = runs["stops"]
    details = [v.detail for v in lessons.grid_verdicts(trace, len(trace["steps"]) - 1)]
    for c, rows in _canvases(trace).items():
        last = trace["steps"][rows[-1]]["canvas"]
        assert last["finished"] and len(rows) < 48  # the checkpoint's 48 steps: it stopped early
        stable = next(i for i, row in enumerate(reversed(rows)) if trace["steps"][row]["canvas"]["changed"])
        assert stable >= STOPS_EARLY["stability_threshold"]
        assert details[c] == (f"canvas {c + 1} stopped early at step {len(rows)} of 48: stable for {stable} step(s) "
                              f"and confident (mean entropy {last['mean_entropy']:.3f} < 2.0)")
    P, L = len(trace["prompt_ids"]), trace["model"]["canvas_length"]
    reads = sum(step["reads"] for step in trace["steps"])
    # The encoder computed the prompt, then the first canvas: each entry once.
    assert not any(d.startswith("the encoder cache") for d in details)  # beside the cache panel, once
    encoder = next(v.detail for v in lessons.canvas_verdicts(trace, len(trace["steps"]) - 1)
                   if v.lesson == lessons.ENCODER_LESSON)
    assert encoder == (f"the encoder cache: {reads} entries read, {P + L} computed; exact by construction (the "
                       "encoder never recomputes what it cached); each of its 2 pass(es) found the cache grown by "
                       "exactly what the passes before computed")
    # A pass that found fewer entries than the passes before computed (a cache recomputed or lost) fails it.
    broken = json.loads(json.dumps(trace))
    second = next(s for s in broken["steps"] if s["canvas"]["encoder"] and s["canvas"]["canvas"] == 1)
    second["canvas"]["encoder"]["cached"] = 0
    told = next(v for v in lessons.canvas_verdicts(broken, len(broken["steps"]) - 1) if v.claim.startswith("The encoder"))
    assert told.status == lessons.FAILS and f"a pass found 0 entries in its cache where the passes before computed {P}" in told.detail
    assert any(re.fullmatch(r"experts: layer 0 routed to \d\.\d distinct of 8 on average per pass; the cost model "
                            r"expects 7\.9 for 16 tokens each sent to 2 \(one autoregressive token reads 2\)", d)
               for d in details)
    # Part way through the second canvas: it is neither stopped nor out of steps yet.
    second = _canvases(trace)[1]
    midway = lessons.grid_verdicts(trace, second[1])
    assert midway[1].status == lessons.UNMEASURABLE and midway[1].detail.startswith("canvas 2 at step 2 of 48 so far")


def test_a_canvas_stopped_by_its_rule_at_its_last_step_did_not_stop_early_and_strict_comparisons_read_as_such(runs):
    trace = json.loads(json.dumps(runs["stops"]))
    rows = _canvases(trace)[0]
    last = trace["steps"][rows[-1]]["canvas"]
    # The rule met at the canvas's last step: nothing saved, so "early" does not hold.
    trace["settings"]["canvas_params"]["max_denoising_steps"] = len(rows)
    # A mean entropy that rounds to its threshold at three digits.
    trace["settings"]["canvas_params"]["confidence_threshold"] = threshold = 0.005
    last["mean_entropy"] = 0.00496
    told = lessons.grid_verdicts(trace, rows[-1])[0]
    assert told.status == lessons.FAILS and told.detail.startswith(
        f"canvas 1 met its stopping rule only at its last step ({len(rows)} of {len(rows)}), so no step was saved")
    assert "(mean entropy 0.00496 < 0.005)" in told.detail and f"{threshold:.3f} < {threshold}" not in told.detail


def test_a_canvas_that_never_stops_runs_all_its_steps(runs):
    trace = runs["runs_all"]
    verdicts = lessons.grid_verdicts(trace, len(trace["steps"]) - 1)
    for c, rows in _canvases(trace).items():
        assert len(rows) == 8 and not any(trace["steps"][i]["canvas"]["finished"] for i in rows)
        lowest = min(trace["steps"][i]["canvas"]["mean_entropy"] for i in rows)
        assert verdicts[c].status == lessons.FAILS
        assert verdicts[c].detail == (f"canvas {c + 1} ran all 8 steps: never stable and confident "
                                      f"(lowest mean entropy {lowest:.3f}, threshold 0.005)")


def test_the_side_panel_tells_a_positions_draft_at_every_step_of_its_canvas(runs):
    trace = runs["runs_all"]
    P, rows = len(trace["prompt_ids"]), _canvases(trace)[1]
    position = trace["model"]["canvas_length"] + 5  # in the second canvas
    panel = position_panel_html(trace, rows[-1], position)
    table = re.findall(r"<tr[^>]*>((?:<td[^>]*>.*?</td>){5})</tr>", panel)
    cells = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)] for row in table]
    assert len(cells) == len(rows)
    for row, i in zip(cells, rows):
        canvas = trace["steps"][i]["canvas"]
        offset = P + position - canvas["start"]
        assert row[0] == f"{i} ({trace['steps'][i]['step_in_block'] + 1})"
        assert row[1] == token_label(trace, canvas["draft"][offset])
        assert row[2] == ("changed" if P + position in canvas["changed"] else "")
        assert row[3].startswith("accepted" if P + position in canvas["accepted"] else "renoised")
        assert row[4] == f"{canvas['entropy'][offset]:.3f}"
    before = position_panel_html(trace, rows[0] - 1, position)  # the second canvas has not begun
    assert "has not started" in before and "<table" not in before


def test_a_run_with_its_own_canvas_length_is_drawn_in_its_canvases():
    """canvas_params' canvas_length (8) over the checkpoint's (16): four canvases of 8, each
    step's sampler decision on its own canvas's boxes."""
    settings = Settings(gen_length=32, block_size=32, seed=3, trace="full",  # seed 2 ends in its first canvas
                        canvas_params={"canvas_length": 8, "max_denoising_steps": 6})
    trace = generate(load("tiny-diffusiongemma"), PROMPT, settings).trace.to_dict()
    P = len(trace["prompt_ids"])
    assert sorted(_canvases(trace)) == [0, 1, 2, 3]
    for i in (0, 7, len(trace["steps"]) - 1):
        canvas = trace["steps"][i]["canvas"]
        boxes = _boxes(token_grid_html(trace, i))
        mine = set(range(canvas["start"] - P, canvas["start"] - P + 8))
        assert {p for p, (classes, _, _) in boxes.items() if ACCEPTED in classes} == {q - P for q in canvas["accepted"]}
        assert {p for p, (classes, _, _) in boxes.items() if RENOISED in classes} == mine - {q - P for q in canvas["accepted"]}
        assert f"canvas {canvas['canvas'] + 1} of 4" in token_grid_html(trace, i)


def _trace_named(fig, name: str):
    return next(t for t in fig.data if t.name.replace("<br>", " ") == name)  # a long name wraps in a narrow panel


def test_the_kv_view_shows_the_encoders_entries_exact_and_the_decoders_drift(runs):
    trace = runs["stops"]
    P = len(trace["prompt_ids"])
    fig = kv_heatmap(trace, layer="0", which="k")
    exact, drift = np.array(_trace_named(fig, ENCODER_EXACT).z), np.array(_trace_named(fig, "decoder drift").z)
    first_steps = {rows[0] for rows in _canvases(trace).values()}
    for i, step in enumerate(trace["steps"]):
        start, L = step["canvas"]["start"], len(step["canvas"]["draft"])
        assert (exact[i, :start] == 1.0).all() and np.isnan(exact[i, start:]).all()
        assert step["kv"]["0"]["k"][:start] == [None] * start  # drawn from the start: nothing stored there
        recorded = np.array([np.nan if v is None else v for v in step["kv"]["0"]["k"][start:start + L]])
        np.testing.assert_allclose(drift[i, start:start + L], recorded, rtol=1e-5)
        assert np.isnan(drift[i, start:start + L]).all() == (i in first_steps)
    summary = kv_heatmap(runs["summary"], which="v")
    assert list(_trace_named(summary, ENCODER_EXACT).y) == [1.0] * len(runs["summary"]["steps"])
    means = [s["kv"]["1"]["v_mean"] for s in runs["summary"]["steps"]]
    shown = _trace_named(kv_heatmap(runs["summary"], layer="1", which="v"), "canvas mean cosine").y
    assert [None if math.isnan(v) else pytest.approx(v) for v in shown] == means


def test_the_entropy_view_holds_each_steps_entropy_and_its_rules(runs):
    trace = runs["stops"]
    P = len(trace["prompt_ids"])
    fig = confidence_heatmap(trace)
    z = np.array(_trace_named(fig, "entropy").z)
    for i, step in enumerate(trace["steps"]):
        start = step["canvas"]["start"] - P
        np.testing.assert_allclose(z[i, start:start + len(step["canvas"]["entropy"])], step["canvas"]["entropy"],
                                   rtol=1e-5)
        assert np.isnan(np.delete(z[i], range(start, start + len(step["canvas"]["entropy"])))).all()
    assert list(_trace_named(fig, "mean entropy (stopping rule)").x) == [s["canvas"]["mean_entropy"]
                                                                      for s in trace["steps"]]
    assert list(_trace_named(fig, "confident below 2").x) == [2.0, 2.0]
    ended = [i for i, s in enumerate(trace["steps"]) if s["canvas"]["finished"]]
    assert list(_trace_named(fig, "ended early (stable and confident)").y) == ended


def test_the_cache_panel_counts_the_encoders_passes(runs):
    for trace in runs.values():
        P, L = len(trace["prompt_ids"]), trace["model"]["canvas_length"]
        fig = cache_panel(trace)
        assert list(_trace_named(fig, "computed by the encoder").y) == [P, L]
        assert list(_trace_named(fig, "cached, reused (exact)").y) == [0, P]
        assert f"hit rate {trace['stats']['cache_hit_rate']:.0%}" in fig.layout.title.text
        assert "full refresh" not in fig.to_json() and "partial" not in fig.to_json()


def test_every_view_draws_at_every_step_at_both_trace_levels(runs):
    for trace in runs.values():
        for step in (0, len(trace["steps"]) // 2, len(trace["steps"]) - 1):
            for layer, view in (("mean", "drift"), ("0", "drift"), ("1", "true_drift"), ("mean", "cache_error")):
                views = draw(trace, step, "step", layer, "k", view)
                assert views["grid"].count("data-pos=") == trace["gen_length"]


def test_the_numbers_count_the_ended_canvases(runs):
    trace = runs["stops"]
    first, second = _canvases(trace).values()
    assert numbers(trace, -1)["committed"] == 0
    assert numbers(trace, first[-2])["committed"] == 0  # the first canvas still being refined
    assert numbers(trace, second[0])["committed"] == trace["model"]["canvas_length"]
    whole = numbers(trace)
    produced = [t for t in trace["final_ids"] if t != trace["mask_id"]]
    assert whole["finished"] and whole["committed"] == len(produced)
    assert whole["tau"] == trace["stats"]["tokens_per_forward"] and whole["steps"] == len(trace["steps"])


def test_a_masked_models_trace_is_drawn_as_before(tiny):
    trace = dllm_local.generate(tiny, PROMPT, Settings(gen_length=16, block_size=8, seed=1)).trace.to_dict()
    grid = token_grid_html(trace, len(trace["steps"]) - 1)
    assert "dl-canvas" not in grid and grid.count("data-pos=") >= 1
    assert numbers(trace)["committed"] == sum(len(s["committed"]) for s in trace["steps"])
    assert [v.lesson for v in lessons.grid_verdicts(trace, 0) if v] == ["theorem1", "answer"]
    assert confidence_heatmap(trace).layout.title.text == "Confidence at masked positions"


def test_a_slide_of_a_canvas_step_draws_its_drafts_and_the_samplers_decision(runs):
    """The slide export draws a canvas trace's grid, not a masked one's (all masks): each
    position's draft, the sampler's kept (solid) and renoised (dashed) positions and the canvases
    not started; control bytes a random model draws stay valid XML (shown as their pictures)."""
    from xml.dom.minidom import parseString

    from ui.run.slides import grid_svg

    trace = runs["stops"]
    P = len(trace["prompt_ids"])
    step = _canvases(trace)[0][3]
    canvas = trace["steps"][step]["canvas"]
    chips = {int(g.getAttribute("data-pos")): g for g in parseString(grid_svg(trace, step)).getElementsByTagName("g")}
    assert sorted(chips) == list(range(trace["gen_length"]))
    kept = {p - P for p in canvas["accepted"]}
    for offset, token in enumerate(canvas["draft"]):
        strokes = [r for r in chips[offset].getElementsByTagName("rect") if r.getAttribute("stroke")]
        assert len(strokes) == 1 and (strokes[0].getAttribute("stroke-dasharray") == "") == (offset in kept)
        label = chips[offset].getElementsByTagName("text")[1].firstChild.data
        assert label == token_label(trace, token)
    later = chips[trace["model"]["canvas_length"]].getElementsByTagName("text")[1].firstChild.data
    assert later == "·"  # the second canvas has not started
