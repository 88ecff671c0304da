"""What every policy shares: parameters as dataclass fields, validated by name."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from ..errors import SettingsError


class Policy:
    name: ClassVar[str]

    @classmethod
    def from_params(cls, params: dict[str, Any] | None):
        params = dict(params or {})
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(params) - known)
        if unknown:
            raise SettingsError(
                f"{cls.name}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}"
            )
        policy = cls(**params)
        policy.validate()
        return policy

    def validate(self) -> None:
        """Raise SettingsError naming the knob when a parameter is out of range."""

    def _require(self, ok: bool, knob: str, rule: str) -> None:
        if not ok:
            raise SettingsError(f"{self.name}: {knob} must be {rule}, not {getattr(self, knob)!r}")


@dataclass
class DecodeState:
    """Where decoding stands: the sequence and the current block. Policies only read it."""

    x: torch.Tensor  # [1, total_len] token ids
    prompt_len: int
    gen_length: int
    block_size: int
    mask_id: int
    steps_per_block: int
    block: int = 0
    step: int = 0  # forwards so far (0-based index of the step being planned)
    step_in_block: int = 0

    @property
    def total_len(self) -> int:
        return self.x.shape[1]

    @property
    def block_start(self) -> int:
        return self.prompt_len + self.block * self.block_size

    @property
    def block_end(self) -> int:
        return self.block_start + self.block_size

    @property
    def masked(self) -> torch.Tensor:
        return self.x[0] == self.mask_id

    def block_positions(self) -> torch.Tensor:
        return torch.arange(self.block_start, self.block_end, device=self.x.device)

    def block_masked_positions(self) -> torch.Tensor:
        pos = self.block_positions()
        return pos[self.masked[pos]]

    def all_positions(self) -> torch.Tensor:
        return torch.arange(self.total_len, device=self.x.device)
