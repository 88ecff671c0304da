"""Every decoding knob in one validated, serialisable object."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import SettingsError
from .policies import registry
from .policies.registry import MAX_POSITIONS
from .values import check_value

TRACE_LEVELS = ("off", "summary", "full")
SEED_MAX = 2**63 - 1  # a torch generator's seed is an int64


@dataclass(frozen=True)
class Settings:
    gen_length: int = 128
    block_size: int = 32
    # Forwards per generation for the `fixed` schedule (LLaDA's `steps`); None: one token per step.
    steps: int | None = None
    temperature: float = 0.0
    seed: int = 0
    cache: str = "none"
    cache_params: dict[str, Any] = field(default_factory=dict)
    unmask: str = "fixed"
    unmask_params: dict[str, Any] = field(default_factory=dict)
    trace: str = "summary"
    exact_drift: bool = False
    early_stop: bool = False

    def __post_init__(self) -> None:
        def typed(knob: str, kind: type, rule: str, ok=lambda v: True) -> None:
            object.__setattr__(self, knob, check_value(getattr(self, knob), kind, knob, rule, ok))

        typed("gen_length", int, f"an integer from 1 to {MAX_POSITIONS}", lambda v: 1 <= v <= MAX_POSITIONS)
        typed("block_size", int, "a positive integer", lambda v: v >= 1)
        if self.gen_length % self.block_size:
            raise SettingsError(
                f"block_size {self.block_size} does not divide gen_length {self.gen_length}; "
                f"use a divisor such as {', '.join(map(str, divisors(self.gen_length)[-4:]))}"
            )
        if self.steps is not None:
            # At most one forward per token: every step of the schedule then commits at least one.
            typed("steps", int, f"an integer from the number of blocks ({self.num_blocks}) to gen_length ({self.gen_length})",
                  lambda v: self.num_blocks <= v <= self.gen_length)
        typed("temperature", float, "a finite number >= 0", lambda v: v >= 0)
        typed("seed", int, f"an integer in [0, {SEED_MAX}]", lambda v: 0 <= v <= SEED_MAX)
        typed("trace", str, f"one of {', '.join(TRACE_LEVELS)}", lambda v: v in TRACE_LEVELS)
        typed("exact_drift", bool, "true or false")
        typed("early_stop", bool, "true or false")
        for kind in ("cache", "unmask"):
            typed(kind, str, "a policy name")
            spec = registry.get(kind, getattr(self, kind))
            given = getattr(self, f"{kind}_params")
            given = {} if given is None else given  # null in a saved file: no parameters given
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
