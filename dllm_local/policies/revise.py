"""Draft wide, verify narrow (WINO): committed tokens can be taken back.

Each step commits every masked position of the block at or above ``draft_threshold`` (at least
the most confident one), and in the same forward re-checks the tokens this block committed on
earlier steps: one whose probability, now that its neighbours are known, is under
``verify_threshold`` goes back to mask. Every position of the block is in the forward anyway (the
cache policies all recompute the current block), so the check costs no extra forward. A position
is taken back at most ``max_revisions`` times, so decoding ends: each step commits at least one
token, and the revisions are finite. A draft that would fill the block leaves its least sure token
masked for one more forward, so the block's tokens are verified before it closes.
"""
from __future__ import annotations

import torch

from .unmask import Selection, UnmaskPolicy, _threshold_mask, _top


class Revise(UnmaskPolicy):
    def start_block(self, state):
        if state.block == 0:  # a new run
            self._revisions: dict[int, int] = {}
        self._committed: dict[int, tuple[int, float]] = {}  # this block: position -> (token, confidence then)

    def select(self, state, cand, calls):
        revoked = self._verify(calls, cand.positions.device) if self._committed and self.verify_threshold > 0 else []
        drafted = _threshold_mask(cand.confidence, self.draft_threshold)
        if self.verify_threshold > 0 and bool(drafted.all()) and drafted.numel() > 1:
            # A draft that fills the block would end it unverified: the least sure token waits one
            # forward, so that every other token is checked once with all its neighbours known.
            drafted[cand.confidence.argmin()] = False
        chosen = cand.positions[drafted]
        if not chosen.numel():
            chosen = _top(cand, 1)
        index = torch.searchsorted(cand.positions, chosen)
        for p, t, c in zip(chosen.tolist(), cand.tokens[index].tolist(), cand.confidence[index].tolist()):
            self._committed[p] = (t, c)
        return Selection(chosen, {"revoked": len(revoked)}, revoked=revoked)

    def _verify(self, calls, device: torch.device) -> list[list]:
        """``[position, token, confidence at commit, probability now]`` of each token taken back."""
        positions = torch.tensor(sorted(self._committed), device=device)
        now = calls.current_probabilities(positions)
        revoked = []
        for p, p_now in zip(positions.tolist(), now.tolist()):
            if p_now < self.verify_threshold and self._revisions.get(p, 0) < self.max_revisions:
                token, then = self._committed.pop(p)
                self._revisions[p] = self._revisions.get(p, 0) + 1
                revoked.append([p, token, round(then, 6), round(p_now, 6)])
        return revoked
