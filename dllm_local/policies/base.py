"""What every policy shares: its validated parameters, the decoding state it reads, and the
typed door through which it sees its request's cache."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..softmax import entropy
from .registry import PolicySpec


class Policy:
    """A policy's behaviour. Its parameters (validated by its spec) are attributes: ``self.threshold``."""

    def __init__(self, spec: PolicySpec, params: dict[str, Any]) -> None:
        self.spec = spec
        self.name = spec.name
        self.__dict__.update(params)


class Window(Protocol):
    """An order decoding follows instead of fixed blocks, built by the cache policy
    (``CachePolicy.window``; Flash-Cache's ``window.SlidingWindow``): what the sampler and the
    policies read of it."""

    length: int  # the answer's end for the window: nothing at or past it is committed
    answer_end: int  # the answer's end before any end-of-text (the padding follows)
    eos_id: int
    eos_seen: bool  # a committed end-of-text has fixed ``length``

    def positions(self) -> torch.Tensor:
        """The positions decoded this step."""

    def decoded_order(self) -> torch.Tensor:
        """The decoded positions in the window's order."""

    def done(self) -> bool:
        """Whether every position before ``length`` is decoded."""

    def commit(self, ranked: torch.Tensor, committed: torch.Tensor, tokens: torch.Tensor, newest: int,
               ranking: torch.Tensor | None) -> None:
        """The step's commits (``ranked``: the window's positions by confidence, best first)."""


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
    window: Window | None = None  # the cache policy's order instead of fixed blocks (a sliding window)
    # Where block 0 starts: the answer's first position (masked diffusion), or for block diffusion
    # the block holding it, blocks sitting at absolute positions (a prompt's tail decodes with it).
    blocks_from: int | None = None
    # The current block's masks as the last step's record read them back with its commits (None:
    # not known since, e.g. a new block or a branch's change): whether the block is done, unasked.
    masks_left: int | None = None

    @property
    def total_len(self) -> int:
        return self.x.shape[1]

    @property
    def block_start(self) -> int:
        return (self.prompt_len if self.blocks_from is None else self.blocks_from) + self.block * self.block_size

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

    def decoded_order(self) -> torch.Tensor:
        """Every decoded position, the newest last: the sliding window's order, else (fixed blocks
        decode left to right) position order."""
        if self.window is not None:
            return self.window.decoded_order()
        return (~self.masked).nonzero().flatten()


class CacheSlot(Protocol):
    """A request's KV cache as the engine holds it (``models.cache.CacheView``)."""

    valid: torch.Tensor
    seq_len: int

    def num_cached(self) -> int: ...

    def evict(self, positions: torch.Tensor | None = None) -> None: ...

    def bytes_per_position(self) -> int: ...


class CacheAccess:
    """What a cache policy sees of its request's cache: which entries are valid, how many are
    cached, the step each position was last written at, and eviction (K and V together)."""

    def __init__(self, cache: CacheSlot, length: int) -> None:
        self._cache = cache
        self.write_step = torch.zeros(length, device=cache.valid.device)  # the forward that last wrote each entry

    @property
    def valid(self) -> torch.Tensor:
        return self._cache.valid[: self._cache.seq_len]

    def num_cached(self) -> int:
        return self._cache.num_cached()

    def evict(self, positions: torch.Tensor) -> None:
        self._cache.evict(positions)

    def bytes_per_position(self) -> int:
        return self._cache.bytes_per_position()

    def written(self, positions: torch.Tensor, step: int) -> None:
        """The forward of ``step`` wrote ``positions`` (the sampler says so after each forward)."""
        self.write_step[positions] = float(step)


class StepSignals:
    """What a policy may read of this step's forward beyond the drafts, each computed when first
    asked (so a step whose policies ask nothing pays nothing)."""

    def __init__(self, positions: torch.Tensor, logits: torch.Tensor) -> None:
        self.positions = positions  # the positions the forward computed, sorted
        self._logits = logits
        self._entropy: torch.Tensor | None = None

    def entropy(self) -> torch.Tensor:
        """The entropy of the prediction at each computed position."""
        if self._entropy is None:
            self._entropy = entropy(self._logits)
        return self._entropy
