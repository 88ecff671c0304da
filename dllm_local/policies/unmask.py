"""Unmasking policies: which of the current block's masked positions to commit this step.

Each policy sees the block's masked positions with the model's draft token and confidence
there, and returns the positions to commit (always at least one). Registration is the
``UNMASK_POLICIES`` dict at the end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .base import DecodeState, Policy


@dataclass
class Candidates:
    positions: torch.Tensor  # [m] the block's masked positions, ascending
    tokens: torch.Tensor  # [m] the model's draft at each
    confidence: torch.Tensor  # [m] float64 probability of the draft
    rank: torch.Tensor  # [m] what `fixed` orders by: confidence, or random under random remasking


class Engine(Protocol):
    """What the sampler offers policies that need more than one forward's logits."""

    def verify(self, rows: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """For ``k`` variant sequences, the probability of ``tokens[r]`` at position ``at[r]`` in row r."""

    def guider_logits(self, sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The guider's next-token logits predicting each of ``positions`` (``[m, vocab]``)."""


@dataclass
class Selection:
    positions: torch.Tensor
    info: dict = field(default_factory=dict)


class UnmaskPolicy(Policy):
    needs_guider = False

    def start_block(self, state: DecodeState) -> None:
        """A new block starts."""

    def select(self, state: DecodeState, cand: Candidates, engine: Engine) -> Selection:
        raise NotImplementedError


def _top(cand: Candidates, k: int, key: torch.Tensor | None = None) -> torch.Tensor:
    key = cand.confidence if key is None else key
    return cand.positions[torch.topk(key, min(k, key.numel())).indices]


@dataclass
class Fixed(UnmaskPolicy):
    """LLaDA's schedule: the block's masks spread evenly over its steps, best-ranked first."""

    name = "fixed"
    _schedule: list = field(default_factory=list, init=False, repr=False)

    def start_block(self, state):
        masks = int(state.block_masked_positions().numel())
        steps = state.steps_per_block
        base, extra = divmod(masks, steps)
        self._schedule = [base + (1 if i < extra else 0) for i in range(steps)]

    def select(self, state, cand, engine):
        i = state.step_in_block
        k = self._schedule[i] if i < len(self._schedule) else 1
        return Selection(_top(cand, k, cand.rank) if k else cand.positions[:0])


def _threshold_mask(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    # tau = 1 is "never confident enough": one token per step, even where a float rounds to 1.
    if threshold >= 1:
        return torch.zeros_like(conf, dtype=torch.bool)
    return conf >= threshold


@dataclass
class Threshold(UnmaskPolicy):
    """Fast-dLLM: every masked position with confidence >= threshold, at least the most confident."""

    name = "threshold"
    threshold: float = 0.9

    def validate(self):
        self._require(0 < self.threshold <= 1, "threshold", "in (0, 1]")

    def select(self, state, cand, engine):
        chosen = cand.positions[_threshold_mask(cand.confidence, self.threshold)]
        return Selection(chosen if chosen.numel() else _top(cand, 1))


@dataclass
class Factor(UnmaskPolicy):
    """Fast-dLLM's factor rule: the largest n with (n + 1)(1 - c_n) < f over sorted confidences."""

    name = "factor"
    factor: float = 1.0

    def validate(self):
        self._require(self.factor > 0, "factor", "> 0")

    def select(self, state, cand, engine):
        conf, order = torch.sort(cand.confidence, descending=True)
        n = torch.arange(1, conf.numel() + 1, device=conf.device, dtype=conf.dtype)
        ok = (n + 1) * (1 - conf) < self.factor
        count = int(ok.nonzero().max()) + 1 if bool(ok.any()) else 1
        return Selection(cand.positions[order[:count]])


@dataclass
class Guided(UnmaskPolicy):
    """FlashDLM guided diffusion: an autoregressive guider accepts the longest agreeing prefix.

    The diffusion model drafts every masked position of the block; the guider reads the draft
    teacher-forced. Rules: ``exact`` (the guider's argmax), ``topk`` (in its top-k), ``relative``
    (in its top-k with p >= ratio * p_top1). If it rejects the first draft token, that one is
    committed anyway.
    """

    name = "guided"
    needs_guider = True
    rule: str = "exact"
    top_k: int = 5
    ratio: float = 0.5

    def validate(self):
        self._require(self.rule in ("exact", "topk", "relative"), "rule", "exact, topk or relative")
        self._require(self.top_k >= 1, "top_k", ">= 1")
        self._require(0 < self.ratio <= 1, "ratio", "in (0, 1]")

    def accepts(self, logits: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        if self.rule == "exact":
            return logits.argmax(-1) == draft
        probs = logits.float().softmax(-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        in_top = (top_i == draft[:, None]).any(-1)
        if self.rule == "topk":
            return in_top
        p_draft = probs.gather(-1, draft[:, None]).squeeze(-1)
        return in_top & (p_draft >= self.ratio * top_p[:, 0])

    def select(self, state, cand, engine):
        sequence = state.x[0].clone()
        sequence[cand.positions] = cand.tokens
        ok = self.accepts(engine.guider_logits(sequence, cand.positions), cand.tokens)
        agree = int(ok.long().cumprod(0).sum())
        return Selection(cand.positions[: max(1, agree)], {"guider_accepted": agree})


@dataclass
class SelfVerify(UnmaskPolicy):
    """Self-verifying parallel decoding (seed 000).

    Candidates come from the threshold rule, capped by a tokens-per-step limit that shrinks as
    the block fills (``cap_max`` -> ``cap_min``). Candidates with another candidate within
    ``window`` positions are verified: one batched forward re-masks each in turn with the others
    filled in, giving P(b | others) / P(b) (the conflict score P(a,b) / (P(a)P(b))). Those under
    ``rho`` go back to mask and are then decided one at a time.
    """

    name = "self_verify"
    threshold: float = 0.9
    rho: float = 0.5
    window: int = 4
    cap_max: int = 16
    cap_min: int = 2
    _serial: set = field(default_factory=set, init=False, repr=False)

    def validate(self):
        self._require(0 < self.threshold <= 1, "threshold", "in (0, 1]")
        self._require(self.rho > 0, "rho", "> 0")
        self._require(self.window >= 1, "window", ">= 1")
        self._require(1 <= self.cap_min <= self.cap_max, "cap_min", "between 1 and cap_max")

    def start_block(self, state):
        self._serial = set()

    def cap(self, state: DecodeState, masked: int) -> int:
        return max(self.cap_min, math.ceil(self.cap_max * masked / state.block_size))

    def select(self, state, cand, engine):
        chosen = _threshold_mask(cand.confidence, self.threshold)
        order = torch.argsort(cand.confidence, descending=True)
        picked: list[int] = []
        serial_taken = False
        for i in order.tolist():
            if not (chosen[i] or not picked):
                break
            pos = int(cand.positions[i])
            if pos in self._serial:
                if serial_taken:
                    continue
                serial_taken = True
            picked.append(i)
            if len(picked) >= self.cap(state, cand.positions.numel()):
                break
        picked.sort(key=lambda i: int(cand.positions[i]))
        pos = cand.positions[picked].tolist()
        check = [j for j, p in enumerate(pos) if any(0 < abs(p - q) < self.window for q in pos)]
        if not check:
            return Selection(cand.positions[picked], {"verified": 0, "rejected": 0})
        rows = state.x.repeat(len(check), 1)
        for r, j in enumerate(check):
            others = [picked[k] for k in range(len(picked)) if k != j]
            rows[r, cand.positions[others]] = cand.tokens[others]
        index = torch.tensor([picked[j] for j in check], device=rows.device)
        p_given = engine.verify(rows, cand.positions[index], cand.tokens[index])
        score = p_given / cand.confidence[index].to(p_given.dtype)
        rejected = {picked[j] for j, s in zip(check, score.tolist()) if s < self.rho}
        keep = [i for i in picked if i not in rejected]
        if not keep:
            keep = [max(picked, key=lambda i: float(cand.confidence[i]))]
        self._serial.update(int(cand.positions[i]) for i in rejected if i not in keep)
        return Selection(cand.positions[keep], {"verified": len(check), "rejected": len(rejected),
                                                 "min_conflict_score": round(float(score.min()), 4)})


UNMASK_POLICIES: dict[str, type[UnmaskPolicy]] = {
    p.name: p for p in (Fixed, Threshold, Factor, Guided, SelfVerify)
}
