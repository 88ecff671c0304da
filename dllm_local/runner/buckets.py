"""Query lengths padded to a few buckets, so that a run's forwards meet a bounded set of shapes.

A compiled forward is specialised to its shapes and a CUDA graph replays one shape: a forward of a
new length compiles or captures again. Over a run the lengths are few but not fixed (a prefix cache
recomputes less at each block; Flash-Cache's window forward varies by a few positions), so each
length is rounded up to the next power of two (at least ``LEAST``), or to the whole cache when that is
smaller: a DualCache run meets its block and the full length, a prefix run at most
``log2(length) + 1`` lengths. The padding rows sit at the cache's sink (``KVCache.sink``): they write
there, are never valid, and no real row attends them; their logits are cut off.
"""
from __future__ import annotations

import torch

from ..models.cache import CacheFork, CacheView

LEAST = 16  # shorter forwards (a handful of positions) would each be a shape of their own


def bucket(n: int, seq_len: int) -> int:
    """The padded length of a forward of ``n`` positions over a cache of ``seq_len``."""
    if n >= seq_len:
        return n
    padded = max(LEAST, 1 << (n - 1).bit_length())
    return min(padded, seq_len)


def pad(input_ids: torch.Tensor, positions: torch.Tensor, cache: CacheView | CacheFork,
        length: int) -> tuple[torch.Tensor, torch.Tensor, CacheView | CacheFork]:
    """``input_ids`` ``[rows, n]`` and ``positions`` ``[n]`` padded to ``length``: padding rows at the
    sink, each reading its own token again; a fork's visibility grows with them (a padding row sees
    only the cache, no real row sees a padding row)."""
    n = positions.numel()
    view = cache.parent if isinstance(cache, CacheFork) else cache
    extra = length - n
    positions = torch.cat([positions, positions.new_full((extra,), view.store.sink)])
    input_ids = torch.cat([input_ids, input_ids[:, -1:].expand(-1, extra)], dim=1)
    if isinstance(cache, CacheFork) and cache.visible is not None:
        visible = cache.visible.new_zeros(length, length)
        visible[:n, :n] = cache.visible
        visible[n:, n:] = torch.eye(extra, dtype=torch.bool, device=visible.device)  # never a row that sees nothing
        cache = view.fork(visible)
    return input_ids, positions, cache
