"""Mixture-of-experts layers route by sort and grouped GEMM: no host round trip in a forward, the
same logits as the per-expert loop, no graph break, and the routing still reaches the observers."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dllm_local
from dllm_local.experiments.probes import HostSyncCounter
from dllm_local.models.layers import Experts, pack_weights
from dllm_local.models.observers import ExpertsRouted
from dllm_local.tiny_checkpoints import random_llada2, random_llada_moe, random_sdar

BUILDERS = {
    "llada-moe": random_llada_moe.build_checkpoint,
    "llada2": random_llada2.build_checkpoint,
    "sdar-moe": lambda path: random_sdar.build_checkpoint(path, moe=True),
}
POSITIONS = 24


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def handle(request, tmp_path_factory):
    folder: Path = BUILDERS[request.param](tmp_path_factory.mktemp(request.param) / "tiny")
    return dllm_local.load(str(folder), device="cpu", dtype="float32")


def _experts(handle) -> list[Experts]:
    return [m for m in handle.model.modules() if isinstance(m, Experts)]


def _forward(handle) -> tuple[torch.Tensor, ExpertsRouted, HostSyncCounter]:
    ids = torch.arange(POSITIONS)[None] % handle.model.config.vocab_size
    routes = ExpertsRouted(handle.experts[0])
    view = handle.model.new_cache(1, POSITIONS).alloc()
    with torch.inference_mode(), HostSyncCounter() as syncs:
        logits = handle.model(ids, torch.arange(POSITIONS), cache=view, observers=(routes,)).logits
    return logits, routes, syncs


def test_each_experts_weight_is_a_view_into_its_stack(handle):
    layers = _experts(handle)
    assert layers and all(layer.stacked is not None for layer in layers)
    for layer in layers:
        for index, expert in enumerate(layer):
            for stacked, linear in zip(layer.stacked, (expert.gate_proj, expert.up_proj, expert.down_proj)):
                assert linear.weight.data_ptr() == stacked[index].data_ptr()
    assert any(".experts.0.gate_proj.weight" in name for name in handle.model.state_dict())


def test_a_forward_makes_no_host_sync_and_equals_the_loop(handle):
    grouped, routes, syncs = _forward(handle)
    assert syncs.total == 0, dict(syncs.counts)
    for layer in _experts(handle):
        layer.stacked = None  # the fallback: each expert on its own rows
    try:
        looped, looped_routes, loop_syncs = _forward(handle)
    finally:
        pack_weights(handle.model)
    assert loop_syncs.total > 0  # the loop reads the routing back: the probe sees it
    print(f"{handle.family}: max |grouped - loop| = {(grouped - looped).abs().max().item():.1e}")
    assert torch.equal(grouped, looped)
    assert routes.routed() == looped_routes.routed() and len(routes.routed()) == len(_experts(handle))


def test_a_bfloat16_forward_compiles_without_a_graph_break(handle):
    """In bfloat16: torch 2.13 traces grouped_mm in no other dtype (the layer loops then)."""
    model = dllm_local.load(str(handle.path), device="cpu", dtype="bfloat16").model
    torch._dynamo.reset()
    ids = torch.arange(POSITIONS)[None] % model.config.vocab_size
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(ids)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
