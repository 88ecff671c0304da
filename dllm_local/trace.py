"""The trace: one plain, serialisable record per model forward. The page is built only from it."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from .errors import TraceError

SCHEMA_VERSION = 1
# The KV panel's views of a trace: the cache's drift (from each step's ``kv``), and, from its
# ``exact`` diagnostic, the true drift and the cache-vs-exact error. A preset may open on one.
KV_VIEWS = ("drift", "true_drift", "cache_error")


@dataclass
class StepRecord:
    step: int
    block: int
    step_in_block: int
    full_refresh: bool
    g: int  # positions recomputed by the main forward
    reads: int  # cached K/V entries read instead of recomputed
    committed: list[list]  # [position, token id, confidence at commit]
    forwards: int  # main forward plus any verification forwards
    model_ms: float  # forwards of the diffusion model (and the guider), device-synchronised
    other_ms: float  # policies, sampling and trace bookkeeping
    masked_positions: list[int] = field(default_factory=list)  # still-masked positions scored this step
    masked_confidence: list[float] = field(default_factory=list)  # their max softmax probability
    recomputed: list[int] | None = None  # full trace only
    kv: dict[str, Any] | None = None  # per layer cosine with the entry's previous value
    exact: dict[str, Any] | None = None  # exact-drift diagnostic (its cost is exact_ms, apart)
    exact_ms: float = 0.0
    policy: dict[str, Any] = field(default_factory=dict)
    revoked: list[list] = field(default_factory=list)  # [position, token, confidence at commit, now]: back to mask
    # Full trace only: the block's masked positions this forward scored, each with its three
    # likeliest tokens: [position, [[token, probability], ...]].
    top_candidates: list[list] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The record as a dict sharing its lists: a record is never changed once emitted, and a
        deep copy per step (``dataclasses.asdict``) cost the engine thread a tenth of a run."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Stats:
    nfe: int = 0  # diffusion-model forwards, verification included
    guider_forwards: int = 0
    exact_forwards: int = 0
    gen_length: int = 0
    content_tokens: int = 0  # answer tokens before the first EOS/EOT
    tokens_per_forward: float = 0.0
    content_tokens_per_forward: float = 0.0
    mean_g: float = 0.0
    cache_hit_rate: float = 0.0
    model_s: float = 0.0
    model_share_s: float = 0.0  # of model_s, this request's share: a batch's forward split by positions computed
    prefill_s: float = 0.0  # of model_s: the first forward (the prompt and the all-mask answer)
    refresh_s: float = 0.0  # of model_s: the later forwards that recomputed everything (block-start refreshes)
    other_s: float = 0.0
    exact_s: float = 0.0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0  # all committed tokens over model time
    content_tokens_per_s: float = 0.0
    stopped: bool = False
    revisions: int = 0  # committed tokens taken back to mask
    batch_size: int = 1  # requests decoded together (the forwards' time is the whole batch's)


@dataclass
class Trace:
    settings: dict
    model: dict
    prompt_ids: list[int]
    gen_length: int
    mask_id: int
    steps: list[StepRecord] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    vocab: dict[str, str] = field(default_factory=dict)  # token id (as text) -> its text
    stats: Stats = field(default_factory=Stats)
    text: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def to_dict(self) -> dict:
        """Plain dict of the trace; step records are shared, not copied (see ``StepRecord.to_dict``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "steps": [s.to_dict() for s in self.steps], "stats": asdict(self.stats),
                "settings": dict(self.settings), "vocab": dict(self.vocab)}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "Trace":
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"trace schema version {version!r} is not supported (this build reads {SCHEMA_VERSION})")
        data = dict(data)
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        data["stats"] = Stats(**data.get("stats", {}))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(json.loads(text))


def fold(events: Iterable[dict]) -> Iterator[dict]:
    """A run's streamed events with the trace they describe so far: the one place a stream
    becomes a trace (the session and the page both read it from here).

    In: ``{"start": header}`` (a trace with no steps yet), ``{"step": record, "vocab": {id: text}}``
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
        else:
            trace.update(event["end"])
        yield {**event, "trace": trace}


# ---------------------------------------------------------------- imported traces

MAX_GEN_LENGTH = 4096  # the largest answer region an imported trace may claim
MAX_TRACE_BYTES = 64 * 2**20
MAX_TRACE_CELLS = 4 * 10**7  # steps x positions: 320 MB per float64 array a view builds from them


def load_trace_file(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """A trace file read, checked in full (``validate_trace``) and turned into a ``Trace``;
    anything else is a TraceError saying what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TraceError(f"trace file {path.name} is {size / 2**20:.1f} MB; the limit is {max_bytes / 2**20:.0f} MB")
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise TraceError(f"trace file {path} could not be read ({exc.strerror or exc})") from exc
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, or nesting without end
        raise TraceError(f"trace file {path.name} is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    validate_trace(data)
    return Trace.from_dict(data)


def validate_trace(data: Any) -> None:
    """Check a trace in ``Trace.to_dict()`` form against the whole schema before anything is drawn
    from it; raise TraceError naming the first field that is wrong."""
    _typed(data, dict, "the trace", "an object (a trace saved by dllm-local)")
    _required(data, ("schema_version", "settings", "model", "prompt_ids", "gen_length", "mask_id", "steps"), "the trace")
    if data["schema_version"] != SCHEMA_VERSION:
        _fail("schema_version", f"is {_show(data['schema_version'])}; this build reads version {SCHEMA_VERSION}")
    _settings(data["settings"])
    _model(data["model"])
    gen_length = _int(data["gen_length"], "gen_length", 1, MAX_GEN_LENGTH)
    prompt_len = len(_ints(data["prompt_ids"], "prompt_ids"))
    _int(data["mask_id"], "mask_id")
    final_ids = _ints(data.get("final_ids", []), "final_ids")
    if final_ids and len(final_ids) != gen_length:
        _fail("final_ids", f"has {len(final_ids)} ids; gen_length is {gen_length}")
    vocab = _typed(data.get("vocab", {}), dict, "vocab", "an object of token id -> text")
    for key, text in vocab.items():
        _typed(text, str, f"vocab[{key!r}]", "text")
    _stats(data.get("stats", {}))
    _typed(data.get("text", ""), str, "text", "text")
    answer = range(prompt_len, prompt_len + gen_length)
    steps = _typed(data["steps"], list, "steps", "a list")
    # The views build steps x sequence arrays of float64: bounded before anything is drawn.
    cells = len(steps) * (prompt_len + gen_length)
    if cells > MAX_TRACE_CELLS:
        _fail("steps", f"has {len(steps)} steps over {prompt_len + gen_length} positions ({cells:,} cells); "
                       f"the page draws at most {MAX_TRACE_CELLS:,}")
    for i, step in enumerate(steps):
        _step(step, f"steps[{i}]", answer)


_STEP_FIELDS = {f.name: f for f in fields(StepRecord)}


def _step(step: Any, where: str, answer: range) -> None:
    _typed(step, dict, where, "an object")
    _known_keys(step, set(_STEP_FIELDS), where)
    _required(step, [n for n, f in _STEP_FIELDS.items() if f.default is MISSING and f.default_factory is MISSING], where)
    for name in ("step", "block", "step_in_block", "g", "reads", "forwards"):
        _int(step[name], f"{where}.{name}")
    _typed(step["full_refresh"], bool, f"{where}.full_refresh", "true or false")
    for name in ("model_ms", "other_ms", "exact_ms"):
        _number(step.get(name, 0.0), f"{where}.{name}")
    _token_entries(step["committed"], f"{where}.committed", answer, ["confidence"])
    positions = _typed(step.get("masked_positions", []), list, f"{where}.masked_positions", "a list")
    for j, position in enumerate(positions):
        _position(position, f"{where}.masked_positions[{j}]", answer)
    confidence = _typed(step.get("masked_confidence", []), list, f"{where}.masked_confidence", "a list")
    if len(confidence) != len(positions):
        _fail(f"{where}.masked_confidence", f"has {len(confidence)} values for {len(positions)} masked_positions")
    _numbers(confidence, f"{where}.masked_confidence")
    for j, entry in enumerate(_typed(step.get("top_candidates", []), list, f"{where}.top_candidates", "a list")):
        at = f"{where}.top_candidates[{j}]"
        if type(entry) is not list or len(entry) != 2 or type(entry[1]) is not list:
            _fail(at, f"must be [position, [[token, probability], ...]], not {_show(entry)}")
        _position(entry[0], f"{at}[0]", answer)
        for k, pair in enumerate(entry[1]):
            if type(pair) is not list or len(pair) != 2:
                _fail(f"{at}[1][{k}]", f"must be [token, probability], not {_show(pair)}")
            _int(pair[0], f"{at}[1][{k}][0]")
            _number(pair[1], f"{at}[1][{k}][1]")
    if step.get("recomputed") is not None:
        for j, position in enumerate(_typed(step["recomputed"], list, f"{where}.recomputed", "a list or null")):
            _position(position, f"{where}.recomputed[{j}]", range(answer.stop))
    if step.get("kv") is not None:
        _kv(step["kv"], f"{where}.kv")
    if step.get("exact") is not None:
        _exact(step["exact"], f"{where}.exact")
    _policy(_typed(step.get("policy", {}), dict, f"{where}.policy", "an object"), f"{where}.policy", answer)
    _token_entries(step.get("revoked", []), f"{where}.revoked", answer, ["confidence then", "confidence now"])


def _token_entries(entries: Any, where: str, answer: range, numbers: list[str]) -> None:
    """A list of [position, token, number...] entries (commits, take-backs, rejections)."""
    shape = f"[position, token, {', '.join(numbers)}]"
    for j, entry in enumerate(_typed(entries, list, where, "a list")):
        at = f"{where}[{j}]"
        if type(entry) is not list or len(entry) != 2 + len(numbers):
            _fail(at, f"must be {shape}, not {_show(entry)}")
        _position(entry[0], f"{at}[0]", answer)
        _int(entry[1], f"{at}[1]")
        for k in range(2, len(entry)):
            _number(entry[k], f"{at}[{k}]")


def _policy(info: dict, where: str, answer: range) -> None:
    """What a policy adds to a step: the fields the views read typed, any other a plain value."""
    for name, value in info.items():
        at = f"{where}.{name}"
        if name == "rejected_at":
            _token_entries(value, at, answer, ["score"])
        elif name == "guider_accepted":
            _int(value, at, 0, MAX_GEN_LENGTH)
        elif name == "refresh_next":
            _typed(value, bool, at, "true or false")
        elif name == "drift":
            if value is not None:
                _number(value, at)
        elif isinstance(value, (list, dict)):
            _fail(at, f"must be a number, text, true, false or null, not {_show(value)}")


def _settings(settings: Any) -> None:
    """The trace's settings, as ``Settings`` takes them: a saved setting of known policies that does
    not load (an unknown parameter, a value out of its range) is told here, not when a view reads it."""
    from .errors import DllmError
    from .policies import registry
    from .settings import Settings

    _typed(settings, dict, "settings", "an object")
    if settings.get("cache") not in registry.CACHE or settings.get("unmask") not in registry.UNMASK:
        return  # policies this build lacks (a plugin's): the page replays such a trace without its settings
    try:
        Settings.from_dict(settings)
    except DllmError as exc:
        _fail("settings", f"do not load: {exc}")


def _model(model: Any) -> None:
    _typed(model, dict, "model", "an object")
    if "name" in model:
        _typed(model["name"], str, "model.name", "text")
    if "stop_ids" in model:
        _ints(model["stop_ids"], "model.stop_ids")
    for name, value in model.items():
        if name not in ("name", "stop_ids") and isinstance(value, (list, dict)):
            _fail(f"model.{name}", f"must be a number, text, true, false or null, not {_show(value)}")


def _kv(kv: Any, where: str) -> None:
    """Per layer, named cosines: a list per position (null where the cache held nothing) or one number."""
    for layer, entry in _typed(kv, dict, where, "an object of layer -> values").items():
        for name, value in _typed(entry, dict, f"{where}.{layer}", "an object").items():
            if type(value) is list:
                _numbers(value, f"{where}.{layer}.{name}")
            elif value is not None:
                _number(value, f"{where}.{layer}.{name}")


def _exact(exact: Any, where: str) -> None:
    _typed(exact, dict, where, "an object or null")
    _number(exact.get("max_prob_error", 0.0), f"{where}.max_prob_error")
    if exact.get("argmax_agree") is not None:
        _typed(exact["argmax_agree"], bool, f"{where}.argmax_agree", "true, false or null")
    for name in ("true_drift", "cache_vs_exact"):
        _kv(exact.get(name, {}), f"{where}.{name}")


def _stats(stats: Any) -> None:
    _known_keys(_typed(stats, dict, "stats", "an object"), {f.name for f in fields(Stats)}, "stats")
    for name, value in stats.items():
        if type(value) is not bool:
            _number(value, f"stats.{name}")


# ---------------------------------------------------------------- checks that name the field

def _fail(where: str, problem: str) -> NoReturn:
    raise TraceError(f"not a valid trace: {where} {problem}")


def _show(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    return "null" if value is None else repr(value)[:40]


def _typed(value: Any, kind: type, where: str, what: str) -> Any:
    if type(value) is not kind:
        _fail(where, f"must be {what}, not {_show(value)}")
    return value


def _known_keys(data: dict, known: set[str], where: str) -> None:
    """Steps and stats are rebuilt as dataclasses, which take no other fields."""
    unknown = sorted(set(data) - known)
    if unknown:
        _fail(where, f"has unknown field(s) {', '.join(map(repr, unknown[:5]))}")


def _required(data: dict, names: Iterable[str], where: str) -> None:
    missing = [name for name in names if name not in data]
    if missing:
        _fail(where, f"has no {', '.join(missing)}")


def _int(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"in {low}..{high}" if high is not None else f">= {low}"
        _fail(where, f"must be an integer {bounds}, not {_show(value)}")
    return value


def _ints(values: Any, where: str) -> list[int]:
    for j, value in enumerate(_typed(values, list, where, "a list of integers")):
        _int(value, f"{where}[{j}]")
    return values


def _position(value: Any, where: str, allowed: range) -> None:
    if type(value) is not int or value not in allowed:
        _fail(where, f"must be a position in {allowed.start}..{allowed.stop - 1}, not {_show(value)}")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _number(value: Any, where: str) -> None:
    if not _is_number(value):
        _fail(where, f"must be a finite number, not {_show(value)}")


def _numbers(values: list, where: str) -> None:
    """Numbers or nulls; checked in one pass, the index found only when one is wrong (a full
    trace holds millions of them)."""
    if not all(value is None or _is_number(value) for value in values):
        j = next(j for j, value in enumerate(values) if not (value is None or _is_number(value)))
        _fail(f"{where}[{j}]", f"must be a number or null, not {_show(values[j])}")
