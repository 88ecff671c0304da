"""LLaDA 2.1's editing on the page's views, from a real run of the tiny LLaDA2 checkpoint (its
released format) with the ``edit`` policy: the replay's state follows the edits to the run's own
answer, the grid strikes the rewritten token and tells the edit in the hover, the position panel
lists it in the history, and the verdict beside the grid counts what the trace holds."""
from __future__ import annotations

import html

import pytest

import dllm_local
from dllm_local import Settings
from dllm_local.decoding.sampler import generate
from dllm_local.tiny_checkpoints import random_llada2 as tiny
from ui.run import views as run_views
from ui.block.edit_lessons import CLAIM, edit_verdict
from ui.grid.tokens import token_label
from ui.run.position_panel import position_panel_html
from ui.parts.replay import prompt_len, state_at

PROMPT = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> dict:
    handle = dllm_local.load(str(tiny.build_checkpoint(tmp_path_factory.mktemp("llada2") / "tiny-llada2")),
                             device="cpu", dtype="float32")
    result = generate(handle, PROMPT, Settings(gen_length=64, block_size=32, unmask="edit", cache="block",
                                               trace="full"))
    data = result.trace.to_dict()
    data["_answer"] = result.token_ids
    return data


def _edits(trace: dict) -> list[tuple[int, list]]:
    return [(step, edit) for step, record in enumerate(trace["steps"]) for edit in record.get("edited") or []]


def test_the_replay_follows_the_edits_to_the_runs_answer(trace):
    edits = _edits(trace)
    assert edits, "the tiny model's drafts change as its blocks fill: this run must edit"
    state = state_at(trace, len(trace["steps"]) - 1)
    assert state["ids"] == trace["_answer"]
    unedited = dict(trace, steps=[{k: v for k, v in r.items() if k != "edited"} for r in trace["steps"]])
    assert state_at(unedited, len(trace["steps"]) - 1)["ids"] != trace["_answer"]  # the edits make the difference
    step, (position, new, probability, old) = edits[0]
    p = position - prompt_len(trace)
    assert state_at(trace, step - 1)["ids"][p] == old and state_at(trace, step)["ids"][p] == new
    assert [old, new, step, probability] in state_at(trace, step)["edits"][p]
    assert state_at(trace, step)["commit_step"][p] == step


def test_the_grid_and_the_position_panel_tell_each_edit(trace):
    step, (position, new, probability, old) = _edits(trace)[0]
    p = position - prompt_len(trace)
    grid = html.unescape(run_views.grid_at(trace, step, "step", 0.0))
    told = f"edited at step {step}: '{token_label(trace, old)}' -> '{token_label(trace, new)}' (probability {probability:.2f})"
    assert told in grid and "dl-edited" in grid and "the token an edit rewrote" in grid
    before = html.unescape(run_views.grid_at(trace, step - 1, "step", 0.0))
    assert told not in before
    panel = html.unescape(position_panel_html(trace, step, p))
    assert f"step {step}: edited in place" in panel and "written by an edit" in panel


def test_the_verdict_counts_the_traces_edits(trace):
    edits = _edits(trace)
    verdict = edit_verdict(trace, len(trace["steps"]) - 1)
    assert verdict.claim == CLAIM and verdict.numbers["edits"] == len(edits)
    assert verdict.numbers["edit_steps"] == sorted({s for s, _ in edits})
    first = edits[0][0]
    assert edit_verdict(trace, first - 1).numbers["edits"] == 0
    assert CLAIM in run_views.draw(trace, None, "step", "mean", "v", "drift", with_plots=False)["grid_verdicts"]
    plain = dict(trace, settings={**trace["settings"], "unmask": "threshold"})
    assert edit_verdict(plain) is None
