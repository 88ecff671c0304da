"""What a loaded model holds and reads: its parameter count before quantization (the FLOP term
of the cost model) and the bytes one forward reads (its weight term). bitsandbytes' quantized
parameters are read by their attributes; bitsandbytes itself is never imported here.

A transformers model (every family's, a ``DiffusionLM``) names its input embedding and its config
says whether its head reuses it; of any other module (a test's, a block of one), the first
``nn.Embedding`` is the input embedding, tied when another module holds its weight.

:func:`loaded_bytes` tells, from shapes alone (a model built on the meta device will do), what
transformers' ``BitsAndBytesConfig`` leaves of a model: the memory a checkpoint needs per precision.
"""
from __future__ import annotations

import math
import re

import torch
from transformers import DiffusionGemmaForBlockDiffusion, PreTrainedModel

from ..protocol import DiffusionLM


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
    rows of its tokens (1 GB of LLaDA-8B's 16 GB), unless the output head reads it whole (tied).

    A DiffusionGemma's forward is a decoder pass: its text weights (encoder and decoder share them)
    with every expert, and not its vision tower, which text never runs. Every expert, because a
    pass routes a whole canvas: T tokens each sent to k of E experts leave a layer's expert unread
    with probability (1 - k/E)^T, so the pass reads E x (1 - (1 - k/E)^T) of them, 128 less 9e-6 for
    the 26B-A4B's canvas of 256 tokens (8 of 128 each) and 7.92 of the tiny model's 8 at its 16 tokens
    (2 each); its runs' traces count 7.8 to 7.9 a pass. Forwards over fewer tokens (an AR step, a short
    prompt's encoder pass) read fewer: the cost model counts those (costmodel.Experts.distinct)."""
    embedding = _input_embedding_weight(model)
    if embedding is not None and _tied_to_head(model, embedding):
        embedding = None
    return sum(_stored_bytes(p) for p in _forward_parameters(model) if p is not embedding)


def _forward_parameters(model: DiffusionLM | torch.nn.Module) -> list[torch.Tensor]:
    """The parameters a text forward runs: a DiffusionGemma's decoder (its text weights, tied to the
    encoder's) and its head; of any other model, all of them."""
    if isinstance(model, DiffusionGemmaForBlockDiffusion):
        return list(dict.fromkeys([*model.model.decoder.parameters(), *model.lm_head.parameters()]))
    return list(model.parameters())


NF4_BLOCK = 64  # values per absmax in bitsandbytes' 4-bit quantization (its default, as transformers loads)


def loaded_bytes(model: PreTrainedModel, quantization: str | None, dtype_bytes: int = 2) -> int:
    """Bytes ``model``'s weights take once loaded with ``quantization`` (None, "4bit" or "8bit",
    the loader's BitsAndBytesConfig), every other parameter at ``dtype_bytes`` each, from shapes.
    A quantized weight of n values and r rows: NF4 packs two values a byte, with one fp32 absmax
    per ``NF4_BLOCK`` values and a 16-value fp32 code table (no double quantization: the loader's
    config); LLM.int8 keeps one int8 a value and one fp32 scale a row.

    Only what transformers' bitsandbytes quantizer converts shrinks: plain ``nn.Linear`` modules
    outside its kept list (the output head, the last module and every tied weight). A
    DiffusionGemma ties its encoder's text layers to its decoder's, so all of them are kept, and
    its experts are 3-D parameters, no ``nn.Linear``: of its weights only the vision tower, its
    embedder and the self-conditioning MLP are quantized.
    """
    converted = {id(m.weight): m.out_features for m in quantized_linears(model)} if quantization else {}
    total = 0
    for p in model.parameters():
        rows = converted.get(id(p))
        if rows is None:
            total += p.numel() * dtype_bytes
        elif quantization == "4bit":
            total += (p.numel() + 1) // 2 + math.ceil(p.numel() / NF4_BLOCK) * 4 + 16 * 4
        else:
            total += p.numel() + rows * 4
    return total


def quantized_linears(model: PreTrainedModel) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` modules transformers' BitsAndBytesConfig replaces in ``model``: all but the
    ones its quantizer keeps (``get_keys_to_not_convert``: every tied weight, the output head and
    the module of the last parameter, which it finds before the weights are tied: counted here
    with the tied copies, as the head's own weight)."""
    tied = model.all_tied_weights_keys
    last = list(model.named_parameters(remove_duplicate=False))[-1][0]
    head = [name for name, m in model.named_modules() if m is model.get_output_embeddings()]
    kept = sorted({key.removesuffix(".weight") for key in (*tied, *tied.values(), last, *head)})
    # transformers' ``should_convert_module`` rule: a kept key matches a module's name as a regex
    # from its start up to a module boundary, or as a suffix. Its patterns compiled once here: it
    # compiles each anew per module, past re's cache (4 minutes for the 26B model's ~700 keys).
    patterns = [re.compile(rf"(?:{key})(?:(?<=\.)|(?=\.|$))") for key in kept]

    def converted(name: str) -> bool:
        return not (any(p.match(name) for p in patterns) or name.endswith(tuple(kept)))
    return [m for name, m in model.named_modules() if type(m) is torch.nn.Linear and converted(name)]


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
