"""LLaDA 2.1's token-to-token editing: a committed token of the current block may be rewritten.

Each step commits the block's masks by the threshold (at least the most confident one, as the
threshold policy does) and, from the same forward, rewrites every token this block committed on
an earlier step whose draft is now another token with probability above ``edit_threshold`` (a
prompt token inside the block is never edited). Edits happen while masks remain too. Once the
block has no mask, forwards go on until one edits nothing, or ``max_post_steps`` of them have run
(0: the block ends with its last mask); each is bounded, so decoding ends. LLaDA 2.1's quality
mode is threshold 0.7, edit threshold 0.5; its speed mode threshold 0.5, edit threshold 0.
"""
from __future__ import annotations

from .unmask import Selection, UnmaskPolicy, _threshold_mask, _top


class Edit(UnmaskPolicy):
    def start_block(self, state):
        self._after_fill = 0  # forwards run on this block once it had no mask
        self._clean = False  # the last such forward edited nothing

    def select(self, state, cand, calls):
        chosen = cand.positions[_threshold_mask(cand.confidence, self.threshold)]
        if not chosen.numel():
            chosen = _top(cand, 1)
        block = state.block_positions()
        editable = block[~state.masked[block] & (block >= state.prompt_len)]
        edits = []
        if editable.numel():
            tokens, probability = calls.current_drafts(editable)
            old = state.x[0, editable]
            change = (probability > self.edit_threshold) & (tokens != old)
            edits = [[p, t, round(q, 6), o] for p, t, q, o in zip(editable[change].tolist(), tokens[change].tolist(),
                                                               probability[change].tolist(), old[change].tolist())]
        if not cand.positions.numel():
            self._after_fill += 1
            self._clean = not edits
        return Selection(chosen, {"edited": len(edits)}, edits=edits)

    def block_done(self, state):
        if not super().block_done(state):
            return False
        return self.max_post_steps == 0 or self._clean or self._after_fill >= self.max_post_steps
