"""Unmasking policies: which of the current block's masked positions to commit this step.

Each policy sees the block's masked positions with the model's draft token and confidence
there, and returns the positions to commit (always at least one). Names, parameters and
descriptions are in ``registry``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .base import DecodeState, Policy


@dataclass
class Candidates:
    positions: torch.Tensor  # [m] the block's masked positions, ascending
    tokens: torch.Tensor  # [m] the model's draft at each
    confidence: torch.Tensor  # [m] float64 probability of the draft


@dataclass(frozen=True)
class StepCalls:
    """What an unmasking policy may use beyond the drafts: the run's seeded generator and the
    model calls some policies make. Nothing else of the run is reachable from here.

    - ``verify(rows, at, tokens)``: for ``k`` variant sequences, the probability of ``tokens[r]`` at
      position ``at[r]`` in row r (``[k]``, float64), from one forward that writes no cache.
    - ``current_probabilities(positions)``: the probability this step's forward gives the tokens
      now at ``positions`` (float64).
    - ``current_drafts(positions)``: the draft this step's forward gives at ``positions`` (tokens
      already decided there included) and its probability, drawn as the masks' drafts are.
    - ``guider_forward(input_ids, past)``: the guider's logits ``[n, vocab]`` for ``input_ids`` read
      after its KV cache ``past`` (None: a new one), and the cache grown by them.
    - ``read_cache(tokens, positions, visible)``: logits ``[n, vocab]`` (ids no draft may be at -inf)
      of a query of ``tokens`` at ``positions`` (repeats allowed) that reads the cache at every
      other position, and row i sees row j's fresh K/V where ``visible[i, j]``; it writes nothing.
    """

    rng: torch.Generator
    verify: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    current_probabilities: Callable[[torch.Tensor], torch.Tensor]
    current_drafts: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    guider_forward: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]
    read_cache: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Selection:
    positions: torch.Tensor
    info: dict = field(default_factory=dict)
    # Committed tokens taken back to mask: [position, token, confidence at commit, probability now].
    revoked: list[list] = field(default_factory=list)
    # How many of the commits, the lowest ranked, are the step's newest: a sliding window keeps them
    # last in its decoding order (None: all of them).
    newest: int | None = None
    # Committed tokens rewritten in place: [position, new token, its probability, old token].
    edits: list[list] = field(default_factory=list)
    # The commits as a mask over ``positions`` (then every candidate's), kept on the device: the run
    # commits through it and reads it back with the step's record, one read-back a step.
    among: torch.Tensor | None = None

    def committed(self) -> torch.Tensor:
        """The positions committed (a mask's found here, which reads it back)."""
        return self.positions if self.among is None else self.positions[self.among]


class UnmaskPolicy(Policy):
    def start_block(self, state: DecodeState) -> None:
        """A new block starts."""

    def select(self, state: DecodeState, cand: Candidates, calls: StepCalls) -> Selection:
        raise NotImplementedError

    def block_done(self, state: DecodeState) -> bool:
        """Whether the current block is finished: it has no mask left (an editing policy may
        go on rewriting it)."""
        if state.masks_left is not None:
            return state.masks_left == 0
        return not bool(state.masked[state.block_start : state.block_end].any())


def _top(cand: Candidates, k: int, key: torch.Tensor | None = None) -> torch.Tensor:
    key = cand.confidence if key is None else key
    return cand.positions[torch.topk(key, min(k, key.numel())).indices]


class Fixed(UnmaskPolicy):
    """LLaDA's schedule: the block's masks spread evenly over its steps, best-ranked first."""

    def start_block(self, state):
        masks = int(state.block_masked_positions().numel())
        steps = state.steps_per_block
        base, extra = divmod(masks, steps)
        self._schedule = [base + (1 if i < extra else 0) for i in range(steps)]

    def select(self, state, cand, calls):
        i = state.step_in_block
        k = self._schedule[i] if i < len(self._schedule) else 1
        rank = cand.confidence
        if self.remasking == "random":
            rank = torch.rand(rank.shape, generator=calls.rng, device=rank.device, dtype=rank.dtype)
        return Selection(_top(cand, k, rank) if k else cand.positions[:0])


def _threshold_mask(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    # As both released generators (Fast-dLLM, Flash-dLLM) compare: at tau = 1 a probability that
    # rounds to 1 in float64 still passes.
    return conf >= threshold


class Threshold(UnmaskPolicy):
    """Fast-dLLM: every masked position with confidence >= threshold, at least the most confident."""

    def select(self, state, cand, calls):
        if not cand.positions.numel():
            return Selection(cand.positions)
        passed = _threshold_mask(cand.confidence, self.threshold)
        best = torch.zeros_like(passed).index_fill_(0, torch.topk(cand.confidence, 1).indices, True)
        return Selection(cand.positions, among=passed | (best & ~passed.any()))  # decided on the device


class Factor(UnmaskPolicy):
    """Fast-dLLM's factor rule: the largest n with (n + 1)(1 - c_n) < f over sorted confidences."""

    def select(self, state, cand, calls):
        conf, order = torch.sort(cand.confidence, descending=True)
        n = torch.arange(1, conf.numel() + 1, device=conf.device, dtype=conf.dtype)
        ok = (n + 1) * (1 - conf) < self.factor
        count = int(ok.nonzero().max()) + 1 if bool(ok.any()) else 1
        return Selection(cand.positions[order[:count]])


class Guided(UnmaskPolicy):
    """FlashDLM guided diffusion: an autoregressive guider accepts the longest agreeing prefix.

    The diffusion model drafts every masked position of the block; the guider reads the draft
    teacher-forced. Rules: ``exact`` (the guider's argmax), ``topk`` (in its top-k), ``relative``
    (in its top-k with p >= ratio * p_top1). If it rejects the first draft token, that one is
    committed anyway.
    """

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

    def start_block(self, state):
        if state.block == 0:  # a new run: the guider has read nothing yet
            self._past, self._read = None, []

    def guider_logits(self, calls: StepCalls, sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The guider's logits predicting each of ``positions`` (sorted) from the tokens before it.

        Its KV cache keeps the prefix it has already read and agrees with; only the rest is read.
        """
        end = int(positions[-1])
        tokens = sequence[:end].tolist()
        keep = 0
        for a, b in zip(self._read, tokens):
            if a != b:
                break
            keep += 1
        keep = min(keep, int(positions[0]) - 1)
        surplus = self._past.get_seq_length() - keep if self._past is not None else 0
        if surplus > 0:
            self._past.crop(-surplus)
        logits, self._past = calls.guider_forward(sequence[keep:end], self._past)
        self._read = tokens
        return logits[positions - 1 - keep]

    def select(self, state, cand, calls):
        sequence = state.x[0].clone()
        sequence[cand.positions] = cand.tokens
        ok = self.accepts(self.guider_logits(calls, sequence, cand.positions), cand.tokens)
        agree = int(ok.long().cumprod(0).sum())
        return Selection(cand.positions[: max(1, agree)], {"guider_accepted": agree})


class SelfVerify(UnmaskPolicy):
    """Self-verifying parallel decoding.

    Candidates come from the threshold rule, capped by a tokens-per-step limit that shrinks as
    the block fills (``cap_max`` -> ``cap_min``). Candidates with another candidate within
    ``window`` positions are verified: one batched forward re-masks each in turn with the others
    filled in, giving P(b | others) / P(b) (the conflict score P(a,b) / (P(a)P(b))). Those under
    ``rho`` go back to mask and are then decided one at a time.
    """

    def start_block(self, state):
        self._serial = set()

    def cap(self, state: DecodeState, masked: int) -> int:
        return max(self.cap_min, math.ceil(self.cap_max * masked / state.block_size))

    def select(self, state, cand, calls):
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
        p_given = calls.verify(rows, cand.positions[index], cand.tokens[index])
        score = p_given / cand.confidence[index].to(p_given.dtype)
        rejected = {picked[j] for j, s in zip(check, score.tolist()) if s < self.rho}
        keep = [i for i in picked if i not in rejected]
        if not keep:
            keep = [max(picked, key=lambda i: float(cand.confidence[i]))]
        self._serial.update(int(cand.positions[i]) for i in rejected if i not in keep)
        # Each sent-back draft with its conflict score, for the views.
        rejected_at = [[int(cand.positions[picked[j]]), int(cand.tokens[picked[j]]), round(s, 4)]
                       for j, s in zip(check, score.tolist()) if picked[j] in rejected and picked[j] not in keep]
        return Selection(cand.positions[keep], {"verified": len(check), "rejected": len(rejected),
                                                 "min_conflict_score": round(float(score.min()), 4),
                                                 "rejected_at": rejected_at})

