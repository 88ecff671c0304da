"""The decoding order of Flash-dLLM as released: a window sliding over the undecoded positions.

Fixed blocks decode ``[P + kB, P + (k + 1)B)`` one after another, and a block holds the run until
its hardest position is decided. The released generator (VILA-Lab/Flash-dLLM, ``llada/generate.py``)
scores the next ``block_size`` undecoded positions instead, wherever they are. Its bookkeeping is
one permutation of the span's positions, ``order``:

    order = [ decoded positions (the prompt first) | the window | the rest, ascending ]
              0 ............................ decoded

1. **window**: ``order[decoded : decoded + block_size]``, cut at the answer's end (the span's
   end-of-text padding is context, never decoded here; the release lets the window run into it).
2. **commit**: the window is re-ranked by confidence, the commits first; ``decoded`` grows by them.
3. **end of text**: the first committed end-of-text fixes the answer's ``length`` (its position
   + 1): positions past it are never committed, and decoding ends once every position before it is.
4. **rank**: the decoded entries, but for the step's newest commits (kept last), are sorted by the
   cache policy's ranking (ascending), so ``order[decoded - n : decoded]`` are the newest commits
   and then the most attended positions: what Flash-Cache recomputes and Flash-Verify re-reads.
"""
from __future__ import annotations

import torch


class SlidingWindow:
    def __init__(self, span: int, prompt_len: int, answer_end: int, block_size: int, eos_id: int,
                 device: torch.device) -> None:
        self.order = torch.arange(span, device=device)
        self.decoded = prompt_len
        self.answer_end = answer_end
        self.length = answer_end  # step 3: nothing at or past it is committed
        self.block_size, self.eos_id = block_size, eos_id
        self.eos_seen = False

    def positions(self) -> torch.Tensor:
        """1. The window, in its order (confidence order for positions that stayed in it)."""
        # Every decoded position lies in the answer or before it, and the undecoded answer positions
        # precede the padding in the order: the window is a prefix known without asking the device.
        return self.order[self.decoded : self.decoded + min(self.block_size, self.answer_end - self.decoded)]

    def undecoded_after_window(self, count: int) -> torch.Tensor:
        """The ``count`` undecoded positions that follow a full window in the order (padding included)."""
        start = self.decoded + self.block_size
        return self.order[start : start + max(0, count)]

    def decoded_order(self) -> torch.Tensor:
        """Decoded positions, oldest and least attended first, the newest commits last."""
        return self.order[: self.decoded]

    def done(self) -> bool:
        return not bool((self.order[self.decoded :] < self.length).any())

    def commit(self, ranked: torch.Tensor, committed: torch.Tensor, tokens: torch.Tensor, newest: int,
               ranking: torch.Tensor | None) -> None:
        """2-4. ``ranked``: the window by confidence (best first); ``committed``: those committed,
        in the order they join the decoded ones, their ``tokens``; the last ``newest`` of them stay
        last when ``ranking`` (a score per position, or None) re-sorts the decoded entries."""
        window = self.order[self.decoded : self.decoded + self.block_size]
        rest = without(ranked, committed)
        left = without(window, ranked)  # past the answer's length: never ranked
        self.order[self.decoded : self.decoded + window.numel()] = torch.cat([committed, rest, left])
        self.decoded += committed.numel()
        if not self.eos_seen:
            ends = committed[tokens == self.eos_id]
            if ends.numel():
                self.eos_seen = True
                self.length = int(ends.max()) + 1
        if ranking is not None:
            older = self.order[: self.decoded - newest]
            self.order[: older.numel()] = older[torch.sort(ranking[older], stable=True).indices]


def without(values: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
    """``values`` but those in ``taken`` (a subset of them), in their order: a stable sort puts the
    kept first and the host knows how many, so nothing is read back (a boolean index would ask)."""
    kept_first = torch.argsort(torch.isin(values, taken).to(torch.uint8), stable=True)
    return values[kept_first[: values.numel() - taken.numel()]]
