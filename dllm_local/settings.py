"""Every decoding knob in one validated, serialisable object."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import SettingsError

TRACE_LEVELS = ("off", "summary", "full")
REMASKING = ("low_confidence", "random")


@dataclass(frozen=True)
class Settings:
    gen_length: int = 128
    block_size: int = 32
    # Forwards per generation for the `fixed` schedule (LLaDA's `steps`); None: one token per step.
    steps: int | None = None
    temperature: float = 0.0
    seed: int = 0
    remasking: str = "low_confidence"
    cache: str = "none"
    cache_params: dict[str, Any] = field(default_factory=dict)
    unmask: str = "fixed"
    unmask_params: dict[str, Any] = field(default_factory=dict)
    trace: str = "summary"
    exact_drift: bool = False
    early_stop: bool = False

    def __post_init__(self) -> None:
        from .policies import CACHE_POLICIES, UNMASK_POLICIES

        if not isinstance(self.gen_length, int) or self.gen_length < 1:
            raise SettingsError(f"gen_length must be a positive integer, not {self.gen_length!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise SettingsError(f"block_size must be a positive integer, not {self.block_size!r}")
        if self.gen_length % self.block_size:
            raise SettingsError(
                f"block_size {self.block_size} does not divide gen_length {self.gen_length}; "
                f"use a divisor such as {', '.join(map(str, divisors(self.gen_length)[-4:]))}"
            )
        if self.steps is not None:
            if self.steps < self.num_blocks:
                raise SettingsError(f"steps ({self.steps}) must be at least the number of blocks ({self.num_blocks})")
        if self.temperature < 0:
            raise SettingsError(f"temperature must be >= 0, not {self.temperature}")
        if self.remasking not in REMASKING:
            raise SettingsError(f"remasking must be one of {', '.join(REMASKING)}, not {self.remasking!r}")
        if self.trace not in TRACE_LEVELS:
            raise SettingsError(f"trace must be one of {', '.join(TRACE_LEVELS)}, not {self.trace!r}")
        if self.cache not in CACHE_POLICIES:
            raise SettingsError(f"cache policy must be one of {', '.join(CACHE_POLICIES)}, not {self.cache!r}")
        if self.unmask not in UNMASK_POLICIES:
            raise SettingsError(f"unmask policy must be one of {', '.join(UNMASK_POLICIES)}, not {self.unmask!r}")
        # Building the policies validates their parameters; the messages name the knob.
        CACHE_POLICIES[self.cache].from_params(self.cache_params)
        UNMASK_POLICIES[self.unmask].from_params(self.unmask_params)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_size

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
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
