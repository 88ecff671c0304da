"""Block diffusion (SDAR, LLaDA2, Fast-dLLM v2): the sampler's ``Run`` with blocks at absolute
positions, causal between them; the model declares its block and decodes with its exact block cache."""
from __future__ import annotations

from .masked import SAMPLER_KNOBS
from .spec import ModelKind, register

BLOCK = register(ModelKind(
    name="block", label="block-diffusion", run="dllm_local.decoding.sampler:Run", absolute_blocks=True,
    own_block=True, own_cache="block", bench_set="block", knobs=SAMPLER_KNOBS,
    cache_refusal="cache policy {cache!r} approximates a bidirectional model's K/V; {name} is a block-diffusion "
                  "model ({family}), whose finished blocks never change: use the block cache (--cache block), "
                  "exact, or none"))
