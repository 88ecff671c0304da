"""Cache policies: each one only decides which positions a forward recomputes.

Every policy returns a ``Plan``; the sampler adds the current block's masked positions (their
logits are needed) and runs the model. Names, parameters and descriptions are in ``registry``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..devices import DEVICES, measure_device, reuse_beats_recompute
from ..models.footprint import arithmetic_parameters
from .base import DecodeState, Policy

if TYPE_CHECKING:  # the page process validates settings with these classes and never loads a model
    from ..models.cache import KVCache


@dataclass
class Plan:
    positions: torch.Tensor
    full: bool  # every position recomputed: a refresh


class CachePolicy(Policy):
    def reset(self, state: DecodeState, cache: KVCache, model) -> None:
        """A new generation starts."""

    def plan(self, state: DecodeState, cache: KVCache) -> Plan:
        raise NotImplementedError

    def observe(self, state: DecodeState, cache: KVCache, positions: torch.Tensor, entropy: torch.Tensor | None) -> None:
        """After the forward; ``entropy`` of each recomputed position's prediction if the spec ``needs_entropy``."""

    def end_step(self, state: DecodeState, cache: KVCache) -> None:
        """The step is recorded: the policy may now drop entries (never before the bookkeeping)."""

    def info(self) -> dict:
        """Policy-specific numbers for the trace (empty for most)."""
        return {}


def _full(state: DecodeState) -> Plan:
    return Plan(state.all_positions(), True)


def _refresh_due(state: DecodeState, refresh_every: int) -> bool:
    return state.step == 0 or state.step_in_block == 0 or (refresh_every > 0 and state.step_in_block % refresh_every == 0)


class NoCache(CachePolicy):
    """Recompute everything every step: the plain full-recompute baseline."""


    def plan(self, state, cache):
        return _full(state)


class PrefixCache(CachePolicy):
    """Fast-dLLM PrefixCache: refresh at each block start; then recompute the block and all after it."""

    def plan(self, state, cache):
        if _refresh_due(state, self.refresh_every):
            return _full(state)
        return Plan(torch.arange(state.block_start, state.total_len, device=state.x.device), False)


class DualCache(CachePolicy):
    """Fast-dLLM DualCache: refresh at each block start; then recompute only the current block."""

    def plan(self, state, cache):
        if _refresh_due(state, self.refresh_every):
            return _full(state)
        return Plan(state.block_positions(), False)


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

    def reset(self, state, cache, model):
        L = state.total_len
        params = arithmetic_parameters(model)
        device = measure_device(state.x.device) if self.device_profile == "auto" else DEVICES[self.device_profile]
        vocab = model.get_input_embeddings().weight.shape[0]
        self._state = {
            "entropy": torch.zeros(L, device=state.x.device),
            "t_write": torch.zeros(L, device=state.x.device),
            "h_max": math.log(vocab),
            "lam": self.lam if self.lam is not None else 3.0 / max(1, state.steps_per_block * (state.gen_length // state.block_size)),
            "reuse_wins": reuse_beats_recompute(cache.bytes_per_position(), params, device),
            "device": device.name,
            "budget": None if self.budget is None else int(self.budget if self.budget >= 1 else self.budget * L),
            "evicted": 0,
        }

    def confidence(self, step: int) -> torch.Tensor:
        s = self._state
        certainty = 1 - s["entropy"] / s["h_max"]
        return self.alpha * certainty + self.beta * torch.exp(-s["lam"] * (step - s["t_write"]))

    def plan(self, state, cache):
        s = self._state
        if _refresh_due(state, self.refresh_every) or not s["reuse_wins"]:
            return _full(state)
        L = state.total_len
        recompute = self.confidence(state.step) <= self.floor
        recompute |= ~cache.valid[:L]
        recompute[state.block_start : state.block_end] = True
        return Plan(recompute.nonzero().flatten(), bool(recompute.all()))

    def observe(self, state, cache, positions, entropy):
        s = self._state
        s["t_write"][positions] = float(state.step)
        known = ~state.masked[positions]
        s["entropy"][positions] = torch.where(known, torch.zeros_like(entropy), entropy.to(s["entropy"].dtype))

    # In a batch with budgets, the batch's QuotaPool (batch.py) sets this request's share of them each step.
    quota: int | None = None

    @property
    def allowance(self) -> int | None:
        """Positions this request may keep cached: its own budget, or its quota in a batch."""
        return self.quota if self.quota is not None else self._state["budget"]

    def end_step(self, state, cache):
        s = self._state
        budget = self.allowance
        if budget is not None and cache.num_cached() > budget:
            L = state.total_len
            conf = self.confidence(state.step + 1)
            conf[~cache.valid[:L]] = float("inf")
            evict = torch.argsort(conf)[: cache.num_cached() - budget]
            cache.invalidate(evict)
            s["evicted"] += int(evict.numel())

    def info(self):
        s = self._state
        info = {"device": s.get("device"), "reuse_wins": s.get("reuse_wins"), "evicted": s.get("evicted", 0)}
        if self.quota is not None:
            info["quota"] = self.quota
        return info
