"""A block-diffusion trace's parts as the views read them: which K/V the run stored once its block
finished (exact from then on), and a mixture of experts' routed experts per step. Pure functions of
the trace dict, no plotting, like ``trace_parts``."""
from __future__ import annotations

from ..parts.kinds import model_kind
from ..parts.trace_parts import Trace, block_span, layer_order, read_number, steps_upto

# Why a stored entry is drawn at cosine 1.0: said on the KV view's hover, its caption and the panels.
EXACT_WORDS = "exact: written once its block finished; block-causal attention never changes it"


def is_block_trace(trace: Trace) -> bool:
    """Whether ``trace`` is a block-diffusion run's (its blocks at absolute positions)."""
    return trace.get("blocks_from") is not None or is_block_model(trace.get("model") or {})


def is_block_model(model: dict) -> bool:
    """Whether ``model`` (the engine's info on the loaded model, or a trace's ``model``) is a
    block-diffusion model."""
    return model_kind(model).absolute_blocks


def sequence_end(trace: Trace, record: dict) -> int | None:
    """Where the sequence a block-diffusion step's forward sees ends: its block's end (later blocks
    are not in it yet, so nothing of theirs is cached or reused); None for a masked run."""
    return block_span(trace, int(record.get("block") or 0)).stop if is_block_trace(trace) else None


def stored_spans(trace: Trace, upto_step: int | None = None) -> list[tuple[int, int, int]]:
    """(step, start, end) of each store forward up to ``upto_step``: before that step, a forward
    counted apart from NFE wrote the K/V of absolute positions ``[start, end)`` (the prompt's whole
    blocks, then each finished block)."""
    return [(i, int(record["stored"][0]), int(record["stored"][1]))
            for i, record in enumerate(steps_upto(trace, upto_step)) if record.get("stored")]


def exact_since(trace: Trace, upto_step: int | None = None) -> dict[int, int]:
    """Absolute position -> the first step whose forward read its stored K/V, for every position
    a store forward wrote up to ``upto_step``."""
    return {p: step for step, start, end in stored_spans(trace, upto_step) for p in range(start, end)}


def store_forwards(trace: Trace, upto_step: int | None = None) -> int:
    """The store forwards up to ``upto_step``: the finished run's count where the view covers it."""
    steps = steps_upto(trace, upto_step)
    stats = trace.get("stats") or {}
    if len(steps) == len(trace.get("steps") or []) and "store_forwards" in stats:
        return int(stats["store_forwards"])
    return len(stored_spans(trace, upto_step))


# ----------------------------------------------------------------------------- experts

# More experts per layer than any released mixture has (LLaDA2's 256): the panel draws a box for each.
MAX_EXPERTS = 4096


def experts_of(trace: Trace) -> tuple[int, int] | None:
    """(experts per layer, routed per token) of a mixture of experts' trace; None for a dense model
    (or a model whose info does not give both as counts, routed at most all, experts at most MAX_EXPERTS)."""
    model = trace.get("model") or {}
    total, routed = (read_number(model.get(key), int) for key in ("experts", "active_experts"))
    return (total, routed) if total and routed and 0 < routed <= total <= MAX_EXPERTS else None


def routed_at(trace: Trace, step: int) -> dict[str, list[int]]:
    """Layer -> the distinct experts step ``step``'s forward routed to, ascending, in layer order;
    empty when the trace holds none there (a dense model, or a step before any)."""
    steps = trace.get("steps") or []
    if not 0 <= step < len(steps):
        return {}
    routed = steps[step].get("experts") or {}
    return {layer: sorted({int(e) for e in routed[layer]}) for layer in sorted(routed, key=layer_order)}
