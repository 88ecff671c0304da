"""Masked diffusion (LLaDA, Dream, LLaDA-MoE, the tiny model): bidirectional, a mask per
undecoded position, the blocks dividing the answer; the sampler's ``Run``."""
from __future__ import annotations

from .spec import ModelKind, register

# The sampler's knobs (``decoding.sampler.Run``): its schedule, temperature, policies and diagnostics.
SAMPLER_KNOBS = ("steps", "temperature", "cache", "cache_params", "unmask", "unmask_params", "exact_drift",
                 "early_stop")

MASKED = register(ModelKind(
    name="masked", label="masked-diffusion", run="dllm_local.decoding.sampler:Run", shares_batch=True,
    knobs=SAMPLER_KNOBS,
    cache_refusal="cache policy {cache!r} keeps finished blocks as they were, which is exact only under "
                  "block-causal attention (SDAR, LLaDA2, Fast-dLLM v2); {name} is bidirectional ({family}): use "
                  "prefix, dual or another cache policy"))
