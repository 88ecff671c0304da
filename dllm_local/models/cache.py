"""Position-indexed KV cache shared by every model family.

One preallocated K and V tensor per layer, shaped ``[batch, kv_heads, max_len, head_dim]``
(gpt-fast's ``KVCache.update(input_pos, k, v)`` is the model). A forward writes the K/V of
the positions it recomputes and attends over every valid position. Every cache policy
(prefix, dual, FreeCache, adaptive) is only a choice of which positions to recompute.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardStats:
    """What one forward did with the cache: entries recomputed and entries read back."""

    recomputed: int = 0
    reads: int = 0


class KVCache:
    """K, V and validity per position, preallocated; ``seq_len`` is the part a forward attends over.

    With ``track_drift`` each write also keeps the entries it replaces (read just before they are
    overwritten) beside the fresh ones it was handed, so that ``drift_cosines`` gives the KV drift
    of the last forward: no snapshot of the cache, no second gather, and the cosines computed after
    the forward, outside its time.
    """

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
        self.max_len = max_len
        self.seq_len = max_len
        self.track_drift = False
        self.last_positions: torch.Tensor | None = None
        self.last_stats = ForwardStats()
        # An attention probe for a cache policy that watches where the current block looks:
        # at ``probe_layer``, the attention mass the queries at ``probe_queries`` put on each key.
        self.probe_layer: int | None = None
        self.probe_queries: torch.Tensor | None = None
        self.attention_mass: torch.Tensor | None = None
        self._replaced: list[torch.Tensor] = []  # per layer: old K, old V at the positions written
        self._written: list[torch.Tensor] = []  # per layer: the fresh K, V
        self._was_valid: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def begin_forward(self, positions: torch.Tensor) -> None:
        """Called by the model before layer 0 with the positions it recomputes."""
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is beyond the cache length {self.max_len}")
        self._was_valid = self.valid[positions]
        self.valid[positions] = True
        live = self.valid[: self.seq_len]
        self._key_mask = _key_mask(live)
        recomputed = positions.numel()
        # Reads count the entries attended to that this forward did not recompute.
        self.last_stats = ForwardStats(recomputed=recomputed, reads=int(live.sum()) - recomputed)
        self.last_positions = positions
        self._replaced, self._written = [], []

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Write fresh K/V at ``positions``; return all keys, values and the key mask to attend."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        if self.track_drift:
            self._replaced += [k_cache[:, :, positions], v_cache[:, :, positions]]
            self._written += [k, v]
        k_cache[:, :, positions] = k
        v_cache[:, :, positions] = v
        return k_cache[:, :, : self.seq_len], v_cache[:, :, : self.seq_len], self._key_mask

    def probe(self, q: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None, positions: torch.Tensor) -> None:
        """Keep the attention mass of the probe queries over every key (``[seq_len]``, summed over
        batch, heads and queries): one explicit softmax at one layer, beside the fused attention."""
        rows = torch.searchsorted(positions, self.probe_queries)
        q = q[:, :, rows].float()
        scores = q @ keys.to(q.dtype).transpose(-1, -2) / q.shape[-1] ** 0.5
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask, float("-inf"))
        self.attention_mass = scores.softmax(-1).sum((0, 1, 2))

    def drift_cosines(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last forward's KV drift: ``[layers, n]`` for K and for V over its recomputed
        positions, NaN where the cache held nothing before. None unless ``track_drift``."""
        if not self._written:
            return None
        cos = torch.stack([position_cosine(a, b) for a, b in zip(self._replaced, self._written)])  # [2 * layers, n]
        cos = torch.where(self._was_valid, cos, torch.tensor(float("nan"), device=cos.device))
        return cos[0::2], cos[1::2]

    def fork(self) -> "CacheFork":
        """A copy-on-write view for verification forwards: they see the cache plus their own fresh
        K/V, and leave the cache, its counts and its drift as they were."""
        return CacheFork(self)

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


class CacheFork:
    """A forward over a cache that writes nothing back (see ``KVCache.fork``); its batch may be
    larger than the cache's (one row per variant sequence)."""

    def __init__(self, parent: KVCache) -> None:
        self.parent = parent

    def begin_forward(self, positions: torch.Tensor) -> None:
        live = self.parent.valid[: self.parent.seq_len].clone()
        live[positions] = True
        self._key_mask = _key_mask(live)

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        p = self.parent
        rows = k.shape[0]
        keys = p.k[layer][:, :, : p.seq_len].expand(rows, -1, -1, -1).index_copy(2, positions, k.to(p.k[layer].dtype))
        values = p.v[layer][:, :, : p.seq_len].expand(rows, -1, -1, -1).index_copy(2, positions, v.to(p.v[layer].dtype))
        return keys, values, self._key_mask


def _key_mask(live: torch.Tensor) -> torch.Tensor | None:
    return None if bool(live.all()) else live.view(1, 1, 1, -1)


def position_cosine(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Cosine per position over heads x head_dim, averaged over the batch.

    ``[batch, heads, n, head_dim]`` -> ``[n]``; dot products over head_dim summed over heads
    rather than a transposed copy (the trace computes this at every step).
    """
    old, new = old.float(), new.float()
    dot = torch.linalg.vecdot(old, new).sum(-2)
    norms = torch.linalg.vecdot(old, old).sum(-2) * torch.linalg.vecdot(new, new).sum(-2)
    return (dot / norms.sqrt().clamp_min(1e-8)).mean(-2)
