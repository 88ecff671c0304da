"""Flash-dLLM as its authors released it (VILA-Lab/Flash-dLLM, ``llada/generate.py``): Flash-Cache
and Flash-Verify. The write-up's versions of the same ideas are ``adaptive`` and ``self_verify``.

**Flash-Cache** (``flash``) decodes with a sliding window (``window.py``) over a span padded with
end-of-text to a multiple of ``pad_to``. One full forward fills the cache, and none follows. Then:

1. **plan**: recompute the window, plus ``track_num`` x block decoded positions (the newest
   commits, then the ones the window attended most in the last forward), plus the
   (``mask_num`` - 1) x block undecoded positions that follow the window.
2. **observe** (during the forward): the window's raw attention scores q.k (before the softmax
   scale), averaged over its queries and heads, summed over layers 2 and up.
3. **rank**: after the commits, the decoded positions are ordered by those scores.

**Flash-Verify** (``flash_verify``) commits by the threshold, then checks what is left:

1. **threshold**: every window position with confidence >= ``threshold``, at least the most confident.
2. **candidates**: the next most confident, at most block / 2.
3. **verify**: ONE extra forward of a query that reads the cache and writes nothing: the last
   2 x block - 2 x candidates decoded positions, the drafts, and a mask copy of each draft that
   sees the drafts ranked before it.
4. **accept**: the longest prefix of drafts whose running product of P(draft | mask copy) stays
   >= ``gamma``. Acceptance adds commits; the write-up's rule (``self_verify``) can only reject.
"""
from __future__ import annotations

import torch

from ..models.attention import ForwardObserver
from .cache import CachePolicy, Plan
from .unmask import Selection, UnmaskPolicy
from .flash_dllm_window import SlidingWindow

SCORED_FROM_LAYER = 2  # the released generator skips layers 0 and 1 when it scores attention


class WindowAttention(ForwardObserver):
    """Step 2 of Flash-Cache: each key's raw score from the window's queries, summed over layers."""

    def __init__(self, span: int, device: torch.device) -> None:
        self.scores = torch.zeros(span, device=device)
        self.window: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    def on_begin(self, positions, was_valid, live):
        # A new tensor each forward, summed out of place: a CUDA graph captures no write to a buffer
        # that lives outside it.
        self.scores = torch.zeros_like(self.scores)
        self._rows = torch.searchsorted(positions, self.window.to(positions.device))  # the positions are sorted

    def on_attend(self, layer, q, keys, key_mask):
        if layer < SCORED_FROM_LAYER:
            return
        q = q[:, :, self._rows.to(q.device)].float()  # float32, as the released kernel scores
        if keys.shape[1] != q.shape[1]:  # grouped K/V heads
            keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        raw = torch.matmul(q, keys.float().transpose(-1, -2))  # [1, heads, window, keys]
        mean = raw.mean(dim=(0, 1, 2)).to(self.scores.device)
        self.scores = self.scores + torch.nn.functional.pad(mean, (0, self.scores.shape[-1] - mean.shape[-1]))


class FlashCache(CachePolicy):
    def padding(self, prompt_len, gen_length):
        if self.pad_to == 0:
            return 0
        end = prompt_len + gen_length
        return (end // self.pad_to + 1) * self.pad_to - end  # as released: at least one, a whole pad_to on a multiple

    def window(self, state, eos_id):
        self._window = SlidingWindow(state.total_len, state.prompt_len, state.prompt_len + state.gen_length,
                                     state.block_size, eos_id, state.x.device)
        return self._window

    def reset(self, state, cache, model):
        self._attention = WindowAttention(state.total_len, state.x.device)
        self._tracked = state.x.new_zeros(0)

    def observers(self):
        return (self._attention,)

    def plan(self, state, cache):
        window = self._window  # the run's state.window
        self._attention.window = window.positions().clone()  # the order moves on; the record reads these after
        decoded = window.decoded_order()
        if state.step == 0 or self.track_num < 0:  # everything recomputed: the decoded positions too
            self._tracked = decoded.clone() if state.step else state.x.new_zeros(0)
            return Plan.over(0, state.total_len, state.x.device, full=True)
        self._tracked = decoded[max(0, decoded.numel() - self.track_num * state.block_size):].clone()
        upcoming = window.undecoded_after_window((self.mask_num - 1) * state.block_size)
        return Plan(torch.cat([self._tracked, upcoming]), False, outside_window=True)

    def ranking(self):
        return self._attention.scores

    def info(self):
        # "length": where the answer ends for the window (nothing at or past it is decoded), as of this step.
        # Tensors: the step's record reads them back with its commits.
        return {"window": self._attention.window, "tracked": torch.sort(self._tracked).values,
                "length": self._window.length}


def _verify_visibility(tracked: int, drafts: int, device: torch.device) -> torch.Tensor:
    """Which rows of the verify query see which: the tracked rows see everything but the drafts;
    draft i sees the drafts up to i and the mask copies after i; mask copy i sees the drafts
    before i and the mask copies from i on."""
    n = tracked + 2 * drafts
    visible = torch.ones(n, n, dtype=torch.bool, device=device)
    visible[:tracked, tracked : tracked + drafts] = False
    i = torch.arange(drafts, device=device)
    before, after = i[:, None] > i[None, :], i[:, None] < i[None, :]
    visible[tracked:, tracked:] = torch.cat([torch.cat([~after, after], 1), torch.cat([before, ~before], 1)], 0)
    return visible


class FlashVerify(UnmaskPolicy):
    def select(self, state, cand, calls):
        order = torch.sort(cand.confidence, descending=True, stable=True).indices
        keep = max(int((cand.confidence >= self.threshold).sum()), 1)  # 1. threshold
        committed = cand.positions[order[:keep]]
        drafts = order[keep : keep + state.block_size // 2]  # 2. candidates
        if not drafts.numel():
            return Selection(committed, {"verify_candidates": 0, "verify_accepted": 0, "accepted_at": []}, newest=0)
        sequence = state.x[0].clone()
        sequence[committed] = cand.tokens[order[:keep]]
        decoded = torch.cat([state.decoded_order(), committed])
        tracked = decoded[max(0, decoded.numel() - 2 * state.block_size + 2 * drafts.numel()):]  # what there is
        at, tokens = cand.positions[drafts], cand.tokens[drafts]
        masks = torch.full_like(tokens, state.mask_id)
        logits = calls.read_cache(torch.cat([sequence[tracked], tokens, masks]), torch.cat([tracked, at, at]),  # 3. verify
                                  _verify_visibility(tracked.numel(), drafts.numel(), at.device))
        p = torch.softmax(logits[-drafts.numel():].double(), -1).gather(-1, tokens[:, None]).squeeze(-1)
        p = torch.where(at >= self._length(state, sequence, committed), torch.zeros_like(p), p)
        accepted = torch.cumprod(p, 0) >= self.gamma  # 4. accept
        # One read-back: each draft's position, token, probability and acceptance.
        rows = torch.stack([at.double(), tokens.double(), p, accepted.double()], 1).tolist()
        n = sum(int(row[3]) for row in rows)
        return Selection(torch.cat([committed, at[:n]]),
                         {"verify_candidates": int(drafts.numel()), "verify_accepted": n,
                          "accepted_at": [[int(pos), int(token), round(prob, 6)] for pos, token, prob, _ in rows[:n]]},
                         newest=n)

    @staticmethod
    def _length(state, sequence: torch.Tensor, committed: torch.Tensor) -> torch.Tensor | int:
        """The sliding window's answer length once this step's threshold commits are in (past the
        sequence while no end-of-text is known), found on the device."""
        window = state.window
        if window is None:
            return sequence.numel()
        if window.eos_seen:
            return window.length
        ends = torch.where(sequence[committed] == window.eos_id, committed, -1)
        last = ends.amax() if ends.numel() else ends.new_tensor(-1)
        return torch.where(last >= 0, last + 1, sequence.numel())
