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
        # The token each valid entry was computed from (Dream recomputes predecessors from it).
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.max_len = max_len
        self.seq_len = max_len
        # When on, every update keeps the entries it overwrites, so that drift_cosines() can give
        # per recomputed position the cosine between the entry the cache held (its previous fresh
        # value) and the fresh one: the KV drift the page shows, without a second forward.
        self.track_drift = False
        self._overwritten: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.last_positions: torch.Tensor | None = None
        self.last_stats = ForwardStats()
        self._previously_valid: torch.Tensor | None = None
        # A read-only forward (self-verification) sees its fresh K/V but leaves the cache as it was.
        self.read_only = False

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def begin_forward(self, positions: torch.Tensor, input_ids: torch.Tensor) -> None:
        """Called by the model before layer 0: fixes which entries this forward reads."""
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is beyond the cache length {self.max_len}")
        self._previously_valid = self.valid.clone()
        recomputed = positions.numel()
        valid_after = self.valid.clone()
        valid_after[positions] = True
        # Reads count the entries attended to that this forward did not recompute.
        self.last_stats = ForwardStats(recomputed=recomputed, reads=int(valid_after[: self.seq_len].sum()) - recomputed)
        if not self.read_only:
            self.valid = valid_after
            self.tokens[:, positions] = input_ids[: self.tokens.shape[0]]
        self._live = valid_after[: self.seq_len]
        self.last_positions = positions
        self._overwritten = {}

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Write fresh K/V at ``positions``; return all keys, values and the key mask to attend."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        if self.track_drift and not self.read_only:
            self._overwritten[layer] = (k_cache[:, :, positions], v_cache[:, :, positions])
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

    def drift_cosines(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Cosine of each recomputed entry with the value it replaced: ``[layers, n]`` for K and V.

        NaN where the cache held nothing before. Computed after the forward, all layers at once,
        so that the bookkeeping never counts as model time.
        """
        if not self._overwritten:
            return None
        layers = sorted(self._overwritten)
        pos = self.last_positions
        old_k = torch.stack([self._overwritten[l][0] for l in layers])
        old_v = torch.stack([self._overwritten[l][1] for l in layers])
        new_k = torch.stack([self.k[l][:, :, pos] for l in layers])
        new_v = torch.stack([self.v[l][:, :, pos] for l in layers])
        was_valid = self._previously_valid[pos]
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
