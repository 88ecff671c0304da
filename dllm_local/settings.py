"""Every decoding knob in one validated, serialisable object. Its field types are the settings'
schema (pydantic, with the value types of ``values.py``): every knob is read through it whenever
a ``Settings`` is made, from code, a saved file, the command line or the page."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from typing import Any, Literal, get_args, get_type_hints

from pydantic import TypeAdapter
from typing_extensions import TypedDict

from .errors import SettingsError
from .policies import registry
from .policies.registry import MAX_POSITIONS
from .values import FLAG, WORD, integer, number, optional, read

TraceLevel = Literal["off", "summary", "full"]
TRACE_LEVELS = get_args(TraceLevel)
SEED_MAX = 2**63 - 1  # a torch generator's seed is an int64
Length = integer(1, MAX_POSITIONS)
Params = optional(dict[str, Any])  # a policy's parameters, read through its spec (null: none given)


@dataclass(frozen=True)
class Settings:
    gen_length: Length = 128
    block_size: Length = 32
    # Forwards per generation for the `fixed` schedule (LLaDA's `steps`); None: one token per step.
    steps: optional(Length) = None
    temperature: number(0) = 0.0
    seed: integer(0, SEED_MAX) = 0
    cache: WORD = "none"
    cache_params: Params = field(default_factory=dict)
    unmask: WORD = "fixed"
    unmask_params: Params = field(default_factory=dict)
    trace: TraceLevel = "summary"
    exact_drift: FLAG = False
    early_stop: FLAG = False

    def __post_init__(self) -> None:
        knobs = read(_schema(), {f.name: getattr(self, f.name) for f in fields(self)}, "settings")
        for name, value in knobs.items():
            object.__setattr__(self, name, value)
        if self.gen_length % self.block_size:
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

    @property
    def cache_spec(self) -> registry.PolicySpec:
        return registry.get("cache", self.cache)

    @property
    def unmask_spec(self) -> registry.PolicySpec:
        return registry.get("unmask", self.unmask)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_size

    def to_dict(self) -> dict:
        return asdict(self)

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
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return cls(**data)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def for_problem(self, index: int) -> "Settings":
        """The settings for the ``index``-th problem of a set: its own seed (seed + index), so
        sampled answers are independent across problems and the whole set still reproduces."""
        return replace(self, seed=self.seed + index)


@cache
def _schema() -> TypeAdapter:
    """The knobs' schema: ``Settings``' own field types, as one mapping."""
    return TypeAdapter(TypedDict("Settings", get_type_hints(Settings, include_extras=True)))


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
