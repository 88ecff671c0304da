"""The trace: one plain, serialisable record per model forward. The page is built only from it.

The dataclasses below are also the trace file's schema: their field types (pydantic's, read only
when a trace comes from outside) state each field's type, range and size, and ``parse_trace`` is
the one way an outside trace becomes a ``Trace``."""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import (AfterValidator, BeforeValidator, ConfigDict, Field, PlainValidator, Strict, TypeAdapter,
                      ValidationError, ValidationInfo, WrapValidator)
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from .canvas.trace import Canvas, Count
from .errors import TraceError, schema_message
from .files import parse_json, read_json
from .limits import MAX_GEN_LENGTH, MAX_TRACE_BYTES
from .values import Flag, Number, Text

SCHEMA_VERSION = 1
# The KV panel's views of a trace: the cache's drift (from each step's ``kv``), and, from its
# ``exact`` diagnostic, the true drift and the cache-vs-exact error. A preset may open on one.
KV_VIEWS = ("drift", "true_drift", "cache_error")

MAX_TRACE_CELLS = 4 * 10**7  # steps x positions: 320 MB per float64 array a view builds from them


# ---------------------------------------------------------------- field types of the schema
# Ranges that depend on the trace itself (positions in its answer) read the answer region from the
# validation context, which the ``gen_length`` field sets: fields are validated in their order.

def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _answer(info: ValidationInfo) -> range | None:
    return (info.context or {}).get("answer")


def _set_answer(gen_length: int, info: ValidationInfo) -> int:
    if info.context is not None:
        prompt_len = len(info.data.get("prompt_ids") or ())
        info.context["answer"] = range(prompt_len, prompt_len + gen_length)
    return gen_length


def _position(position: int, info: ValidationInfo, in_answer: bool = True) -> int:
    """A position in the answer region, or (``in_answer=False``) anywhere in the sequence."""
    answer = _answer(info)
    if answer is not None and position not in (answer if in_answer else range(answer.stop)):
        low = answer.start if in_answer else 0
        raise PydanticCustomError("position", "must be a position in {low}..{high}", {"low": low, "high": answer.stop - 1})
    return position


TokenId = Count
Scalar = Annotated[int, Strict()] | Number | Text | Flag | None  # a value a policy or a model adds, kept as it is
AnswerPosition = Annotated[int, Strict(), AfterValidator(_position)]
SequencePosition = Annotated[int, Strict(), AfterValidator(lambda p, info: _position(p, info, in_answer=False))]


def _token_entry(*numbers: str):
    """[position, token, number...] (a commit, a take-back, a rejection), checked in one call:
    a full trace holds thousands."""
    shape = f"[position, token, {', '.join(numbers)}]"

    def check(entry: Any, info: ValidationInfo) -> list:
        if not (type(entry) is list and len(entry) == 2 + len(numbers) and type(entry[0]) is int
                and type(entry[1]) is int and entry[1] >= 0 and all(map(_finite, entry[2:]))):
            raise PydanticCustomError("entry", f"must be {shape}")
        _position(entry[0], info)
        return entry
    return PlainValidator(check)


def _span(span: list[int]) -> list[int]:
    if len(span) != 2 or span[0] > span[1]:
        raise PydanticCustomError("span", "must be [start, end] with start <= end")
    return span


def _candidates(entry: Any, info: ValidationInfo) -> list:
    if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is int and type(entry[1]) is list
            and all(type(p) is list and len(p) == 2 and type(p[0]) is int and p[0] >= 0 and _finite(p[1])
                    for p in entry[1])):
        raise PydanticCustomError("entry", "must be [position, [[token, probability], ...]]")
    _position(entry[0], info)
    return entry


def _one_per_position(values: list, info: ValidationInfo) -> list:
    answer = _answer(info)
    if answer is not None and len(values) > answer.stop:
        raise PydanticCustomError("too_long", "has {n} values for a sequence of {positions} positions",
                                  {"n": len(values), "positions": answer.stop})
    return values


Committed = Annotated[list, _token_entry("confidence")]
Revoked = Annotated[list, _token_entry("confidence then", "confidence now")]
Edited = Annotated[list, _token_entry("probability", "old token")]
Rejected = Annotated[list, _token_entry("score")]
Candidates = Annotated[list, PlainValidator(_candidates)]
# Per layer, named cosines: a list per position (null where the cache held nothing) or one number.
Cosines = Annotated[list[Number | None], AfterValidator(_one_per_position)] | Number | None
KVCosines = dict[Text, dict[Text, Cosines]]


# What policies add to a step record's ``policy``: each field a registered policy spec declares
# (``PolicySpec.trace_fields``), with its type; any other is a plain value.
_POLICY_FIELDS: dict[str, Any] = {}


def _policy_info() -> type:
    info = TypedDict("PolicyInfo", dict(_POLICY_FIELDS), total=False, extra_items=Scalar)
    info.__pydantic_config__ = ConfigDict(extra="allow")  # the extra items, typed as Scalar
    return info


PolicyInfo = _policy_info()


def declare_policy_fields(fields: dict[str, Any]) -> None:
    """A policy's step fields and their types, for the schema of traces read from now on. Two
    policies may share a field name only with the same type (the views read it one way)."""
    global PolicyInfo
    clash = [name for name, kind in fields.items() if _POLICY_FIELDS.get(name, kind) != kind]
    if clash:
        raise ValueError(f"trace field(s) {', '.join(clash)} already declared with another type")
    if all(name in _POLICY_FIELDS for name in fields):
        return
    _POLICY_FIELDS.update(fields)
    PolicyInfo = _policy_info()
    _schema.cache_clear()


class ExactDiagnostic(TypedDict, total=False):
    max_prob_error: Number
    argmax_agree: Flag | None
    true_drift: KVCosines
    cache_vs_exact: KVCosines


class ModelInfo(TypedDict, total=False, extra_items=Scalar):
    __pydantic_config__ = ConfigDict(extra="allow")
    name: Text
    stop_ids: list[TokenId]
    quantized_modules: list[Text]  # a quantized model's: which modules bitsandbytes took
    canvas_defaults: dict[Text, Scalar]  # a canvas model's knobs when a run leaves them unset
    trained_tasks: list[Text]  # the tiny tasks our models were trained on ([]: random weights)
    shifted_head: Flag  # a position's logits read from the one before it (Dream, Fast-dLLM v2)


def _keep_order(value: Any, handler) -> Any:
    """An object read as a TypedDict keeps its keys in the file's order (a trace round-trips exactly)."""
    parsed = handler(value)
    return {key: parsed[key] for key in value if key in parsed} if type(value) is dict else parsed


InOrder = WrapValidator(_keep_order)


_OMITTED_WHEN_NONE = ("canvas", "stored", "experts", "edited")  # a masked model's records read as before


@dataclass
class StepRecord:
    __pydantic_config__ = ConfigDict(extra="forbid")  # rebuilt as this class, which takes no other fields

    step: Count
    block: Count
    step_in_block: Count
    full_refresh: Flag
    g: Count  # positions recomputed by the main forward
    reads: Count  # cached K/V entries read instead of recomputed
    committed: list[Committed]  # [position, token id, confidence at commit]
    forwards: Count  # the diffusion model's: the step's main forward plus any verification forwards
    model_ms: Number  # forwards of the diffusion model (and the guider), device-synchronised
    other_ms: Number  # policies, sampling and trace bookkeeping
    masked_positions: list[AnswerPosition] = field(default_factory=list)  # still-masked positions scored this step
    masked_confidence: list[Number | None] = field(default_factory=list)  # their max softmax probability
    recomputed: list[SequencePosition] | None = None  # full trace only
    kv: KVCosines | None = None  # per layer cosine with the entry's previous value
    exact: Annotated[ExactDiagnostic, InOrder] | None = None  # exact-drift diagnostic (its cost is exact_ms, apart)
    exact_ms: Number = 0.0
    policy: Annotated[PolicyInfo, InOrder] = field(default_factory=dict)
    revoked: list[Revoked] = field(default_factory=list)  # [position, token, confidence at commit, now]: back to mask
    # Full trace only: the block's masked positions this forward scored, each with its three
    # likeliest tokens: [position, [[token, probability], ...]].
    top_candidates: list[Candidates] = field(default_factory=list)
    guider_forwards: Count = 0  # the guider's forwards this step (apart from ``forwards``; 0 in older traces)
    canvas: Annotated[Canvas, InOrder] | None = None  # a canvas model's step (canvas_trace.py)
    # Block diffusion: [start, end) of the K/V a store forward wrote before this step (the prompt's
    # blocks, or the block just finished), exact from then on.
    stored: Annotated[list[SequencePosition], AfterValidator(_span)] | None = None
    experts: dict[Text, list[Count]] | None = None  # a mixture of experts': layer -> experts routed this step
    edited: list[Edited] | None = None  # [position, new token, its probability, old token]: rewritten in place

    def token_ids(self) -> list[int]:
        """The tokens this record shows: its commits, or a canvas step's draft and kept tokens."""
        shown = [token for _, token, _ in self.committed]
        return shown + self.canvas["draft"] + self.canvas["sampled"] if self.canvas else shown

    def to_dict(self) -> dict:
        """The record as a dict sharing its lists: a record is never changed once emitted, and a
        deep copy per step (``dataclasses.asdict``) cost the engine thread a tenth of a run. A
        masked model's record has no ``canvas`` (its files stay as they were)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _OMITTED_WHEN_NONE or getattr(self, f.name) is not None}


@dataclass
class Stats:
    __pydantic_config__ = ConfigDict(extra="forbid")

    nfe: Count = 0  # diffusion-model forwards, verification included
    guider_forwards: Count = 0
    exact_forwards: Count = 0
    gen_length: Count = 0
    content_tokens: Count = 0  # answer tokens before the first EOS/EOT
    tokens_per_forward: Number = 0.0
    content_tokens_per_forward: Number = 0.0
    mean_g: Number = 0.0
    cache_hit_rate: Number = 0.0
    model_s: Number = 0.0
    model_share_s: Number = 0.0  # of model_s, this request's share: a batch's forward split by positions computed
    prefill_s: Number = 0.0  # of model_s: the first forward (the prompt and the all-mask answer)
    refresh_s: Number = 0.0  # of model_s: the later forwards that recomputed everything (block-start refreshes)
    other_s: Number = 0.0
    exact_s: Number = 0.0
    wall_s: Number = 0.0
    tokens_per_s: Number = 0.0  # all committed tokens over model time
    content_tokens_per_s: Number = 0.0
    stopped: Flag = False
    revisions: Count = 0  # committed tokens taken back to mask
    batch_size: Count = 1  # the most requests one of its forwards packed (that forward's time is theirs together)
    batch_mode: Text = ""  # in the engine's batch: packed (forwards shared) or invariant (its own, as alone); "": alone
    encoder_forwards: Count = 0  # a canvas model's encoder passes (apart from ``nfe``, its decoder's)
    encoder_s: Number = 0.0  # of model_s: those passes
    # Block diffusion: forwards that only wrote K/V (the prompt's blocks, each finished block),
    # apart from ``nfe``, and their time (of model_s).
    store_forwards: Count = 0
    store_s: Number = 0.0
    forward_mode: Text = "eager"  # how the forwards ran (runner/modes.py): the mode asked for, or eager after a fallback
    forward_notice: Text = ""  # why the mode asked for did not run as asked, when it did not
    attention_backend: Text = "sdpa"  # what attended (models/attention_backends/): the settings' backend


def _masked_lists_agree(step: StepRecord) -> StepRecord:
    if len(step.masked_confidence) != len(step.masked_positions):
        raise PydanticCustomError("lengths", "has {n} masked_confidence values for {m} masked_positions",
                                  {"n": len(step.masked_confidence), "m": len(step.masked_positions)})
    return step


def _drawable(steps: Any, info: ValidationInfo) -> Any:
    """The views build steps x sequence arrays of float64: bounded before a step is read."""
    answer = _answer(info)
    if type(steps) is list and answer is not None and max(len(steps), 1) * answer.stop > MAX_TRACE_CELLS:
        raise PydanticCustomError("too_large", "has {n} steps over {positions} positions ({cells} cells); "
                                  "the page draws at most {limit}",
                                  {"n": len(steps), "positions": answer.stop, "cells": f"{len(steps) * answer.stop:,}",
                                   "limit": f"{MAX_TRACE_CELLS:,}"})
    return steps


def _one_id_per_position(final_ids: list[int], info: ValidationInfo) -> list[int]:
    answer = _answer(info)
    if final_ids and answer is not None and len(final_ids) != len(answer):
        raise PydanticCustomError("lengths", "has {n} ids; gen_length is {g}", {"n": len(final_ids), "g": len(answer)})
    return final_ids


# How a trace's settings are read: declared by settings.py, which sits above this module (the page's
# views import the trace and stay free of the settings' policies). Until then they are kept unread.
_SETTINGS_CHECK: list[Callable[[dict], dict]] = []


def declare_settings_check(check: Callable[[dict], dict]) -> None:
    """``check`` reads each trace's settings from now on: the mapping, or a ValueError."""
    _SETTINGS_CHECK[:] = [check]


def _known_settings(settings: dict) -> dict:
    return _SETTINGS_CHECK[0](settings) if _SETTINGS_CHECK else settings


@dataclass
class Branch:
    """A lecturer's intervention: after step ``after_step`` the answer's ``position`` (absolute)
    was set to ``token`` (None: sent back to mask), and decoding went on with the same settings."""
    __pydantic_config__ = ConfigDict(extra="forbid")

    after_step: Count
    position: AnswerPosition
    token: TokenId | None = None
    replaced: TokenId | None = None  # what stood there after that step (None: a mask)


@dataclass
class Trace:
    settings: Annotated[dict[Text, Any], AfterValidator(_known_settings)]
    model: Annotated[ModelInfo, InOrder]
    prompt_ids: list[TokenId]
    gen_length: Annotated[int, Strict(), Field(ge=1, le=MAX_GEN_LENGTH), AfterValidator(_set_answer)]
    mask_id: TokenId
    steps: Annotated[list[Annotated[StepRecord, AfterValidator(_masked_lists_agree)]],
                     BeforeValidator(_drawable)] = field(default_factory=list)
    final_ids: Annotated[list[TokenId], AfterValidator(_one_id_per_position)] = field(default_factory=list)
    vocab: dict[Text, Text] = field(default_factory=dict)  # token id (as text) -> its text
    stats: Stats = field(default_factory=Stats)
    text: Text = ""
    schema_version: Count = SCHEMA_VERSION
    branch: Branch | None = None  # set on a branch: where it left the run it was branched from
    # Block diffusion: where block 0 starts (blocks at absolute positions); None: at the answer.
    blocks_from: SequencePosition | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def to_dict(self) -> dict:
        """Plain dict of the trace; step records are shared, not copied (see ``StepRecord.to_dict``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "branch"
                and (f.name != "blocks_from" or self.blocks_from is not None)}
        branch = {"branch": asdict(self.branch)} if self.branch else {}  # a run's file stays as it was
        return {**data, "steps": [s.to_dict() for s in self.steps], "stats": asdict(self.stats),
                "settings": dict(self.settings), "vocab": dict(self.vocab), **branch}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        return parse_trace(data)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return parse_trace(parse_json(text, "the trace", TraceError))


def fold(events: Iterable[dict]) -> Iterator[dict]:
    """A run's streamed events with the trace they describe so far: the one place a stream
    becomes a trace (the session and the page both read it from here).

    In: ``{"queued": n}`` while the run waits for the engine (n-th in line; the trace is empty),
    ``{"start": header}`` (a trace with no steps yet), ``{"step": record, "vocab": {id: text}}``
    per forward, then ``{"end": the trace without its steps}``. Out: each event as it came, plus
    ``"trace"``: one dict that grows in place (no copy per step), whole once ``"end"`` is in the event.
    """
    trace: dict = {}
    for event in events:
        if "start" in event:
            header = event["start"]
            trace = {**header, "steps": [], "vocab": dict(header.get("vocab") or {})}
        elif "step" in event:
            trace["steps"].append(event["step"])
            trace["vocab"].update(event["vocab"])
        elif "end" in event:
            trace.update(event["end"])
        yield {**event, "trace": trace}


# ---------------------------------------------------------------- imported traces

def load_trace_file(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """A trace file read and parsed (``parse_trace``); anything else is a TraceError saying what is wrong."""
    return parse_trace(read_json(path, max_bytes, f"trace file {Path(path).name}", TraceError))


def parse_trace(data: Any) -> Trace:
    """A trace in ``Trace.to_dict()`` form, checked in full against the schema before anything is
    drawn from it; a TraceError naming the first fields that are wrong and the rule each breaks."""
    if type(data) is not dict:
        raise TraceError("not a valid trace: the trace must be an object (a trace saved by dllm-local)")
    if data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise TraceError(f"not a valid trace: its schema_version is {str(data['schema_version'])[:40]}; "
                         f"this build reads version {SCHEMA_VERSION}")
    try:
        return _schema().validate_python(data, context={})
    except ValidationError as exc:
        raise TraceError(f"not a valid trace: {schema_message(exc, data, subject='the trace')}") from None


@cache
def _schema() -> TypeAdapter:
    return TypeAdapter(Trace)
