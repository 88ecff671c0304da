"""The page's views of a block-diffusion run, on real traces made here: the tiny LLaDA run as a
block model (blocks at absolute positions, the block cache) and the tiny LLaDA-MoE (routed experts).
Blocks start where the trace says; the KV view draws exactly the entries the run's store forwards
wrote as exact, from the step that first read them; the verdicts and the position panel say so;
the experts panel lists each step's routing; the controls follow the loaded model's kind; the
store forwards are counted apart from NFE."""
from __future__ import annotations

import copy

import gradio as gr
import numpy as np
import pytest

import dllm_local
from dllm_local.policies import registry
from dllm_local.decoding.sampler import generate
from dllm_local.settings import Settings
from dllm_local.tiny_checkpoints.random_llada_moe import build_checkpoint
from ui import figures
from ui.parts import tables
from ui.block.lessons import stored_verdict
from ui.block.parts import EXACT_WORDS
from ui.run.widgets import run_controls
from ui.run.controls import cache_choices, controls_from_settings, fit_to_model, kept_aside, kind_values
from ui.lessons.verdicts import HOLDS, FAILS, kv_reuse_verdict
from ui.model.box import model_line
from ui.run.position_panel import position_panel_html
from ui.parts.replay import numbers, prompt_len, what_if
from ui.figures.stored import LEGEND
from ui.run.status_line import work_line
from ui.parts.trace_parts import block_span, block_start

PROMPT = "What is 12+7?"  # 17 prompt tokens with the chat template: the prompt ends inside block 4 (16-19)
B = 4


@pytest.fixture(scope="module")
def block_trace() -> dict:
    handle = dllm_local.load("tiny", device="cpu", dtype="float32")
    handle.kind = "block"  # the tiny LLaDA under the block-causal layout: the engine's block path
    result = generate(handle, PROMPT, Settings(gen_length=8, block_size=B, cache="block", trace="full",
                                               exact_drift=True))
    return result.trace.to_dict()


@pytest.fixture(scope="module")
def moe_trace(tmp_path_factory) -> dict:
    handle = dllm_local.load(str(build_checkpoint(tmp_path_factory.mktemp("moe"))), device="cpu", dtype="float32")
    return generate(handle, PROMPT, Settings(gen_length=8, block_size=B, cache="dual", trace="full")).trace.to_dict()


def _masked(trace: dict) -> dict:
    """The same trace read as a masked run's: no absolute blocks, no stored spans."""
    masked = copy.deepcopy(trace)
    masked.pop("blocks_from")
    masked["model"]["kind"] = "masked"
    for record in masked["steps"]:
        record.pop("stored", None)
    return masked


def test_blocks_start_at_absolute_positions_with_the_prompts_end_in_block_0(block_trace):
    P = prompt_len(block_trace)
    assert P % B and block_trace["blocks_from"] == P - P % B  # the prompt ends inside block 0
    assert block_start(block_trace, 0) == block_trace["blocks_from"] and block_start(block_trace, 2) == P - P % B + 2 * B
    assert block_span(block_trace, 0) == range(P - P % B, P - P % B + B)
    assert block_start(_masked(block_trace), 1) == P + B  # a masked run's blocks start at the answer
    # The answer runs to its last block's end; block 0's first positions are prompt, not answer.
    assert (P + block_trace["gen_length"]) % B == 0
    first = block_trace["steps"][0]
    assert {int(p) for p in first["masked_positions"]} == set(range(P, block_span(block_trace, 0).stop))
    # The what-if replay scores block 0's answer positions only: 0..B-P%B-1, no prompt position.
    assert what_if(block_trace, 0.0)["commits"][0] == list(range(B - P % B))


def _expected_exact(trace: dict, upto: int) -> set[tuple[int, int]]:
    """(step, answer position) of every entry a store forward wrote before that step."""
    P, n, cells = prompt_len(trace), trace["gen_length"], set()
    for since, record in enumerate(trace["steps"][: upto + 1]):
        if record.get("stored"):
            start, end = record["stored"]
            cells |= {(step, p - P) for step in range(since, upto + 1) for p in range(start, end) if 0 <= p - P < n}
    return cells


@pytest.mark.parametrize("view", ["drift", "cache_error", "true_drift"])
def test_the_kv_view_draws_the_stored_entries_exact_from_the_runs_spans(block_trace, view):
    last = len(block_trace["steps"]) - 1
    expected = _expected_exact(block_trace, last)
    assert expected, "the run stored a finished answer block"
    fig = figures.kv_heatmap(block_trace, layer="mean", which="v", upto_step=last, view=view)
    layers = {t.name: t for t in fig.data}
    exact = np.array(layers[LEGEND].z, dtype=float)
    assert {tuple(c) for c in np.argwhere(~np.isnan(exact))} == expected
    assert set(exact[~np.isnan(exact)]) == {1.0} and EXACT_WORDS in layers[LEGEND].hovertemplate
    for name in ("cached", view):  # no other layer draws those cells
        if name in layers:
            z = np.array(layers[name].z, dtype=float)
            assert all(np.isnan(z[s, p]) for s, p in expected), name
    P = prompt_len(block_trace)
    for step, record in enumerate(block_trace["steps"]):  # a later block is not in the step's sequence: blank
        later = block_span(block_trace, record["block"]).stop - P
        assert all(np.isnan(np.array(layers[name].z, dtype=float)[step, later:]).all()
                   for name in ("cached", view, LEGEND) if name in layers)
    # Before the first answer block is stored nothing is drawn exact; without stored spans, never.
    first = min(s for s, _ in expected)
    assert LEGEND not in {t.name for t in figures.kv_heatmap(block_trace, "mean", "v", first - 1, view).data}
    assert LEGEND not in {t.name for t in figures.kv_heatmap(_masked(block_trace), "mean", "v", last, view).data}
    assert EXACT_WORDS in figures.BLOCK_CAPTIONS["kv"] and EXACT_WORDS not in figures.CAPTIONS["kv"]


def test_the_verdicts_and_the_position_panel_say_the_stored_blocks_are_exact(block_trace):
    last = len(block_trace["steps"]) - 1
    verdict = stored_verdict(block_trace, last)
    stores = block_trace["stats"]["store_forwards"]
    assert verdict.status == HOLDS and EXACT_WORDS in verdict.detail and verdict.numbers["store_forwards"] == stores
    assert verdict.numbers["least_measured"] is not None and verdict.numbers["least_measured"] >= 0.9999
    assert stored_verdict(_masked(block_trace), last) is None
    broken = copy.deepcopy(block_trace)  # a stored position recomputed later: the claim fails
    stored_at = next(i for i, r in enumerate(broken["steps"]) if r.get("stored") and i)
    broken["steps"][-1]["recomputed"].append(broken["steps"][stored_at]["stored"][0])
    assert stored_verdict(broken, last).status == FAILS
    # Later blocks are not in a block step's sequence: the reuse claim does not count them as reused.
    assert kv_reuse_verdict(block_trace, last, "mean", "v").status == HOLDS
    s, p = min(_expected_exact(block_trace, last))
    assert EXACT_WORDS in position_panel_html(block_trace, last, p)
    assert "a later block" in position_panel_html(block_trace, 0, block_trace["gen_length"] - 1)


def test_a_shifted_heads_query_before_a_block_is_said_as_such_not_as_a_broken_claim():
    """Fast-dLLM v2 reads a block's first logits from the position before it, which its forwards
    recompute after that position's block was stored: the verdict says so, and still holds."""
    handle = dllm_local.load("tiny-fast-dllm-v2", device="cpu", dtype="float32")
    trace = generate(handle, PROMPT, Settings(gen_length=16, block_size=B, cache="block", trace="full",
                                              exact_drift=True)).trace.to_dict()
    last = len(trace["steps"]) - 1
    verdict = stored_verdict(trace, last)
    queries = verdict.numbers["query_only"]
    assert trace["model"]["shifted_head"] and queries and verdict.numbers["recomputed_after_store"] == []
    assert verdict.status == HOLDS and "yet recomputed" not in verdict.detail
    assert f"positions {queries[:8]} ran again, each only as the query before the next block" in verdict.detail
    assert "(no other recomputed after it was stored)" in verdict.detail or "least cosine" in verdict.detail
    assert all((q + 1) % B == 0 or q + 1 == trace["blocks_from"] for q in queries)  # each a block's last position
    # Another stored position recomputed later still breaks the claim.
    broken = copy.deepcopy(trace)
    stored_at = next(i for i, r in enumerate(broken["steps"]) if r.get("stored") and i)
    broken["steps"][-1]["recomputed"].append(broken["steps"][stored_at]["stored"][0])
    assert stored_verdict(broken, last).status == FAILS


def test_store_forwards_are_shown_apart_from_nfe(block_trace):
    stores = block_trace["stats"]["store_forwards"]
    assert stores >= 2  # the prompt's whole blocks, then each finished block but the last
    assert f"+ {stores} K/V store forwards" in work_line(block_trace)
    assert f"forwards + {stores} K/V store forwards" in tables.numbers_html(numbers(block_trace))
    assert numbers(block_trace, 0)["store_forwards"] == 1  # the prompt's blocks, before step 0
    assert "store forward" not in work_line(_masked(block_trace) | {"stats": {**block_trace["stats"], "store_forwards": 0}})


def test_the_experts_panel_lists_each_steps_routed_experts(moe_trace, block_trace):
    total = moe_trace["model"]["experts"]
    for step, record in enumerate(moe_trace["steps"]):
        panel = figures.experts_html(moe_trace, step)
        assert f'data-step="{step}"' in panel
        for layer, ids in record["experts"].items():
            assert f'data-layer="{layer}" data-distinct="{len(ids)}"' in panel
            assert f"{len(ids)} of {total} experts" in panel
            assert panel.count('(routed)"') >= len(ids)
    assert figures.experts_html(block_trace, 0) == ""  # a dense model: no panel
    views = figures.experts_html(moe_trace)  # the last step by default
    assert f'data-step="{len(moe_trace["steps"]) - 1}"' in views


BLOCK_MODEL = {"name": "tiny-sdar", "family": "sdar", "kind": "block", "block_size": B, "parameters": 2e5,
               "device": "cpu", "dtype": "float32", "quantization": "none", "memory_mb": 0.6, "layers": 2}
MASKED_MODEL = {**BLOCK_MODEL, "name": "tiny", "family": "llada", "kind": "masked"}
MASKED_MODEL.pop("block_size")


def test_the_controls_follow_the_loaded_models_kind():
    specs = registry.all_specs()
    assert [n for _, n in cache_choices(specs, BLOCK_MODEL)] == list(registry.for_model("block", registry.CACHE))
    assert "block" not in [n for _, n in cache_choices(specs, MASKED_MODEL)]
    assert kind_values(specs, BLOCK_MODEL, MASKED_MODEL) == {
        "cache": {"choices": cache_choices(specs, BLOCK_MODEL), "value": "block"}, "block_size": {"value": B},
        "cache.sub_block": {"value": None}}  # the whole block at once
    fast = {**BLOCK_MODEL, "name": "tiny-fast-dllm-v2", "sub_block": 8}  # its release decodes sub-blocks of 8
    assert kind_values(specs, fast, MASKED_MODEL)["cache.sub_block"] == {"value": 8}
    back = kind_values(specs, MASKED_MODEL, BLOCK_MODEL)
    assert back["cache"]["value"] == "none" and "block" not in [n for _, n in back["cache"]["choices"]]
    assert "value" not in kind_values(specs, MASKED_MODEL, MASKED_MODEL)["cache"]  # the user's choice stays
    mine = {"cache": "prefix", "block_size": 16}  # kept aside while a block model's own stood in
    kept = kept_aside(BLOCK_MODEL, MASKED_MODEL, {**mine, "gen_length": 64, "preset": "LLaDA baseline"}, {})
    assert kept == {**mine, "preset:masked": "LLaDA baseline"}  # and the preset the box named, by kind
    assert kept_aside(MASKED_MODEL, BLOCK_MODEL, {"cache": "block", "block_size": B, "preset": None}, kept) == {
        **kept, "preset:block": None}
    back = kind_values(specs, MASKED_MODEL, BLOCK_MODEL, mine)
    assert (back["cache"]["value"], back["block_size"]["value"]) == ("prefix", 16)
    start = controls_from_settings({"cache": "dual", "block_size": 32}, specs)
    assert fit_to_model(start, specs, BLOCK_MODEL)["cache"] == "block" and fit_to_model(start, specs, MASKED_MODEL) == start
    with gr.Blocks():
        controls, *_ = run_controls(specs, start, BLOCK_MODEL)
    assert controls["cache"].value == "block" and controls["block_size"].value == B
    assert [n for _, n in controls["cache"].choices] == ["none", "block"]
    assert "block diffusion, block 4" in model_line(BLOCK_MODEL) and "masked diffusion" in model_line(MASKED_MODEL)
