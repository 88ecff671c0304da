"""What every policy shares: its validated parameters, and the decoding state it reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .registry import PolicySpec


class Policy:
    """A policy's behaviour. Its parameters (validated by its spec) are attributes: ``self.threshold``."""

    def __init__(self, spec: PolicySpec, params: dict[str, Any]) -> None:
        self.spec = spec
        self.name = spec.name
        self.__dict__.update(params)


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
