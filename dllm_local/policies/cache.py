"""Cache policies: each one only decides which positions a forward recomputes.

Every policy returns a ``Plan``; the sampler adds the current block's masked positions (their
logits are needed) and runs the model. Names, parameters and descriptions are in ``registry``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..devices import DEVICES, measure_device, reuse_beats_recompute
from ..models.attention import ForwardObserver
from ..models.loading.footprint import arithmetic_parameters
from .base import CacheAccess, DecodeState, Policy, StepSignals, Window


@dataclass
class Plan:
    positions: torch.Tensor
    full: bool  # every position recomputed: a refresh
    span: tuple[int, int] | None = None  # the positions are range(*span): the run needs not ask the device
    outside_window: bool = False  # none is a sliding window's: the run joins them to it by a sort, unasked

    @classmethod
    def over(cls, start: int, end: int, device: torch.device, full: bool = False) -> "Plan":
        """Positions ``start`` to ``end`` - 1, known on the host."""
        return cls(torch.arange(start, end, device=device), full, (start, end))


class CachePolicy(Policy):
    # This request's share of a batch's cache budget, when its policy has a budget (``max_cached``) and
    # the batch shares budgets: set by ``set_quota`` each step.
    quota: int | None = None
    # Whether ``observe`` reads the prediction at every computed position (``signals``); else a
    # step whose positions hold the block computes the LM head over the block's rows alone, and
    # ``signals`` holds those.
    reads_every_logit: bool = False

    def padding(self, prompt_len: int, gen_length: int) -> int:
        """End-of-text positions after the answer that every forward attends (context, never decoded)."""
        return 0

    def window(self, state: DecodeState, eos_id: int) -> Window | None:
        """The order decoding follows instead of fixed blocks, built as the run starts (its spec
        says ``slides``: Flash-Cache's sliding window); None: block by block."""
        return None

    def ranking(self) -> torch.Tensor | None:
        """A score per position after the step: a sliding window orders its decoded positions by
        it, ascending (None: by commit)."""
        return None

    def reset(self, state: DecodeState, cache: CacheAccess, model: torch.nn.Module) -> None:
        """A new generation starts."""

    def observers(self) -> tuple[ForwardObserver, ...]:
        """Instruments this policy watches its request's forwards with (set up in ``reset``)."""
        return ()

    def plan(self, state: DecodeState, cache: CacheAccess) -> Plan:
        raise NotImplementedError

    def decodable(self, state: DecodeState) -> tuple[int, int] | None:
        """The span of the block whose masks this step may commit; None: the whole block."""
        return None

    def ends_mid_block(self) -> bool:
        """Whether an early stop may end a block-diffusion run before its block is done."""
        return False

    def settle(self, state: DecodeState) -> torch.Tensor | None:
        """As a block starts (block 0: as the run starts), positions whose K/V a forward of their
        own writes before the block's first step, decoding nothing; None: none."""
        return None

    def observe(self, state: DecodeState, cache: CacheAccess, signals: StepSignals) -> None:
        """After the forward, which computed ``signals.positions``."""

    def end_step(self, state: DecodeState, cache: CacheAccess) -> None:
        """The step is recorded: the policy may now drop entries (never before the bookkeeping)."""

    def info(self) -> dict:
        """Numbers for the trace, under the names its spec declares (``trace_fields``)."""
        return {}

    def max_cached(self) -> int | None:
        """The most positions this request keeps cached (its budget); None: no budget."""
        return None

    def set_quota(self, quota: int) -> None:
        """A batch sharing its budgets gives this request ``quota`` positions for now."""
        self.quota = quota


def _full(state: DecodeState) -> Plan:
    return Plan.over(0, state.total_len, state.x.device, full=True)


def _refresh_due(state: DecodeState, refresh_every: int) -> bool:
    return state.step == 0 or state.step_in_block == 0 or (refresh_every > 0 and state.step_in_block % refresh_every == 0)


class NoCache(CachePolicy):
    """Recompute everything every step: the plain full-recompute baseline."""


    def plan(self, state, cache):
        return _full(state)


class BlockCache(CachePolicy):
    """Block diffusion's cache, kept as an autoregressive model keeps its past: the prompt's whole
    blocks are written once before the first step, and each finished block once more, with its
    final tokens, as the next block starts; every step recomputes only the current block.
    Block-causal attention never lets a block read a later one, so a stored entry equals what a
    full recompute would give for the rest of the run: exact by construction.

    With ``sub_block`` (Fast-dLLM v2: 8), the block is decoded in sub-blocks, left to right: each
    step commits only in the first sub-block with a mask, and an early stop may end the block.
    With ``sub_block_cache`` too, once a block has had a forward, a sub-block whose first position
    is decided recomputes only itself, reading the rest of its block as that forward left it (an
    approximation: those entries are not refreshed as the sub-block changes).
    """

    def settle(self, state):
        start = state.block_start
        if state.block == 0:
            return torch.arange(start, device=state.x.device) if start else None
        return torch.arange(start - state.block_size, start, device=state.x.device)

    def reset(self, state, cache, model):
        self._shifted = not model.packs_requests  # its forward recomputes a position's predecessor itself

    def decodable(self, state):
        if self.sub_block is None:
            return None
        masked = state.masked[state.block_start : state.block_end]
        first = int(masked.int().argmax()) // self.sub_block * self.sub_block  # the first sub-block with a mask
        return state.block_start + first, min(state.block_start + first + self.sub_block, state.block_end)

    def ends_mid_block(self):
        return self.sub_block is not None

    def plan(self, state, cache):
        if self.sub_block is not None and self.sub_block_cache and state.step_in_block:
            start, end = self.decodable(state)
            if not bool(state.masked[start]):  # a shifted head recomputes ``start`` itself, for the next one
                return Plan.over(start + self._shifted, end, state.x.device)
        return Plan.over(state.block_start, state.block_end, state.x.device)


class PrefixCache(CachePolicy):
    """Fast-dLLM PrefixCache: refresh at each block start; then recompute the block and all after it."""

    def plan(self, state, cache):
        if _refresh_due(state, self.refresh_every):
            return _full(state)
        return Plan.over(state.block_start, state.total_len, state.x.device)


class DualCache(CachePolicy):
    """Fast-dLLM DualCache: refresh at each block start; then recompute only the current block."""

    def plan(self, state, cache):
        if _refresh_due(state, self.refresh_every):
            return _full(state)
        return Plan.over(state.block_start, state.block_end, state.x.device)


class FreeCache(CachePolicy):
    """FlashDLM FreeCache: one full forward, then finished blocks and the prompt stay frozen.

    Each step recomputes the current block and every later block that still holds a mask, so
    the active window shrinks as blocks finish; a block that just finished is recomputed once
    more (its last commits) on entering the next block, then frozen. No refresh ever.
    """


    def plan(self, state, cache):
        if state.step == 0:
            return _full(state)
        # The current block and every later block with a mask left, found in one pass (one host
        # sync, however many blocks: a loop asking each block would wait on the device per block).
        blocks = torch.arange(state.block_start, state.total_len, device=state.x.device).view(-1, state.block_size)
        active = state.masked[state.block_start:].view(-1, state.block_size).any(-1)
        active[0] = True
        positions = blocks[active].flatten()
        if state.step_in_block == 0 and state.block > 0:
            # The block that just finished is recomputed once, with its last commits, then frozen.
            positions = torch.cat([blocks[0] - state.block_size, positions])
        return Plan(positions, False)


class AdaptiveCache(CachePolicy):
    """The I/O-aware adaptive cache.

    Per position, cache confidence ``alpha * (1 - H/H_max) + beta * exp(-lambda * (t - t_write))``,
    with H the entropy of the model's prediction there (0 once the token is known). Positions at
    or under ``floor`` are recomputed; so are positions an I/O cost model says are cheaper to
    recompute than to read; a memory budget keeps at most ``budget`` positions cached (an int, or
    a fraction of the sequence), evicting the lowest-confidence ones, K and V together. Like
    DualCache it refreshes at block starts, and also every ``refresh_every`` steps when set.
    """

    reads_every_logit = True  # the entropy at every computed position

    def reset(self, state, cache, model):
        L = state.total_len
        params = arithmetic_parameters(model)
        device = measure_device(state.x.device) if self.device_profile == "auto" else DEVICES[self.device_profile]
        vocab = model.get_input_embeddings().weight.shape[0]
        self._state = {
            "entropy": torch.zeros(L, device=state.x.device),
            "h_max": math.log(vocab),
            "lam": self.lam if self.lam is not None else 3.0 / max(1, state.steps_per_block * (state.gen_length // state.block_size)),
            "reuse_wins": reuse_beats_recompute(cache.bytes_per_position(), params, device),
            "device": device.name,
            "budget": None if self.budget is None else int(self.budget if self.budget >= 1 else self.budget * L),
            "evicted": 0,
        }

    def confidence(self, step: int, cache: CacheAccess) -> torch.Tensor:
        s = self._state
        certainty = 1 - s["entropy"] / s["h_max"]
        return self.alpha * certainty + self.beta * torch.exp(-s["lam"] * (step - cache.write_step))

    def plan(self, state, cache):
        s = self._state
        if _refresh_due(state, self.refresh_every) or not s["reuse_wins"]:
            return _full(state)
        recompute = self.confidence(state.step, cache) <= self.floor
        recompute |= ~cache.valid
        recompute[state.block_start : state.block_end] = True
        return Plan(recompute.nonzero().flatten(), bool(recompute.all()))

    def observe(self, state, cache, signals):
        s, positions = self._state, signals.positions
        known = ~state.masked[positions]
        entropy = signals.entropy()
        s["entropy"][positions] = torch.where(known, torch.zeros_like(entropy), entropy.to(s["entropy"].dtype))

    def max_cached(self):
        return self._state["budget"]

    def end_step(self, state, cache):
        s = self._state
        allowance = self.quota if self.quota is not None else s["budget"]  # in a batch, its share of the pool
        if allowance is not None and cache.num_cached() > allowance:
            conf = self.confidence(state.step + 1, cache)
            conf[~cache.valid] = float("inf")
            evict = torch.argsort(conf)[: cache.num_cached() - allowance]
            cache.evict(evict)
            s["evicted"] += int(evict.numel())

    def info(self):
        s = self._state
        info = {"device": s.get("device"), "reuse_wins": s.get("reuse_wins"), "evicted": s.get("evicted", 0)}
        if self.quota is not None:
            info["quota"] = self.quota
        return info
