"""Block-diffusion shapes for bench/gpu_check.py: an 8B-class dense block model (SDAR-8B-Chat:
Qwen3-8B's sizes, blocks of 4) and a 16B-A1.4B mixture of experts (LLaDA2.0-mini: 256 experts of
width 512, 8 routed per token, one shared, blocks of 32), each with ``--block-layers`` of its
layers and random bf16 weights drawn on the device.

The family's tiny checkpoint (its released config keys, tokenizer, chat template and mask id) is
written to a temporary folder and loaded by ``dllm_local.load``; its model is then swapped for a
random one at the release's width, so the handle decodes as the family's checkpoint would. A
run with the exact block cache and the threshold policy (random weights commit one token per
step) is timed forward by forward (CUDA events around the model): the forwards over one block
(G = the block: its denoising forwards and the K/V store that writes it, the same shape).
Beside them, the roofline floor of the same shallow model (TargetModel.floor_s: its dense
weights, the experts its G tokens choose, the routed arithmetic), the experts the run's steps
routed per layer against the uniform-routing estimate, and the floor of the whole release.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import dllm_local
from dllm_local import Settings
from dllm_local.devices import DeviceProfile
from dllm_local.analysis.costmodel import TARGET_MODELS, TargetModel, counted_target
from dllm_local.models import family as families
from dllm_local.models.loading.footprint import logical_parameters, weight_read_bytes
from dllm_local.models.loading.loader import ModelHandle, free_device_memory
from dllm_local.tiny_checkpoints import random_llada2 as llada2, random_sdar as sdar


@dataclasses.dataclass(frozen=True)
class BlockShape:
    release: str  # the cost model's target, what the shallow model is projected onto
    build_tiny: Callable[[Path], Path]  # the family's tiny checkpoint: its files, its keys
    sizes: dict  # the release's config.json sizes
    real_layers: int
    block: int


SHAPES = {
    "sdar-8b": BlockShape("SDAR-8B-Chat", sdar.build_checkpoint, {
        "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128}, 36, 4),
    "llada2-mini": BlockShape("LLaDA2.0-mini", llada2.build_checkpoint, {
        key: llada2.RELEASED[key] for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                                              "n_group", "topk_group", "moe_intermediate_size", "first_k_dense_replace")},
        20, 32),
}


def random_handle(shape: BlockShape, layers: int, device: torch.device, folder: Path) -> ModelHandle:
    """The family's tiny checkpoint loaded, its model swapped for a random one of ``shape``: built
    on the device (its rotary tables and routers' buffers as the class makes them), then cast to
    bf16 and its weights drawn again there."""
    tiny = dllm_local.load(str(shape.build_tiny(folder)), device=str(device), dtype="bfloat16")
    raw = {**json.loads((folder / "config.json").read_text()), **shape.sizes, "num_hidden_layers": layers,
           "max_window_layers": layers}
    spec = families.get(tiny.family)
    with torch.device(device):
        model = spec.model(spec.config.from_dict(raw)).to(torch.bfloat16).eval()
    draw_weights(model, device)
    return dataclasses.replace(tiny, model=model, experts=model.experts, num_parameters=logical_parameters(model),
                               memory_bytes=model.get_memory_footprint(), weight_read_bytes=weight_read_bytes(model))


def draw_weights(model: torch.nn.Module, device: torch.device | str, seed: int = 0) -> None:
    """Random weights drawn in place on the device: norms of one, every other weight N(0, 0.02)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def shallow_target(model: torch.nn.Module, name: str) -> TargetModel:
    """The cost model's target of the model built here, counted as the releases' are."""
    expert = [(n.split(".experts.")[0], p.numel()) for n, p in model.named_parameters() if ".experts." in n]
    c, layers = model.config, len({layer for layer, _ in expert})
    experts = (c.num_experts, c.num_experts_per_tok, layers, sum(n for _, n in expert) // (c.num_experts * layers)) \
        if expert else None
    return counted_target(name, sum(p.numel() for p in model.parameters()), model.get_input_embeddings().weight.numel(),
                          experts)


class ForwardTimer:
    """(positions, milliseconds) of every forward of ``model``: CUDA events around each on a GPU,
    the clock on the CPU."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.spans, self._hooks = model, [], []
        self.cuda = next(model.parameters()).device.type == "cuda"

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        return mark

    def __enter__(self) -> "ForwardTimer":
        def before(module, args, kwargs):
            ids = args[0] if args else kwargs["input_ids"]
            self.spans.append([ids.shape[-1], self._mark(), None])

        def after(module, args, kwargs, output):
            self.spans[-1][2] = self._mark()

        self._hooks = [self.model.register_forward_pre_hook(before, with_kwargs=True),
                       self.model.register_forward_hook(after, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()

    def taken(self) -> list[tuple[int, float]]:
        if self.cuda:
            torch.cuda.synchronize()
            return [(g, start.elapsed_time(end)) for g, start, end in self.spans if end is not None]
        return [(g, (end - start) * 1e3) for g, start, end in self.spans if end is not None]


def shape_row(key: str, shape: BlockShape, layers: int, gen: int, prompt: str, device: torch.device,
              profile: DeviceProfile) -> dict:
    """One shape decoded with the block cache: its forwards timed, beside the roofline."""
    with tempfile.TemporaryDirectory() as tmp:
        handle = random_handle(shape, layers, device, Path(tmp) / key)
    target = shallow_target(handle.model, key)
    settings = Settings(gen_length=gen, block_size=shape.block, cache="block", unmask="threshold",
                        unmask_params={"threshold": 0.9}, trace="summary")
    with ForwardTimer(handle.model) as timer:
        result = dllm_local.generate(handle, prompt, settings)
    # Forwards over one block: its denoising forwards and the store that writes it, the same shape
    # (the prompt's store, the prefill, is wider).
    block_ms = [ms for g, ms in timer.taken() if g == shape.block]
    g = shape.block
    stats = result.trace.stats
    routed = [len(experts) for step in result.trace.steps for experts in (step.experts or {}).values()]
    release = TARGET_MODELS[shape.release]
    step_ms = statistics.median(block_ms)
    row = {"shape": key, "layers": layers, "real_layers": shape.real_layers, "block": shape.block, "G": g,
           "nfe": stats.nfe, "store_forwards": stats.store_forwards, "step_ms": step_ms,
           "floor_ms": target.floor_s(g, profile) * 1e3,
           "experts_read": statistics.fmean(routed) if routed else None,
           "experts_estimate": target.experts.distinct(g) if target.experts else None,
           "step_ms_real": step_ms * shape.real_layers / layers,
           "release_floor_ms": release.floor_s(g, profile) * 1e3,
           "peak_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    row["of_floor"] = row["step_ms"] / row["floor_ms"]
    del handle, result
    free_device_memory()
    return row


def block_rows(layers: int, gen: int, prompt: str, device: torch.device, profile: DeviceProfile) -> list[dict]:
    return [shape_row(key, shape, layers, gen, prompt, device, profile) for key, shape in SHAPES.items()]


BLOCK_COLUMNS = [("shape", 11, ""), ("layers", 6, ""), ("block", 5, ""), ("G", 4, ""), ("nfe", 4, ""),
                 ("store_forwards", 14, ""), ("step_ms", 8, ".2f"), ("floor_ms", 8, ".3f"), ("of_floor", 8, ".2f"),
                 ("experts_read", 12, ".1f"), ("experts_estimate", 16, ".1f"), ("real_layers", 11, ""),
                 ("step_ms_real", 12, ".2f"), ("release_floor_ms", 16, ".3f"), ("peak_gb", 7, ".1f")]
