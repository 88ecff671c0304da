"""The KV cache: K/V per layer in slots, which entries are valid, and one request's view of it.

One preallocated K and V tensor per layer, shaped ``[slots, kv_heads, max_len, head_dim]`` (gpt-fast's
``KVCache`` is the model), on the device of that layer: a model spread over GPUs by ``device_map``
keeps each layer's K/V beside its weights. Each row has one position more than it holds, the
``sink``: a forward padded to a fixed query length (``runner.buckets``) writes its padding rows there,
never valid and never attended, so every write is a scatter by position tensor. A request holds one slot (``alloc``/``free``), so a
batch can admit a new request into a finished one's slot without moving anyone's entries. The cache
holds K/V and validity, nothing else: what a forward writes and attends is ``attention.Attention``'s
business, and drift, probes and counts are observers of the forward (``observers.py``).
"""
from __future__ import annotations

from typing import Sequence

import torch


class KVCache:
    """``slots`` rows of K/V per layer and their validity ``[slots, max_len]``, preallocated."""

    def __init__(
        self,
        n_layers: int,
        slots: int,
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
        shape = (slots, n_kv_heads, max_len + 1, head_dim)  # + the sink
        self.k = [torch.zeros(shape, dtype=dtype, device=d) for d in devices]
        self.v = [torch.zeros(shape, dtype=dtype, device=d) for d in devices]
        self.valid = torch.zeros(slots, max_len + 1, dtype=torch.bool, device=devices[0])
        self.max_len = self.sink = max_len
        self._free = list(range(slots))

    @property
    def slots(self) -> int:
        return self.valid.shape[0]

    @property
    def in_use(self) -> int:
        """Slots held by requests now."""
        return self.slots - len(self._free)

    def alloc(self, seq_len: int | None = None) -> "CacheView":
        """A free slot (empty) as a request's view attending over its first ``seq_len`` positions."""
        if not self._free:
            raise RuntimeError(f"all {self.slots} cache slots are in use")
        return CacheView(self, self._free.pop(0), seq_len or self.max_len)

    def free(self, view: "CacheView") -> None:
        """Give the view's slot back, emptied, for the next request."""
        if view.slot in self._free:
            raise RuntimeError(f"cache slot {view.slot} is already free")
        view.invalidate()
        self._free.append(view.slot)
        self._free.sort()

    def bytes_per_position(self) -> int:
        """K and V of one position of one slot, over every layer."""
        k = self.k[0]
        return 2 * len(self.k) * k.shape[1] * k.shape[3] * k.element_size()


class CacheView:
    """One request's slot of a ``KVCache``: its K/V rows (views), its valid entries, and what its
    cache policy may do with them (count, evict, fork for a verification forward)."""

    def __init__(self, store: KVCache, slot: int, seq_len: int) -> None:
        if seq_len > store.max_len:
            raise ValueError(f"a view of {seq_len} positions over a cache of {store.max_len}")
        self.store, self.slot, self.seq_len = store, slot, seq_len

    @property
    def k(self) -> list[torch.Tensor]:
        """Per layer ``[1, kv_heads, max_len + 1, head_dim]``: this slot's keys, the sink last (a view of the store)."""
        return [k[self.slot : self.slot + 1] for k in self.store.k]

    @property
    def v(self) -> list[torch.Tensor]:
        return [v[self.slot : self.slot + 1] for v in self.store.v]

    @property
    def valid(self) -> torch.Tensor:
        """``[max_len]`` which of this slot's entries hold K/V (a view of the store's row)."""
        return self.store.valid[self.slot, : self.store.max_len]

    @property
    def max_len(self) -> int:
        return self.store.max_len

    def num_cached(self) -> int:
        return int(self.valid[: self.seq_len].sum())

    def invalidate(self, positions: torch.Tensor | None = None) -> None:
        """Drop entries, K and V together (zeroed, so nothing stale can be read); None drops all."""
        valid = self.valid
        index = slice(None) if positions is None else positions.to(valid.device)
        valid[index] = False
        for k, v in zip(self.store.k, self.store.v):
            at = index if isinstance(index, slice) else index.to(k.device)
            k[self.slot, :, at] = 0
            v[self.slot, :, at] = 0

    evict = invalidate  # what a cache policy with a budget calls it

    def fork(self, visible: torch.Tensor | None = None) -> "CacheFork":
        """A view for verification forwards, which write nothing back. Without ``visible``: one row
        per variant sequence, each seeing this cache with its own fresh K/V in place of the cached
        entries at its positions. With ``visible`` (``[n, n]`` bool): one query of ``n`` tokens
        (positions may repeat) that reads this cache everywhere but at its own positions, and whose
        row i sees row j's fresh K/V where ``visible[i, j]``."""
        return CacheFork(self, visible)

    def bytes_per_position(self) -> int:
        return self.store.bytes_per_position()


class CacheFork:
    """A forward over a ``CacheView`` that writes nothing back (see ``CacheView.fork``)."""

    def __init__(self, parent: CacheView, visible: torch.Tensor | None = None) -> None:
        self.parent, self.visible = parent, visible
