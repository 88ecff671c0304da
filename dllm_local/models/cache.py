"""Position-indexed KV cache shared by every model family.

One preallocated K and V tensor per layer, shaped ``[batch, kv_heads, max_len, head_dim]``
(gpt-fast's ``KVCache.update(input_pos, k, v)`` is the model), on the device of that layer: a
model spread over GPUs by ``device_map`` keeps each layer's K/V beside its weights. A forward
writes the K/V of the positions it recomputes and attends over every valid position. Every cache policy
(prefix, dual, FreeCache, adaptive) is only a choice of which positions to recompute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class ForwardStats:
    """What one forward did with the cache: entries recomputed and entries read back."""

    recomputed: int = 0
    reads: int = 0


class KVCache:
    """K, V and validity per position, preallocated; ``seq_len`` is the part a forward attends over.

    With ``track_drift`` each write first takes the dot products of the entries it is about to
    replace with the fresh ones (and their norms), so that ``drift_cosines`` gives the KV drift of
    the last forward: no snapshot of the cache and no copy of its entries (a run of positions is
    read as a view). Those few products are part of the forward's time.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | Sequence[torch.device | str] = "cpu",
    ) -> None:
        """``device``: one for every layer, or one per layer (the first holds the validity mask)."""
        devices = [device] * n_layers if isinstance(device, (str, torch.device)) else list(device)
        if len(devices) != n_layers:
            raise ValueError(f"{len(devices)} layer devices for {n_layers} layers")
        shape = (batch, n_kv_heads, max_len, head_dim)
        self._over([torch.zeros(shape, dtype=dtype, device=d) for d in devices],
                   [torch.zeros(shape, dtype=dtype, device=d) for d in devices],
                   torch.zeros(max_len, dtype=torch.bool, device=devices[0]))

    @classmethod
    def over(cls, k: list[torch.Tensor], v: list[torch.Tensor], valid: torch.Tensor) -> "KVCache":
        """A cache over existing tensors: one request's row of a ``BatchKVCache``, whose
        storage its writes and evictions change."""
        cache = cls.__new__(cls)
        cache._over(k, v, valid)
        return cache

    def _over(self, k: list[torch.Tensor], v: list[torch.Tensor], valid: torch.Tensor) -> None:
        self.k, self.v, self.valid = k, v, valid
        max_len = valid.shape[-1]
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
        # Per layer, while tracking drift: dot products of replaced and fresh K and V, and their norms.
        self._products: list[torch.Tensor] = []
        self._was_valid: torch.Tensor | None = None
        self._replaces_any = True  # this forward replaces some valid entry: there is drift to measure
        # This forward's write index and key mask, copied once to each other device that asks.
        self._on_device: dict[torch.device, tuple] = {}

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def begin_forward(self, positions: torch.Tensor) -> None:
        """Called by the model before layer 0 with the positions it recomputes."""
        lo, hi = (int(positions[0]), int(positions[-1])) if positions.numel() else (0, -1)  # sorted
        if hi >= self.max_len:
            raise ValueError(f"position {hi} is beyond the cache length {self.max_len}")
        # A run of positions (a refresh, a block, a block and all after it) is read and written as
        # a slice: a view instead of a gather, a copy instead of a scatter.
        positions = positions.to(self.valid.device)
        self._index = slice(lo, hi + 1) if hi - lo + 1 == positions.numel() else positions
        self._was_valid = self.valid[positions]
        # The first forward (and any over an emptied cache) replaces nothing: its drift is all NaN,
        # known without the dot products.
        self._replaces_any = self.track_drift and bool(self._was_valid.any())
        self.valid[positions] = True
        live = self.valid[: self.seq_len]
        self._key_mask = _key_mask(live)
        self._on_device = {self.valid.device: (self._index, self._key_mask)}
        recomputed = positions.numel()
        # Reads count the entries attended to that this forward did not recompute.
        self.last_stats = ForwardStats(recomputed=recomputed, reads=int(live.sum()) - recomputed)
        self.last_positions = positions
        self._products = []

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Write fresh K/V at ``positions``; return all keys, values and the key mask to attend."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        index, key_mask = self._for_device(k_cache.device)
        if self._replaces_any:  # the entries about to be replaced, against the fresh ones
            products = _drift_products(k_cache[:, :, index], k, v_cache[:, :, index], v)
            self._products.append(products.to(self.valid.device, non_blocking=True))
        k_cache[:, :, index] = k
        v_cache[:, :, index] = v
        return k_cache[:, :, : self.seq_len], v_cache[:, :, : self.seq_len], key_mask

    def _for_device(self, device: torch.device) -> tuple:
        """The write index and key mask of this forward on ``device``."""
        if device not in self._on_device:
            index, mask = self._index, self._key_mask
            self._on_device[device] = (index if isinstance(index, slice) else index.to(device, non_blocking=True),
                                       None if mask is None else mask.to(device, non_blocking=True))
        return self._on_device[device]

    def probe(self, layer: int, q: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None,
              positions: torch.Tensor) -> None:
        """At ``probe_layer``, keep the attention mass of the probe queries over every key
        (``[seq_len]``, summed over batch, heads and queries): one explicit softmax at one layer,
        beside the fused attention. Any other layer passes."""
        if layer != self.probe_layer:
            return
        rows = torch.searchsorted(positions, self.probe_queries.to(positions.device))
        q = q[:, :, rows].float()
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)  # grouped-query: one K head per group
        scores = q @ keys.to(q.dtype).transpose(-1, -2) / q.shape[-1] ** 0.5
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask, float("-inf"))
        self.attention_mass = scores.softmax(-1).sum((0, 1, 2))

    def drift_cosines(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last forward's KV drift: ``[layers, n]`` for K and for V over its recomputed
        positions, NaN where the cache held nothing before. None unless ``track_drift``."""
        if not self.track_drift:
            return None
        if not self._products:
            nothing = torch.full((len(self.k), len(self._was_valid)), float("nan"), device=self.valid.device)
            return nothing, nothing
        cos = _cosines(torch.stack(self._products))  # [layers, 2, n]
        cos = torch.where(self._was_valid, cos, torch.tensor(float("nan"), device=cos.device))
        return cos[:, 0], cos[:, 1]

    def drift_summary(self) -> torch.Tensor | None:
        """The last forward's KV drift in four numbers per layer, ``[layers, 4]``: K mean, K min,
        V mean, V min of the cosines over the positions it replaced (NaN where it replaced none).
        The trace's summary level; the same cosines as ``drift_cosines``, without the NaN
        bookkeeping over every position. None unless ``track_drift``."""
        if not self.track_drift:
            return None
        if not self._products or not bool(self._was_valid.any()):
            return torch.full((len(self.k), 4), float("nan"), device=self.valid.device)
        cos = _cosines(torch.stack(self._products)[..., self._was_valid])  # [layers, 2, replaced]
        return torch.stack([cos.mean(-1), cos.amin(-1)], -1).flatten(1)

    def fork(self) -> "CacheFork":
        """A copy-on-write view for verification forwards: they see the cache plus their own fresh
        K/V, and leave the cache, its counts and its drift as they were."""
        return CacheFork(self)

    def invalidate(self, positions: torch.Tensor | None = None) -> None:
        """Drop entries, K and V together (zeroed, so nothing stale can be read); None drops all."""
        index = slice(None) if positions is None else positions.to(self.valid.device)
        self.valid[index] = False
        for k, v in zip(self.k, self.v):
            at = index if isinstance(index, slice) else index.to(k.device)
            k[:, :, at] = 0
            v[:, :, at] = 0

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
        live[positions.to(live.device)] = True
        self._key_mask = _key_mask(live)
        self._masks = {live.device: self._key_mask}

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        p = self.parent
        rows, device = k.shape[0], p.k[layer].device
        if device not in self._masks:
            self._masks[device] = None if self._key_mask is None else self._key_mask.to(device, non_blocking=True)
        positions = positions.to(device)
        keys = p.k[layer][:, :, : p.seq_len].expand(rows, -1, -1, -1).index_copy(2, positions, k.to(p.k[layer].dtype))
        values = p.v[layer][:, :, : p.seq_len].expand(rows, -1, -1, -1).index_copy(2, positions, v.to(p.v[layer].dtype))
        return keys, values, self._masks[device]



class BatchKVCache:
    """The KV cache of a batch of requests: row r holds request r's K/V and valid positions.

    A batched forward packs the requests' positions one after another (``[n_1 + n_2 + ...]``,
    ``row_tokens`` says how many each): every matmul runs on exactly the positions the requests
    recompute, with no padding. Only attention needs the rows apart: ``query_rows`` lays the
    queries out as ``[rows, heads, max n, dim]`` and each row attends to its own valid positions.
    ``views[r]`` is request r's own ``KVCache`` over this storage, through which its cache policy
    plans, evicts and forks as it would alone. ``keep`` drops finished requests' rows.
    """

    def __init__(self, model, lengths: list[int]) -> None:
        cache = model.new_cache(len(lengths), max(lengths))
        self.k, self.v = cache.k, cache.v
        self.valid = torch.zeros(len(lengths), cache.max_len, dtype=torch.bool, device=cache.valid.device)
        self.seq_len = cache.max_len
        self.row_tokens: list[int] = []
        self.views = []
        for r, length in enumerate(lengths):
            view = KVCache.over([k[r : r + 1] for k in self.k], [v[r : r + 1] for v in self.v], self.valid[r])
            view.seq_len = length
            self.views.append(view)

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order), one layer at a time: the copy never holds a second
        whole cache, since each view moves to the new layer before the next is copied."""
        staying = [self.views[r] for r in rows]
        for r in sorted(set(range(self.batch)) - set(rows)):
            self.views[r].k = self.views[r].v = []  # a finished request's view lets go of the storage
        index = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        for layer in range(len(self.k)):
            at = index.to(self.k[layer].device)
            self.k[layer], self.v[layer] = self.k[layer].index_select(0, at), self.v[layer].index_select(0, at)
            for j, view in enumerate(staying):
                view.k[layer], view.v[layer] = self.k[layer][j : j + 1], self.v[layer][j : j + 1]
        self.valid = self.valid.index_select(0, index)
        for j, view in enumerate(staying):
            view.valid = self.valid[j]
        self.views = staying

    def begin_forward(self, positions: torch.Tensor) -> None:
        """Called by the model before layer 0 with the packed positions (each row's sorted)."""
        device = self.valid.device
        positions = positions.to(device)
        counts = torch.tensor(self.row_tokens, device=device)
        if positions.numel() != int(counts.sum()) or len(self.row_tokens) != self.batch:
            raise ValueError(f"{positions.numel()} positions for rows of {self.row_tokens} ({self.batch} rows)")
        rows = torch.repeat_interleave(torch.arange(self.batch, device=device), counts)
        starts = torch.cumsum(counts, 0) - counts
        slots = torch.arange(positions.numel(), device=device) - torch.repeat_interleave(starts, counts)
        was_valid = self.valid[rows, positions]
        self.valid[rows, positions] = True
        live = self.valid[:, : self.seq_len]
        self._on_device = {device: (rows, positions, slots, _key_mask(live))}
        reads = (live.sum(1) - counts).tolist()
        self._spans = list(zip(starts.tolist(), self.row_tokens))
        self._tracking = [view.track_drift for view in self.views]
        for view, (begin, n), r in zip(self.views, self._spans, reads):
            view.last_stats = ForwardStats(recomputed=n, reads=r)
            view.last_positions = positions[begin : begin + n]
            view._was_valid, view._products = was_valid[begin : begin + n], []

    def _for_device(self, device: torch.device) -> tuple:
        if device not in self._on_device:
            self._on_device[device] = tuple(None if t is None else t.to(device, non_blocking=True)
                                            for t in self._on_device[self.valid.device])
        return self._on_device[device]

    def query_rows(self, q: torch.Tensor) -> torch.Tensor:
        """Packed queries ``[1, heads, N, dim]`` as ``[rows, heads, max n, dim]`` (zero padded)."""
        rows, _, slots, _ = self._for_device(q.device)
        out = q.new_zeros(self.batch, q.shape[1], max(self.row_tokens), q.shape[3])
        out[rows, :, slots] = q[0].transpose(0, 1)
        return out

    def token_rows(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output ``[rows, heads, max n, dim]`` back to the packed ``[1, heads, N, dim]``."""
        rows, _, slots, _ = self._for_device(out.device)
        return out[rows, :, slots].transpose(0, 1)[None]

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Write the packed fresh K/V into their rows; return every row's keys, values and mask."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        rows, index, _, mask = self._for_device(k_cache.device)
        # Advanced indices on dims 0 and 2 put the N tokens first: values go in as [N, heads, dim].
        k, v = k[0].to(k_cache.dtype).transpose(0, 1), v[0].to(v_cache.dtype).transpose(0, 1)
        if any(self._tracking):  # each request's drift, as its own cache would take it (see KVCache)
            products = _drift_products(k_cache[rows, :, index], k, v_cache[rows, :, index], v).transpose(1, 2)
            for view, (begin, n), track in zip(self.views, self._spans, self._tracking):
                if track:  # [6, 1, heads, n]: one batch row
                    view._products.append(products[:, None, :, begin : begin + n].to(self.valid.device, non_blocking=True))
        k_cache[rows, :, index] = k
        v_cache[rows, :, index] = v
        return k_cache[:, :, : self.seq_len], v_cache[:, :, : self.seq_len], mask

    def probe(self, layer: int, q: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None,
              positions: torch.Tensor) -> None:
        """Each request's own probe, at its own layer, over its own row (``q`` by rows)."""
        for r, view in enumerate(self.views):
            if view.probe_layer == layer:
                mask = None if key_mask is None else key_mask[r : r + 1]
                view.probe(layer, q[r : r + 1], keys[r : r + 1], mask, view.last_positions.to(q.device))


def _drift_products(old_k: torch.Tensor, k: torch.Tensor, old_v: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dot products of the replaced and fresh K and V, and their squared norms, over head_dim:
    ``[6, *leading dims]``, in float32 (what ``drift_cosines`` turns into cosines)."""
    vd = torch.linalg.vecdot
    old_k, k, old_v, v = old_k.float(), k.float(), old_v.float(), v.float()
    return torch.stack([vd(old_k, k), vd(old_k, old_k), vd(k, k), vd(old_v, v), vd(old_v, old_v), vd(v, v)])


def _cosines(products: torch.Tensor) -> torch.Tensor:
    """K and V cosines ``[layers, 2, n]`` from ``_drift_products`` stacked over layers
    (``[layers, 6, batch, heads, n]``): dot products and norms summed over heads, then the batch mean."""
    p = products.sum(-2)
    return (p[:, 0::3] / (p[:, 1::3] * p[:, 2::3]).sqrt().clamp_min(1e-8)).mean(-2)


def _key_mask(live: torch.Tensor) -> torch.Tensor | None:
    """``[rows, 1, 1, keys]`` from one row's (or each row's) valid keys; None when all are."""
    return None if bool(live.all()) else live.view(-1, 1, 1, live.shape[-1])


def position_cosine(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Cosine per position over heads x head_dim, averaged over the batch.

    ``[batch, heads, n, head_dim]`` -> ``[n]``; dot products over head_dim summed over heads
    rather than a transposed copy (the trace computes this at every step).
    """
    old, new = old.float(), new.float()
    dot = torch.linalg.vecdot(old, new).sum(-2)
    norms = torch.linalg.vecdot(old, old).sum(-2) * torch.linalg.vecdot(new, new).sum(-2)
    return (dot / norms.sqrt().clamp_min(1e-8)).mean(-2)
