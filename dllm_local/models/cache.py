"""Position-indexed KV cache shared by every model family.

One preallocated K and V tensor per layer, shaped ``[batch, kv_heads, max_len, head_dim]``
(gpt-fast's ``KVCache.update(input_pos, k, v)`` is the model). A forward writes the K/V of
the positions it recomputes and attends over every valid position. Every cache policy
(prefix, dual, FreeCache, adaptive) is only a choice of which positions to recompute.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ForwardStats:
    """What one forward did with the cache: entries recomputed and entries read back."""

    recomputed: int = 0
    reads: int = 0


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.valid = torch.zeros(max_len, dtype=torch.bool, device=device)
        # The tokens of the sequence: a family that must recompute a position the caller did not
        # name (Dream's predecessors) takes its token from here. Forwards write the tokens they
        # compute from; a sampler keeps it in step with the sequence it decodes.
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.max_len = max_len
        self.seq_len = max_len
        self.last_positions: torch.Tensor | None = None
        self.last_stats = ForwardStats()
        self._snapshot: tuple | None = None
        # A read-only forward (self-verification) sees its fresh K/V but leaves the cache as it was.
        self.read_only = False

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def begin_forward(self, positions: torch.Tensor, input_ids: torch.Tensor) -> None:
        """Called by the model before layer 0: fixes which entries this forward reads."""
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is beyond the cache length {self.max_len}")
        valid_after = self.valid.clone()
        valid_after[positions] = True
        self._live = valid_after[: self.seq_len]
        if self.read_only:
            return  # leaves the cache, its counts and its drift snapshot as they were
        recomputed = positions.numel()
        # Reads count the entries attended to that this forward did not recompute.
        self.last_stats = ForwardStats(recomputed=recomputed, reads=int(self._live.sum()) - recomputed)
        self.valid = valid_after
        self.tokens[:, positions] = input_ids[: self.tokens.shape[0]]
        self.last_positions = positions

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Write fresh K/V at ``positions``; return all keys, values and the key mask to attend."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        live = self._live
        if self.read_only:
            batch = k.shape[0]
            keys = k_cache[:, :, : self.seq_len].expand(batch, -1, -1, -1).index_copy(2, positions, k.to(k_cache.dtype))
            values = v_cache[:, :, : self.seq_len].expand(batch, -1, -1, -1).index_copy(2, positions, v.to(v_cache.dtype))
        else:
            k_cache[:, :, positions] = k.to(k_cache.dtype)
            v_cache[:, :, positions] = v.to(v_cache.dtype)
            keys, values = k_cache[:, :, : self.seq_len], v_cache[:, :, : self.seq_len]
        if bool(live.all()):
            return keys, values, None
        return keys, values, live.view(1, 1, 1, -1)

    def snapshot(self, positions: torch.Tensor) -> None:
        """Keep the entries at ``positions`` before a forward overwrites them (for drift_cosines).

        Taken by the caller outside the timed forward, so that the bookkeeping never counts as
        model time.
        """
        self._snapshot = (
            positions, self.valid[positions].clone(),
            torch.stack([k[:, :, positions] for k in self.k]), torch.stack([v[:, :, positions] for v in self.v]),
        )

    def drift_cosines(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per snapshot position, the cosine of its entry now with the entry it held at the snapshot
        (its previous fresh value): the KV drift, measured without a second forward.

        ``[layers, n]`` for K and for V; NaN where the cache held nothing before.
        """
        if self._snapshot is None:
            return None
        pos, was_valid, old_k, old_v = self._snapshot
        new_k = torch.stack([k[:, :, pos] for k in self.k])
        new_v = torch.stack([v[:, :, pos] for v in self.v])
        nan = torch.tensor(float("nan"), device=was_valid.device)
        cos_k = torch.where(was_valid, position_cosine(old_k, new_k), nan)
        cos_v = torch.where(was_valid, position_cosine(old_v, new_v), nan)
        return cos_k, cos_v

    def fresh_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of the positions the last forward recomputed (``[batch, kv_heads, n, head_dim]``)."""
        pos = self.last_positions
        return self.k[layer][:, :, pos], self.v[layer][:, :, pos]

    def invalidate(self, positions: torch.Tensor | None = None) -> None:
        """Drop entries, K and V together (zeroed, so nothing stale can be read); None drops all."""
        index = slice(None) if positions is None else positions
        self.valid[index] = False
        for k, v in zip(self.k, self.v):
            k[:, :, index] = 0
            v[:, :, index] = 0

    def num_cached(self) -> int:
        return int(self.valid[: self.seq_len].sum())

    def bytes_per_position(self) -> int:
        k = self.k[0]
        return 2 * len(self.k) * k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()


def position_cosine(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Cosine per position over heads x head_dim, averaged over the batch.

    ``[..., batch, heads, n, head_dim]`` -> ``[..., n]``.
    """
    old = old.float().transpose(-3, -2).flatten(-2)
    new = new.float().transpose(-3, -2).flatten(-2)
    return F.cosine_similarity(old, new, dim=-1).mean(-2)
