"""The cost model's targets for the block-diffusion and MoE families, counted again here by the
project's own model classes built on the meta device from each release's config.json sizes; the
active parameters agree with what the releases call themselves; a block run projected onto a
mixture of experts reads the experts its G tokens choose; the page projects each tiny family's
runs onto its released checkpoint."""
from __future__ import annotations

import pytest
import torch

import dllm_local
from dllm_local import Settings
from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import TARGET_MODELS, project
from dllm_local.hub import TINY_FAMILIES
from dllm_local.models import family as families
from dllm_local.tiny_checkpoints import random_llada2, random_llada_moe, random_sdar as sdar
from ui.parts import tables
from ui.canvas.controls import FAMILY_TARGETS, cost_target

QWEN3_8B = {**sdar.DENSE, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "max_window_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936}
QWEN3_30B_A3B = {**QWEN3_8B, **sdar.MOE, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "max_window_layers": 48, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                 "moe_intermediate_size": 768}
LLADA_MOE_7B = random_llada_moe.released_config(157184, 156892, hidden_size=2048, num_attention_heads=16,
                                         num_key_value_heads=16, num_hidden_layers=16, dense_intermediate_size=8192,
                                         expert_intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
                                         max_position_embeddings=8192)
QWEN25_7B = dict(model_type="Fast_dLLM_Qwen", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
# (target, family, config, what the release calls its total and active parameters, in billions, and
# whether its active count takes in the input embedding: Qwen3-30B-A3B's 3.3B and LLaDA2.0-mini's
# 1.4B do, LLaDA-MoE's 1.4B does not)
RELEASES = [("SDAR-8B-Chat", "sdar", QWEN3_8B, 8.2, 8.2, True),
            ("SDAR-30B-A3B-Chat", "sdar_moe", QWEN3_30B_A3B, 30.5, 3.3, True),
            ("LLaDA2.0-mini", "llada2_moe", random_llada2.RELEASED, 16.0, 1.4, True),
            ("LLaDA-MoE-7B-A1B", "lladamoe", LLADA_MOE_7B, 7.0, 1.4, False),
            ("Fast-dLLM-v2-7B", "Fast_dLLM_Qwen", QWEN25_7B, 7.6, 7.6, True)]


@pytest.mark.parametrize("name, family, raw, total_b, active_b, with_embedding", RELEASES)
def test_each_target_is_its_release_counted_by_the_models_own_class(name, family, raw, total_b, active_b,
                                                                    with_embedding):
    spec = families.get(family)
    with torch.device("meta"):
        model = spec.model(spec.config.from_dict(raw))
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    experts = [p.numel() for n, p in model.named_parameters() if ".experts." in n]
    target = TARGET_MODELS[name]
    assert target.weight_bytes == 2 * (total - embedding)  # bf16, the input embedding gathered, not read
    if target.experts is None:
        assert not experts and target.params == total - embedding
    else:
        e = target.experts
        per_expert = sum(experts) / (e.per_layer * e.layers)
        assert e.bytes_each == 2 * per_expert and (e.per_layer, e.routed) == (
            model.config.num_experts, model.config.num_experts_per_tok)
        assert target.params == total - embedding - sum(experts) + e.routed * e.layers * per_expert
    assert total / 1e9 == pytest.approx(total_b, rel=0.1)
    assert (target.params + with_embedding * embedding) / 1e9 == pytest.approx(active_b, rel=0.1)


def test_a_block_run_projected_onto_a_mixture_reads_the_experts_its_tokens_choose_and_counts_its_stores():
    handle = dllm_local.load("tiny-sdar-moe", device="cpu", dtype="float32")
    trace = dllm_local.generate(handle, "What is 12 + 7?", Settings(gen_length=16, block_size=4, cache="block",
                                                                   trace="summary")).trace.to_dict()
    stats, target, h100 = trace["stats"], TARGET_MODELS[cost_target(handle.summary())], DEVICES["H100"]
    assert target.name == "SDAR-30B-A3B-Chat" and stats["store_forwards"] >= 2
    run = project(stats, len(trace["prompt_ids"]), int(trace["gen_length"]), target, h100)[0]
    assert run["g"] == stats["mean_g"] and run["experts_read"] == pytest.approx(target.experts.distinct(run["g"]))
    assert run["experts_read"] < 0.3 * target.experts.per_layer  # a few tokens a forward: most experts stay unread
    assert run["encoder_ms"] == pytest.approx((stats["store_forwards"] - 1) * target.floor_s(run["g"], h100) * 1e3
                                              / stats["nfe"])
    table = tables.cost_table_html(project(stats, len(trace["prompt_ids"]), int(trace["gen_length"]), target, h100),
                                   target.name, h100.name, trace)
    assert "K/V stores" in table and f"{stats['store_forwards'] - 1} forward(s) writing finished blocks" in table


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_the_page_projects_each_tiny_family_onto_its_release(name):
    info = dllm_local.load(name, device="cpu", dtype="float32").summary()
    assert cost_target(info) == FAMILY_TARGETS[info["family"]] in TARGET_MODELS


def test_gpu_checks_block_shapes_run_on_the_cpu_at_small_widths():
    """bench/gpu_block.py's two shapes (CUDA only in gpu_check) at small widths: each family's
    handle decodes with the block cache, its forwards over one block are timed, and the shallow
    model's target is counted as the releases' are."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gpu_block

    small = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16}
    for key, shape in gpu_block.SHAPES.items():
        sizes = {**small, **({"num_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
                              "moe_intermediate_size": 32} if "num_experts" in shape.sizes else {})}
        row = gpu_block.shape_row(key, dataclasses.replace(shape, sizes=sizes), 3, 32, "What is 12 + 7?",
                                  torch.device("cpu"), DEVICES["H100"])
        assert row["G"] == shape.block and row["store_forwards"] >= 1 and row["step_ms"] > 0 and row["floor_ms"] > 0
        assert row["step_ms_real"] == pytest.approx(row["step_ms"] * shape.real_layers / 3)
        if "num_experts" in shape.sizes:  # layer 0 dense, two of 16 experts, 4 routed per token
            assert 4 <= row["experts_read"] <= 16 and row["experts_estimate"] == pytest.approx(
                16 * (1 - (1 - 4 / 16) ** shape.block))
        else:
            assert row["experts_read"] is None


def test_the_performance_docs_give_the_cost_models_own_figures():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text()
    h100 = DEVICES["H100"]
    for name, g in (("SDAR-8B-Chat", 4), ("SDAR-30B-A3B-Chat", 4), ("LLaDA2.0-mini", 32), ("LLaDA-MoE-7B-A1B", 32),
                    ("Fast-dLLM-v2-7B", 32)):
        target = TARGET_MODELS[name]
        at_g, ar = target.floor_s(g, h100) * 1e3, target.floor_s(1, h100) * 1e3
        experts = f"{target.experts.distinct(g):.1f} of {target.experts.per_layer}" if target.experts else "-"
        need = at_g / ar
        row = f"| {g} | {experts} | {at_g:.2f} ms | {ar:.2f} ms | {need:.2g} |" if need > 1.001 else \
            f"| {g} | {experts} | {at_g:.2f} ms | {ar:.2f} ms | 1 |"
        assert row in docs, row
