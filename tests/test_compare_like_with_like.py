"""Compare compares like with like, on the tiny model's real runs: answers over the answer (to
its end of text), not over the padding after it; no speed ratio between runs of different
lengths; and B moved to A's length with its fixed schedule scaled (the tab's refusals, on a real
server, are in test_compare_repeats.py)."""
from __future__ import annotations

import copy
import html

import pytest

import dllm_local
from dllm_local.settings import Settings
from ui.compare.tab import at_length
from ui.compare.comparison import answers_compared, compare, compare_html
from ui.parts.presets import load_presets

PRESETS = load_presets()[0]
PROMPT = PRESETS["Fast-dLLM DualCache (paper default)"]["prompt"]  # Compare's default prompt: the Run tab's
SHORT = PRESETS["Teaching: straight house"]["settings"]  # threshold decoding, quick on the tiny model


@pytest.fixture(scope="module")
def one_answer_two_lengths(tiny) -> dict[int, dict]:
    """The same settings at lengths 32 and 64: the same answer, then end-of-text padding."""
    return {n: dllm_local.generate(tiny, PROMPT, Settings.from_dict(dict(SHORT, gen_length=n))).trace.to_dict()
            for n in (32, 64)}


def answer_tokens(trace: dict) -> list[int]:
    """The tokens before the first stop token, found apart from ``ui.parts.trace_parts``."""
    stops = set(trace["model"]["stop_ids"])
    ids = trace["final_ids"]
    return ids[:next((i for i, t in enumerate(ids) if t in stops), len(ids))]


def test_the_same_answer_at_two_lengths_agrees_over_the_answer_not_the_padding(one_answer_two_lengths):
    short, long = one_answer_two_lengths[32], one_answer_two_lengths[64]
    assert short["text"] == long["text"] and answer_tokens(short) == answer_tokens(long)  # the premise: one answer
    assert len(answer_tokens(short)) < 32  # ended inside both regions: the rest is padding
    result = compare(short, long)  # over the whole regions: 50.0%, "first difference: answer position 32"
    assert result["agreement"] == 1.0 and result["first_difference"] is None
    assert result["compared"] == len(answer_tokens(short))
    table = compare_html(result)
    assert f"100.0% of the {len(answer_tokens(short))} answer positions up to the end of text" in table
    assert "none: the same answer" in table


def test_a_difference_inside_the_answer_counts_and_one_in_the_padding_does_not(one_answer_two_lengths):
    trace = one_answer_two_lengths[32]
    n = len(answer_tokens(trace))
    padded = copy.deepcopy(trace)
    padded["final_ids"][n + 1] = padded["final_ids"][0]  # a content token after the end of text
    assert answers_compared(trace, padded) == {"compared": n, "agreement": 1.0, "first_difference": None}
    changed = copy.deepcopy(trace)
    changed["final_ids"][3] = trace["final_ids"][3] + 1
    assert answers_compared(trace, changed) == {"compared": n, "agreement": (n - 1) / n, "first_difference": 3}
    shorter = copy.deepcopy(trace)
    shorter["final_ids"][n - 2] = trace["model"]["stop_ids"][0]  # ends two positions sooner
    assert answers_compared(trace, shorter) == {"compared": n, "agreement": (n - 2) / n, "first_difference": n - 2}


def test_runs_of_different_lengths_get_no_speed_ratio(one_answer_two_lengths):
    short, long = one_answer_two_lengths[32], one_answer_two_lengths[64]
    result = compare(short, long)
    assert not result["same_length"] and result["speedup_wall"] is None and result["speedup_model"] is None
    assert result["speed_wall"]["verdict"] == "different lengths"
    table = compare_html(result)
    assert html.escape("not compared: A answered in 32 positions and B in 64, so their times are of "
                       "different work") in table
    assert "<td>generation length</td><td>32</td><td>64</td>" in table
    assert compare(long, long)["same_length"] and compare(long, long)["speedup_wall"] == pytest.approx(1.0)


def test_b_moves_to_a_length_with_its_fixed_schedule_scaled(tiny):
    baseline = PRESETS["LLaDA baseline"]["settings"]  # 64 positions, 32 steps: 2 tokens a step
    moved, note = at_length(baseline, 128)
    assert (moved["gen_length"], moved["steps"]) == (128, 64) and baseline["gen_length"] == 64  # not changed in place
    assert note == "its own length is 64; steps 32 → 64, the same tokens per step"
    assert at_length(baseline, 64) == (baseline, "")
    threshold, note = at_length(SHORT, 64)  # no fixed schedule: only the length moves
    assert threshold == dict(SHORT, gen_length=64) and note == "its own length is 32"
    blocks = PRESETS["DualCache, blocks of several steps"]["settings"]
    shrunk, _ = at_length(blocks, 32)
    trace = dllm_local.generate(tiny, PROMPT, Settings.from_dict(shrunk)).trace.to_dict()
    per_step = {len(step["committed"]) for step in trace["steps"]}
    assert trace["gen_length"] == 32 and len(trace["steps"]) == 16 and per_step == {blocks["gen_length"] // blocks["steps"]}
