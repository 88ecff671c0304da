"""Fewer, larger kernels at the same products (issue 58, item 4): the projections that read one
input run as one GEMM once loaded (Q/K/V, gate/up), with the released weight names kept, and a
step computes the LM head over the rows it reads alone."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dllm_local
from dllm_local import Settings
from dllm_local.models.layers import FusedProjections
from dllm_local.tiny_checkpoints.random_llada_moe import build_checkpoint as build_llada_moe
from dllm_local.tiny_checkpoints.random_sdar import build_checkpoint as build_sdar

PROMPT = "What is 3 + 4?"


def _fused(model: torch.nn.Module) -> list[FusedProjections]:
    return [m for m in model.modules() if isinstance(m, FusedProjections) and m.__dict__.get("_fused")]


def _unfused_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The logits with every fused group run Linear by Linear (as loaded before fusing)."""
    kept = {m: m.__dict__["_fused"] for m in _fused(model)}
    try:
        for m in kept:
            m.__dict__["_fused"] = {}
        with torch.inference_mode():
            return model(ids).logits
    finally:
        for m, fused in kept.items():
            m.__dict__["_fused"] = fused


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, llada_dir, dream_dir) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("fused")
    return {"tiny": "tiny", "llada": llada_dir, "dream": dream_dir, "sdar": build_sdar(root / "sdar"),
            "llada_moe": build_llada_moe(root / "llada-moe", init_seed=0)}


@pytest.mark.parametrize("family, groups", [
    ("tiny", {"qkv", "gate_up"}), ("llada", {"qkv", "gate_up"}), ("dream", {"qkv", "gate_up"}),
    ("sdar", {"qkv", "gate_up"}), ("llada_moe", {"qkv"}),
])
def test_projections_that_read_one_input_run_as_one_gemm_with_the_same_logits(checkpoints, family, groups):
    handle = dllm_local.load(str(checkpoints[family]), device="cpu", dtype="float32")
    model = handle.model
    fused = _fused(model)
    assert fused and set().union(*(m._fused for m in fused)) == groups
    for module in fused:  # each Linear's weight is a view into its group's one tensor
        for group, (weight, _, _) in module._fused.items():
            first = getattr(module, module.fuses[group][0]).weight
            assert first.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    names = {name for name, _ in model.named_parameters()}
    assert not any("qkv" in name or "gate_up" in name for name in names)  # the released names, no new one
    ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = model(ids).logits
    torch.testing.assert_close(logits, _unfused_logits(model, ids), rtol=0, atol=1e-5)


def test_a_fused_model_moved_to_another_dtype_fuses_again_there():
    handle = dllm_local.load("tiny", device="cpu", dtype="float32")
    model = handle.model.to(torch.float64)
    for module in _fused(model):
        for group, (weight, _, _) in module._fused.items():
            linear = getattr(module, module.fuses[group][0])
            assert weight.dtype == torch.float64
            assert linear.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    ids = torch.arange(20)[None]
    with torch.inference_mode():
        logits = model(ids).logits
    torch.testing.assert_close(logits, _unfused_logits(model, ids), rtol=0, atol=1e-12)


def test_a_training_model_runs_each_linear_so_each_weight_gets_its_gradient():
    model = dllm_local.load("tiny", device="cpu", dtype="float32").model.train()
    model(torch.arange(12)[None]).logits.sum().backward()
    block = _fused(model)[0]
    assert all(getattr(block, name).weight.grad is not None for name in block.fuses["qkv"])


@pytest.mark.parametrize("cache, reads_block", [
    ("none", "every"), ("prefix", "every"), ("dual", "every"), ("drift_refresh", "every"),
    ("freecache", "some"),  # a step whose positions are no range (the device's to know) reads all
    ("adaptive", "none"),  # its policy reads the entropy at every computed position
    ("flash", "none"),  # a sliding window's positions are the device's to know
])
def test_a_step_computes_the_head_over_the_rows_it_reads_with_the_same_tokens(tiny, cache, reads_block):
    """With the trace off a step's head runs over its block's rows alone; with the trace on (which
    lists every masked position scored) over every computed row: the same tokens either way."""
    extra = {"unmask": "flash_verify", "block_size": 16} if cache == "flash" else {}
    settings = Settings.from_dict({"gen_length": 64, "block_size": 32, "cache": cache, "trace": "off", **extra})
    rows: list[int] = []
    hook = tiny.model.final_norm().register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    try:
        quiet = dllm_local.generate(tiny, PROMPT, settings)
        read = rows.copy()
        rows.clear()
        traced = dllm_local.generate(tiny, PROMPT, settings.with_(trace="summary"))
    finally:
        hook.remove()
    assert quiet.token_ids == traced.token_ids
    steps = quiet.stats.nfe
    assert len(read) == steps + quiet.stats.store_forwards
    blocks = sum(1 for n in read if n == settings.block_size)
    if reads_block == "none":
        assert read == rows
    else:  # a decoding forward's head over one block's rows, fewer than the forward computed
        assert blocks == steps if reads_block == "every" else 0 < blocks < steps
        assert sum(read) < sum(rows)
