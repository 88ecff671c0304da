"""A trace dict's parts as every view reads them: the steps up to a step, the prompt's and the
answer's lengths, where a block starts, a token's text, the ends of text, and the prompt the run was asked.

A trace is the plain dict of ``dllm_local.trace.Trace.to_dict()`` (or its JSON). Pure functions of
it, no plotting; the replay built on them is ``replay.py``.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dllm_local.values import integer, number

from .kinds import model_kind

Trace = dict[str, Any]


def steps_upto(trace: Trace, upto_step: int | None = None) -> list[dict]:
    steps = trace.get("steps") or []
    if upto_step is None:
        return list(steps)
    return list(steps[: max(0, int(upto_step) + 1)])


# A trace keeps its settings as written ("16.0", " 0.7 "), a plugin's policies' settings unread (any
# value), and a model's own numbers as the model gave them: read here through the settings' own types.
_READ = {int: TypeAdapter(integer()), float: TypeAdapter(number())}


def read_number(value: Any, kind: type[int] | type[float]) -> int | float | None:
    """``value`` as an int or a float, as the settings read a knob ("16.0" is 16); None where it is
    none, or does not read as one (a plugin's knob that means something else)."""
    try:
        return None if value is None else _READ[kind].validate_python(value)
    except ValidationError:
        return None


def mapping(value: Any) -> dict:
    """``value`` if it is a mapping (a policy's parameters), else empty: unread settings may hold anything."""
    return value if isinstance(value, dict) else {}


def setting(trace: Trace, name: str, kind: type[int] | type[float], params: str | None = None) -> int | float | None:
    """The run's knob ``name`` (of its ``params``, "cache_params" say) as ``kind``; None where the
    trace does not say it in a way the settings read."""
    settings = mapping(trace.get("settings"))
    return read_number(mapping(settings.get(params)).get(name) if params else settings.get(name), kind)


def layer_order(name: str) -> tuple[bool, int, str]:
    """The sort key of a layer's name: numbered layers in their order ("2" before "10"), then any
    other name a trace gives (its schema takes any text)."""
    return (not name.isdecimal(), len(name) if name.isdecimal() else 0, name)


def per_position(cosines: Any, which: str) -> list | None:
    """A layer's K or V cosines (``which``: "k", "v") per position, from the layer's named cosines
    in a step record; None where it holds one number (a summary's mean) or nothing."""
    found = mapping(cosines).get(which)
    return found if isinstance(found, list) else None


def one_value(cosines: Any, name: str) -> float | None:
    """A layer's cosine ``name`` ("k_mean", say) where it is one number; None where it is a list or nothing."""
    found = mapping(cosines).get(name)
    return None if found is None or isinstance(found, list) else float(found)


def prompt_len(trace: Trace) -> int:
    return len(trace.get("prompt_ids") or [])


def answer_length(trace: Trace) -> int:
    return int(trace.get("gen_length") or setting(trace, "gen_length", int) or 0)


def block_size_of(trace: Trace) -> int:
    """The run's block size (a trace without one, or with none above 0: the whole answer is one block)."""
    return max(0, setting(trace, "block_size", int) or 0) or answer_length(trace) or 1


def block_start(trace: Trace, block: int) -> int:
    """The absolute position where block ``block`` starts. A block-diffusion run's blocks sit at
    absolute positions from ``blocks_from`` (block 0 may begin inside the prompt: those positions
    stay prompt); a masked run's from the answer's first position."""
    origin = trace.get("blocks_from")
    return (prompt_len(trace) if origin is None else int(origin)) + int(block) * block_size_of(trace)


def block_span(trace: Trace, block: int) -> range:
    """The absolute positions of block ``block``, prompt positions included."""
    start = block_start(trace, block)
    return range(start, start + block_size_of(trace))


def token_text(trace: Trace, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return (trace.get("vocab") or {}).get(str(token_id), f"#{token_id}")


# Other control characters as their Unicode pictures (U+2400 on): a byte token of a random or small
# model may be one, and XML (a slide's SVG) refuses them raw.
_CONTROL_PICTURES = {**{code: 0x2400 + code for code in range(0x20)}, 0x7F: 0x2421}


def visible(text: str) -> str:
    """Whitespace and control characters made visible, so a token that is a space, a newline or a
    control byte still shows up (and stays valid in any markup)."""
    if text == "":
        return "∅"
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍").translate(_CONTROL_PICTURES)


_SPECIAL = re.compile(r"\s*(<\|[^|]*\|>|</s>|<eos>|<pad>)\s*")


def is_end_token(trace: Trace, token_id: int | None) -> bool:
    if token_id is None:
        return False
    model = trace.get("model") or {}
    if token_id in (model.get("stop_ids") or []):
        return True
    if model_kind(model).canvas_steps:  # a canvas model's, transformers' rule: only the end tokens its generation config names
        return False
    text = token_text(trace, token_id)
    return bool(_SPECIAL.fullmatch(text)) and any(w in text.lower() for w in ("end", "eot", "eos", "pad", "/s"))


def first_end(trace: Trace, ids: list[int | None]) -> int | None:
    """The first answer position holding a committed end-of-text token, or None."""
    return next((p for p, t in enumerate(ids) if is_end_token(trace, t)), None)


# ----------------------------------------------------------------------------- the prompt

# A user turn's start and end markers: LLaDA's, Dream's (Qwen's), LLaDA2's and LLaDA-MoE's, Gemma's.
_TURNS = (("<|start_header_id|>user<|end_header_id|>", "<|eot_id|>"), ("<|im_start|>user", "<|im_end|>"),
          ("<role>HUMAN</role>", "<|role_end|>"), ("<start_of_turn>user", "<end_of_turn>"))


def _last_turn(text: str, start_mark: str, end_mark: str) -> str | None:
    """The text of the last complete turn, found with ``str.find``: linear in the text, where a
    regex (marker, whitespace, lazy text, marker) backtracked quadratically over a long run of
    spaces (an 18 kB imported trace held the page for 17 s)."""
    found, at = None, 0
    while (start := text.find(start_mark, at)) >= 0:
        end = text.find(end_mark, start + len(start_mark))
        if end < 0:
            break
        found, at = text[start + len(start_mark) : end], end + len(end_mark)
    return found


def prompt_of(trace: Trace) -> str | None:
    """The prompt of a trace: its ``prompt`` field, else the last user turn of its prompt ids
    decoded with its vocab (the chat template taken off); None when that cannot be done."""
    if isinstance(trace.get("prompt"), str):
        return trace["prompt"]
    vocab = trace.get("vocab") or {}
    try:
        text = "".join(vocab[str(i)] for i in trace.get("prompt_ids") or [])
    except (KeyError, TypeError):
        return None
    for start_mark, end_mark in _TURNS:
        found = _last_turn(text, start_mark, end_mark)
        if found is not None:
            return found.strip()
    return None if "<|" in text or not text.strip() else text.strip()
