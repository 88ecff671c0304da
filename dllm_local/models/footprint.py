"""What a loaded model holds and reads: its parameter count before quantization (the FLOP term
of the cost model) and the bytes one forward reads (its weight term). bitsandbytes' quantized
parameters are read by their attributes; bitsandbytes itself is never imported here.

A transformers model (every family's, a ``DiffusionLM``) names its input embedding and its config
says whether its head reuses it; of any other module (a test's, a block of one), the first
``nn.Embedding`` is the input embedding, tied when another module holds its weight.
"""
from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel

from .protocol import DiffusionLM


def logical_parameters(model: torch.nn.Module) -> int:
    """The parameter count of ``model`` before quantization, for the FLOP term.

    bitsandbytes' 4-bit ``Params4bit`` packs two (or more, with a wider storage dtype) values per
    element, so its ``numel`` undercounts; its quant state keeps the original shape. ``Int8Params``
    holds one int8 per weight, so its ``numel`` is already the logical count.
    """
    return sum(math.prod(_logical_shape(p)) for p in model.parameters())


def arithmetic_parameters(model: DiffusionLM | torch.nn.Module) -> int:
    """The parameters a position's arithmetic uses (2 FLOP each): all of them before quantization,
    less the input embedding, from which a forward only gathers rows (unless the head reuses it)."""
    embedding = _input_embedding_weight(model)
    if embedding is None or _tied_to_head(model, embedding):
        return logical_parameters(model)
    return logical_parameters(model) - embedding.numel()


def weight_read_bytes(model: DiffusionLM | torch.nn.Module) -> int:
    """Bytes one forward reads from memory: every parameter as stored (packed 4-bit or int8 with
    its quantization constants), except the input embedding, from which a forward only gathers the
    rows of its tokens (1 GB of LLaDA-8B's 16 GB), unless the output head reads it whole (tied)."""
    embedding = _input_embedding_weight(model)
    if embedding is not None and _tied_to_head(model, embedding):
        embedding = None
    return sum(_stored_bytes(p) for p in model.parameters() if p is not embedding)


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s parameters as stored (packed 4-bit or int8 with their constants)."""
    return sum(_stored_bytes(p) for p in module.parameters())


def _logical_shape(param: torch.Tensor) -> tuple[int, ...]:
    state = getattr(param, "quant_state", None)  # set once a Params4bit is quantized
    return tuple(state.shape) if state is not None else tuple(param.shape)


def _stored_bytes(param: torch.Tensor) -> int:
    scales = getattr(param, "SCB", None)  # Int8Params' per-row scales
    return (param.numel() * param.element_size() + _quant_state_bytes(getattr(param, "quant_state", None))
            + (0 if scales is None else scales.numel() * scales.element_size()))


def _quant_state_bytes(state) -> int:
    """A 4-bit quant state's absmax, code table and, when nested (double quantization), its offset
    and the state quantizing absmax."""
    if state is None:
        return 0
    tensors = [t for t in (state.absmax, state.code, state.offset) if t is not None]
    # bitsandbytes' CPU repacking unnests a state and deletes state2, leaving nested False.
    nested = state.state2 if state.nested else None
    return sum(t.numel() * t.element_size() for t in tensors) + _quant_state_bytes(nested)


def _input_embedding_weight(model: DiffusionLM | torch.nn.Module) -> torch.Tensor | None:
    if isinstance(model, PreTrainedModel):
        embedding = model.get_input_embeddings()
    else:
        embedding = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    return None if embedding is None else embedding.weight


def _tied_to_head(model: DiffusionLM | torch.nn.Module, weight: torch.Tensor) -> bool:
    # LLaDA's tied head is F.linear on the embedding weight, held by no module: only its config says.
    if isinstance(model, PreTrainedModel) and model.config.tie_word_embeddings:
        return True
    return any(p is weight for m in model.modules() if not isinstance(m, torch.nn.Embedding)
               for p in m.parameters(recurse=False))
