"""Every decoding knob in one validated, serialisable object. Its field types are the settings'
schema (pydantic, with the value types of ``values.py``): every knob is read through it whenever
a ``Settings`` is made, from code, a saved file, the command line or the page, and each carries
the label and help text those show (``knob``)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from typing import Any, Literal, get_args, get_origin, get_type_hints

from annotated_types import Ge, Gt, Le, Lt
from pydantic import TypeAdapter
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict

from .canvas.settings import check_canvas_params
from .errors import SettingsError, listed
from .limits import MAX_GEN_LENGTH, SEED_MAX
from .policies import registry
from .trace import declare_settings_check
from .values import FLAG, WORD, about, integer, number, optional, read

TraceLevel = Literal["off", "summary", "full"]
TRACE_LEVELS = get_args(TraceLevel)
ForwardMode = Literal["auto", "eager", "compiled", "graphs"]  # dllm_local/runner/modes.py
AttentionBackendName = Literal["sdpa", "flex"]  # dllm_local/models/attention_backends/ (BACKENDS)
Length = integer(1, MAX_GEN_LENGTH)
Params = optional(dict[str, Any])  # a policy's parameters, read through its spec (null: none given)


@dataclass(frozen=True)
class Settings:
    gen_length: about(Length, "Generation length", "tokens in the answer region", top=1024) = 128
    block_size: about(Length, "Block size", "tokens decoded together, block after block; divides the generation "
                      "length unless the blocks are absolute", top=128) = 32
    steps: about(optional(Length), "Steps (fixed schedule)",
                 "forwards for the fixed schedule, LLaDA's steps; none: one token per step", top=1024) = None
    # Any finite temperature samples; past 2 the tokens are near uniform, so the page's slider ends there.
    temperature: about(number(0), "Temperature", "0 decodes greedily; above 0 each token is sampled", top=2.0) = 0.0
    seed: about(integer(0, SEED_MAX), "Seed", "the sampling seed; the same seed and settings give the same "
                "tokens") = 0
    cache: about(WORD, "Cache policy", "what each forward recomputes and what it reuses from the KV cache") = "none"
    cache_params: about(Params, "Cache parameters", "the cache policy's parameters (its defaults where not "
                        "given)") = field(default_factory=dict)
    unmask: about(WORD, "Unmasking policy", "which masked positions each step commits") = "fixed"
    unmask_params: about(Params, "Unmasking parameters", "the unmasking policy's parameters (its defaults where "
                         "not given)") = field(default_factory=dict)
    trace: about(TraceLevel, "Trace", "what each step records: off (counters only), summary (commits, "
                 "confidences, KV drift), full (also every recomputed position and the top candidates)") = "summary"
    exact_drift: about(FLAG, "Exact-drift diagnostic", "a full forward each step, to measure the cache's true drift "
                       "(its cost reported apart)") = False
    early_stop: about(FLAG, "Early stop", "end the run once a stop token has no mask before it") = False
    forward_mode: about(ForwardMode, "Forward mode", "how each forward runs: eager (op by op), compiled "
                        "(torch.compile, one graph), graphs (compiled and replayed as CUDA graphs); auto: graphs on a "
                        "CUDA GPU, else eager. The tokens are the same; a mode that cannot run falls back to eager "
                        "with a notice") = "auto"
    attention_backend: about(AttentionBackendName, "Attention backend", "what attends each forward's queries: "
                             "sdpa (PyTorch's scaled dot-product attention over a dense mask; a batch's requests "
                             "padded to the longest) or flex (FlexAttention with the mask as a rule; a batch's "
                             "requests unpadded). The tokens are the same") = "sdpa"
    canvas_params: about(Params, "Canvas parameters", "a canvas model's (DiffusionGemma's) own knobs: "
                         "max_denoising_steps, canvas_length, entropy_bound, t_max, t_min, stability_threshold, "
                         "confidence_threshold (its generation_config.json's where not given)") = field(default_factory=dict)
    # A block-diffusion model's blocks sit at absolute positions whatever this says; it says which
    # lengths the settings accept, so the rule is checked before the model loads (run_blocks).
    absolute_blocks: about(FLAG, "Absolute blocks", "blocks at absolute positions p // block_size, as a "
                           "block-diffusion model places them (its default): any generation length, the answer "
                           "running on to the end of its last block; off, block 0 starts at the answer and the "
                           "block divides it") = False

    def __post_init__(self) -> None:
        knobs = read(_schema(), {f.name: getattr(self, f.name) for f in fields(self)}, "settings")
        for name, value in knobs.items():
            object.__setattr__(self, name, value)
        if self.gen_length % self.block_size and not self.absolute_blocks:
            raise SettingsError(
                f"block_size {self.block_size} does not divide gen_length {self.gen_length}; "
                f"use a divisor such as {', '.join(map(str, divisors(self.gen_length)[-4:]))}"
            )
        # At most one forward per token: every step of the schedule then commits at least one.
        if self.steps is not None and not self.num_blocks <= self.steps <= self.gen_length:
            raise SettingsError(f"steps must be an integer from the number of blocks ({self.num_blocks}) to "
                                f"gen_length ({self.gen_length}), not {self.steps}")
        for kind in ("cache", "unmask"):
            spec = registry.get(kind, getattr(self, kind))
            given = getattr(self, f"{kind}_params") or {}  # null in a saved file: no parameters given
            valid = spec.validate(given)
            # Keep only the parameters given (typed), so a saved setting stays as written.
            object.__setattr__(self, f"{kind}_params", {k: valid[k] for k in given})
        object.__setattr__(self, "canvas_params", check_canvas_params(self.canvas_params or {}))
        problem = registry.pair_problem(self.cache_spec, self.unmask_spec)
        if problem:
            raise SettingsError(problem)
        if self.early_stop and self.cache_spec.slides:
            raise SettingsError(f"early_stop: the {self.cache} cache ends the answer at its first committed end of "
                                f"text by itself; leave early_stop off")

    def knobs_set(self) -> dict[str, Any]:
        """The knobs set away from their defaults: each one the model's kind must have
        (``kinds.ModelKind.check_knobs``)."""
        defaults = Settings()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)}

    @property
    def cache_spec(self) -> registry.PolicySpec:
        return registry.get("cache", self.cache)

    @property
    def unmask_spec(self) -> registry.PolicySpec:
        return registry.get("unmask", self.unmask)

    @property
    def num_blocks(self) -> int:
        """The answer's blocks, or with absolute blocks the fewest a run can have (a prompt
        ending on a block boundary)."""
        return -(-self.gen_length // self.block_size)

    def to_dict(self) -> dict:
        """The knobs as a mapping; a masked model's settings (no canvas knob given) read as before."""
        data = asdict(self)
        for name in ("canvas_params", "absolute_blocks"):  # unset, left out: earlier settings read as before
            if not data[name]:
                del data[name]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        if not isinstance(data, dict):
            raise SettingsError(f"settings must be a mapping of knob to value, not {type(data).__name__}")
        data = dict(data)
        remasking = data.pop("remasking", None)  # before it became a parameter of the fixed schedule
        if remasking not in (None, "low_confidence") and data.get("unmask", "fixed") == "fixed":
            data["unmask_params"] = {**(data.get("unmask_params") or {}), "remasking": remasking}
        known = {f.name for f in fields(cls)}
        unknown = set(map(str, data)) - known
        if unknown:
            raise SettingsError(listed(unknown, "unknown setting"))
        return cls(**data)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def for_problem(self, index: int) -> "Settings":
        """The settings for the ``index``-th problem of a set: its own seed (seed + index), so
        sampled answers are independent across problems and the whole set still reproduces. Past
        SEED_MAX it wraps to 0: any seed the schema accepts works for a set of any size."""
        return replace(self, seed=(self.seed + index) % (SEED_MAX + 1))


@cache
def _schema() -> TypeAdapter:
    """The knobs' schema: ``Settings``' own field types, as one mapping."""
    return TypeAdapter(TypedDict("Settings", get_type_hints(Settings, include_extras=True)))


@dataclass(frozen=True)
class Knob:
    """One knob as the command line and the page offer it."""
    name: str
    default: Any
    label: str
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    top: float | None = None  # the page's slider ends here (within low..high): the useful range, at a glance


def knob(name: str) -> Knob:
    """The knob ``name`` of ``Settings``: its default, label, help, bounds and choices from its
    field (a choice of policy from the registry, so plugins count)."""
    field_ = next((f for f in fields(Settings) if f.name == name), None)
    if field_ is None:
        raise SettingsError(f"unknown setting {name!r}")
    parts = list(_parts(get_type_hints(Settings, include_extras=True)[name]))
    about_ = next(p for p in parts if isinstance(p, FieldInfo) and p.title)
    low = next((p.ge if isinstance(p, Ge) else p.gt for p in parts if isinstance(p, (Ge, Gt))), None)
    high = next((p.le if isinstance(p, Le) else p.lt for p in parts if isinstance(p, (Le, Lt))), None)
    if name in ("cache", "unmask"):
        choices = tuple(registry.CACHE if name == "cache" else registry.UNMASK)
    else:
        choices = next((get_args(p) for p in parts if get_origin(p) is Literal), ())
    default = field_.default_factory() if callable(field_.default_factory) else field_.default
    return Knob(name, default, about_.title, about_.description, low, high, choices, about_.json_schema_extra["top"])


def _parts(kind: Any) -> Iterator[Any]:
    """``kind``, its annotations and its members, all the way down: an optional's bounds are its member's."""
    yield kind
    for part in get_args(kind):
        yield from _parts(part)
    if isinstance(kind, FieldInfo):
        yield from kind.metadata


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def length_notice(gen_length: int, trained_length: int | None) -> str:
    """A warning (not a refusal) when ``gen_length`` is past the longest answer region the model
    was trained on; empty when it is not, or when the model does not say (real checkpoints)."""
    if trained_length is None or gen_length <= trained_length:
        return ""
    return (f"Generation length {gen_length} is past the longest this model was trained for ({trained_length}): "
            f"it may not end cleanly or answer at all there.")


def loadable(value: dict) -> dict:
    """A settings mapping as a schema field takes it (a pydantic validator): kept as given, once
    ``Settings`` loads it; a ValueError naming the knob otherwise."""
    try:
        Settings.from_dict(value)
    except SettingsError as exc:
        raise ValueError(str(exc)) from None
    return value


def trace_settings(settings: dict) -> dict:
    """A trace's settings (a pydantic validator): those of known policies load through ``Settings``;
    a plugin's this build lacks are kept unread (the page replays such a trace without its settings)."""
    named = [settings.get(kind) for kind in ("cache", "unmask")]
    if not all(isinstance(name, str) for name in named) or (named[0] in registry.CACHE and named[1] in registry.UNMASK):
        try:
            loadable(settings)
        except ValueError as exc:
            raise ValueError(f"do not load: {exc}") from None
    return settings


declare_settings_check(trace_settings)
