"""How one forward's positions attend: the model's layout, the cache writes, and who watches.

A forward computes some positions of one or several requests (``Segment``: a request's cache view, its
positions, its observers, its layout). ``Attention`` is built once per forward by the model, from the segments
and the forward's ``AttentionLayout``; each layer then calls it with its fresh Q/K/V. It writes the fresh K/V
into each request's slot, attends each request's queries over its own valid entries as its layout allows, and
lets the observers see the forward (before each write, and each layer's queries and keys). Several segments are
packed one after another in the forward's one row (``[n_1 + n_2 + ...]``): every matmul runs on exactly the
positions the requests compute, with no padding; only attention lays the queries out by request. Nothing
here reads a value back from the device (writes by position tensor, masks built there, bounds the run's to
check once): a forward queues its kernels without waiting and compiles to one graph. ``attention_backends`` attend.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from .attention_backends import DEFAULT, AttentionBackend, KeyRule, get as get_backend
from .cache import CacheFork, CacheView


class ForwardObserver:
    """Watches the forwards of one request. Each hook is a no-op unless overridden."""

    def on_begin(self, positions: torch.Tensor, was_valid: torch.Tensor, live: torch.Tensor) -> None:
        """Before layer 0: the sorted ``positions`` computed, which of them held an entry before
        (``was_valid``), and the entries the queries attend now (``live``, ``[seq_len]``)."""

    def on_write(self, layer: int, k_rows: torch.Tensor, v_rows: torch.Tensor, index: slice | torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor) -> None:
        """Before ``layer`` replaces ``k_rows[:, :, index]`` (the request's K, ``[1, kv_heads,
        max_len, head_dim]``) and V by the fresh ``k``, ``v`` (``[1, kv_heads, n, head_dim]``)."""

    def on_attend(self, layer: int, q: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None) -> None:
        """The request's queries ``[1, heads, n, head_dim]`` (rotated) and every key it may attend
        (``[1, kv_heads, seq_len, head_dim]``, with ``key_mask``)."""

    def on_route(self, layer: int, experts: torch.Tensor) -> None:
        """A mixture-of-experts layer's choice: the experts each computed position was routed to
        (``[n, k]`` expert indices, in the order of the forward's positions)."""

    def on_end(self, count: int) -> None:
        """After the forward, from whoever padded it to a fixed length (``runner``): its first
        ``count`` positions were the request's, the rest padding at the cache's sink."""


class AttentionLayout(Protocol):
    """Which keys each query may attend, beyond the cache's validity: a model family's own rule
    (bidirectional for masked diffusion; causal between blocks for block diffusion)."""

    def key_mask(self, live: torch.Tensor | None, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """``[rows, 1, 1 or n, keys]`` (True: may attend), or None when every query attends every
        key (SDPA's fastest path). ``live``: each row's keys that hold an entry (``[rows, keys]``;
        None: all of them, known without asking the device);
        ``queries``: the positions of each row's queries (``[rows, n]``); ``keys``: the position of
        each key column (``[keys]``)."""

    def allows(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``key_mask``'s rule, every key live, elementwise over broadcast positions (FlexAttention's
        ``mask_mod`` asks it one query and key at a time)."""


class Bidirectional:
    """Every position attends every valid entry (LLaDA, Dream): the masked-diffusion layout."""

    def key_mask(self, live: torch.Tensor | None, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        return None if live is None else live.view(live.shape[0], 1, 1, live.shape[-1])

    def allows(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return torch.ones((), dtype=torch.bool, device=keys.device).expand(torch.broadcast_shapes(queries.shape, keys.shape))


BIDIRECTIONAL = Bidirectional()


class BlockCausal:
    """Block diffusion (SDAR, LLaDA2, Fast-dLLM v2): blocks of ``block_size`` at absolute positions,
    each attending itself and every block before it, never a later one; a finished block's K/V
    therefore never change, and an autoregressive-style cache of them is exact."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block size {block_size} must be at least 1")
        self.block_size = block_size

    def key_mask(self, live: torch.Tensor | None, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        allowed = self.allows(queries[:, :, None], keys[None, None, :])  # [rows, n, keys]
        return (allowed if live is None else allowed & live[:, None, :])[:, None]

    def allows(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return keys // self.block_size <= queries // self.block_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockCausal) and other.block_size == self.block_size

    def __repr__(self) -> str:
        return f"BlockCausal({self.block_size})"


@dataclass
class Segment:
    """One request's part of a forward: its cache (a view, or a fork that writes nothing), the sorted
    positions it computes, its observers, and its layout (None: the forward's; a batch's may differ)."""

    cache: CacheView | CacheFork
    positions: torch.Tensor
    observers: Sequence[ForwardObserver] = field(default_factory=tuple)
    layout: AttentionLayout | None = None


class Attention:
    """One forward's attention; ``attention(layer, q, k, v)`` in each layer (Q/K/V rotated).

    No segment: a plain full forward, the keys are the given positions. One segment over a view: its slot is
    read and written in place, at its positions (a padded forward's padding at the sink). One fork: each
    variant row attends the view's entries plus its own fresh K/V (or one query attends the view's other entries
    and its own rows, as the fork's ``visible`` says). Several segments: packed rows, each request's queries
    over its own slot, under its own layout. ``backend`` attends (SDPA unless named).
    """

    def __init__(self, positions: torch.Tensor, segments: Sequence[Segment], layout: AttentionLayout,
                 backend: AttentionBackend = get_backend(DEFAULT)) -> None:
        self.layout, self.segments, self.backend = layout, list(segments), backend
        self._per_device: dict[torch.device, tuple] = {}
        if not self.segments:  # the keys are the queries' own positions, all of them live
            dense = self.layout.key_mask(None, positions[None], positions)
            self._keep(positions.device, KeyRule(dense, positions, positions, None, (self.layout,)))
            return
        if len(self.segments) == 1:
            self._begin_one(self.segments[0])
        else:
            if any(isinstance(s.cache, CacheFork) for s in self.segments):
                raise ValueError("a fork's forward is one request's alone")
            self._begin_packed(positions)

    # ---------------------------------------------------------------- before layer 0
    def _begin_one(self, segment: Segment) -> None:
        cache, positions = segment.cache, segment.positions
        self.layout = segment.layout or self.layout
        if isinstance(cache, CacheFork):
            view = cache.parent
            row = view.store.valid[view.slot].clone()  # the sink too: a padded query's padding is there
            at = positions.to(row.device)
            row[at] = cache.visible is None  # a query's own positions: its fresh K/V, appended, replace them
            live, keys = row[: view.seq_len], _key_positions(row[: view.seq_len])
            dense = self.layout.key_mask(live[None], at[None], keys)
            rule = KeyRule(dense, at, keys, live[None], (self.layout,))
            if cache.visible is not None:  # the fork's own rows are its visible matrix's: the dense mask is the rule
                cached = live.expand(at.numel(), -1) if dense is None else dense[0, 0].expand(at.numel(), -1)
                rule = KeyRule(torch.cat([cached, cache.visible.to(live.device)], -1)[None, None], at, keys, None, ())
            self._keep(live.device, rule)
            return
        row = cache.store.valid[cache.slot]  # the sink last, never valid
        positions = positions.to(row.device)
        segment.positions = positions
        was_valid = row[positions]
        row.index_put_((positions,), positions < cache.max_len)  # the sink's padding rows stay invalid
        live, keys = row[: cache.seq_len], _key_positions(row[: cache.seq_len])
        dense = self.layout.key_mask(live[None], positions[None], keys)
        self._keep(row.device, positions, KeyRule(dense, positions, keys, live[None], (self.layout,)))
        for observer in segment.observers:
            observer.on_begin(positions, was_valid, live)

    def _begin_packed(self, positions: torch.Tensor) -> None:
        store = self.segments[0].cache.store
        device = store.valid.device
        positions = positions.to(device)
        counts = [s.positions.numel() for s in self.segments]
        if positions.numel() != sum(counts):
            raise ValueError(f"{positions.numel()} positions for segments of {counts}")
        slots = [s.cache.slot for s in self.segments]
        # Every slot in order: the store's tensors as they are; else this forward's rows, gathered.
        self._rows = None if slots == list(range(store.slots)) else torch.tensor(slots, device=device)
        n, total = torch.tensor(counts, device=device), positions.numel()  # each repeat's length given: none read back
        token_slot = torch.repeat_interleave(torch.tensor(slots, device=device), n, output_size=total)
        token_row = torch.repeat_interleave(torch.arange(len(slots), device=device), n, output_size=total)
        starts = torch.cumsum(n, 0) - n
        token_at = torch.arange(total, device=device) - torch.repeat_interleave(starts, n, output_size=total)
        was_valid = store.valid[token_slot, positions]
        store.valid[token_slot, positions] = True
        live = store.valid if self._rows is None else store.valid.index_select(0, self._rows)
        self._max_n = max(counts)
        queries = torch.zeros(len(slots), self._max_n, dtype=positions.dtype, device=device)  # padding: never read
        queries[token_row, token_at] = positions
        layouts, keys = [s.layout or self.layout for s in self.segments], _key_positions(live)
        if all(layout == layouts[0] for layout in layouts):  # one layout (a batch at one block size): every row at once
            dense = layouts[0].key_mask(live, queries, keys)
        else:  # each row under its own request's layout, [1, 1, n, keys] each (a layout's None: every key)
            masks = [layout.key_mask(live[r : r + 1], queries[r : r + 1], keys) for r, layout in enumerate(layouts)]
            full = live.new_ones(1, 1, self._max_n, live.shape[-1])
            dense = torch.cat([full if m is None else m.expand_as(full) for m in masks])
        rule = KeyRule(dense, positions, keys, live, layouts, token_row, token_at, self._max_n)
        self._keep(device, token_slot, positions, self._rows, rule)
        self._spans, begin = [], 0
        for s, count in zip(self.segments, counts):
            s.positions = positions[begin : begin + count]
            self._spans.append((begin, count))
            for observer in s.observers:
                observer.on_begin(s.positions, was_valid[begin : begin + count], store.valid[s.cache.slot, : s.cache.seq_len])
            begin += count

    def _keep(self, device: torch.device, *indices_and_rule) -> None:
        """This forward's indices and ``KeyRule`` on ``device``, and the backend's mask of the rule."""
        self._per_device[device] = (*indices_and_rule, self.backend.mask(indices_and_rule[-1]))

    def _on(self, device: torch.device) -> tuple:
        """This forward's indices, rule and mask on ``device`` (copied once to each other device; the mask built anew)."""
        if device not in self._per_device:
            *indices_and_rule, _ = next(iter(self._per_device.values()))
            self._keep(device, *(t.to(device, non_blocking=True) if isinstance(t, (torch.Tensor, KeyRule)) else t
                                 for t in indices_and_rule))
        return self._per_device[device]

    def routed(self, layer: int, experts: torch.Tensor) -> None:
        """A mixture-of-experts ``layer`` routed the forward's positions to ``experts`` (``[n, k]``,
        the forward's positions in order): each request's observers see its own rows."""
        spans = self._spans if len(self.segments) > 1 else [(0, experts.shape[0])] * len(self.segments)
        for s, (begin, count) in zip(self.segments, spans):
            for observer in s.observers:
                observer.on_route(layer, experts[begin : begin + count])

    # ---------------------------------------------------------------- each layer
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q``: ``[batch, heads, n, head_dim]``; ``k``/``v``: ``[batch, kv_heads, n, head_dim]``.
        Returns ``[batch, n, heads * head_dim]``."""
        if not self.segments:
            out = self.backend.attend(q, k, v, self._on(q.device)[-1])
        elif len(self.segments) > 1:
            out = self._packed(layer, q, k, v)
        elif isinstance(self.segments[0].cache, CacheFork):
            out = self._fork(layer, q, k, v)
        else:
            out = self._one(layer, q, k, v)
        return out.transpose(1, 2).flatten(2)

    def _one(self, layer: int, q, k, v) -> torch.Tensor:
        segment, cache = self.segments[0], self.segments[0].cache
        k_rows, v_rows = cache.store.k[layer][cache.slot : cache.slot + 1], cache.store.v[layer][cache.slot : cache.slot + 1]
        k, v = k.to(k_rows.dtype), v.to(v_rows.dtype)
        index, rule, mask = self._on(k_rows.device)
        for observer in segment.observers:
            observer.on_write(layer, k_rows, v_rows, index, k, v)
        k_rows.index_copy_(2, index, k)
        v_rows.index_copy_(2, index, v)
        keys, values = k_rows[:, :, : cache.seq_len], v_rows[:, :, : cache.seq_len]
        for observer in segment.observers:
            observer.on_attend(layer, q, keys, rule.dense)
        return self.backend.attend(q, keys, values, mask)

    def _fork(self, layer: int, q, k, v) -> torch.Tensor:
        view, positions = self.segments[0].cache.parent, self.segments[0].positions
        k_rows = view.store.k[layer][view.slot : view.slot + 1]
        v_rows = view.store.v[layer][view.slot : view.slot + 1]
        _, mask = self._on(k_rows.device)
        if self.segments[0].cache.visible is not None:  # one query: the cache, then its own rows
            keys = torch.cat([k_rows[:, :, : view.seq_len], k.to(k_rows.dtype)], 2)
            values = torch.cat([v_rows[:, :, : view.seq_len], v.to(v_rows.dtype)], 2)
            return self.backend.attend(q, keys, values, mask)
        at, rows = positions.to(k_rows.device), k.shape[0]  # written over the whole row, the sink included
        keys = k_rows.expand(rows, -1, -1, -1).index_copy(2, at, k.to(k_rows.dtype))[:, :, : view.seq_len]
        values = v_rows.expand(rows, -1, -1, -1).index_copy(2, at, v.to(v_rows.dtype))[:, :, : view.seq_len]
        return self.backend.attend(q, keys, values, mask)

    def _packed(self, layer: int, q, k, v) -> torch.Tensor:
        k_store, v_store = self.segments[0].cache.store.k[layer], self.segments[0].cache.store.v[layer]
        token_slot, index, rows, rule, mask = self._on(k_store.device)
        k, v = k.to(k_store.dtype), v.to(v_store.dtype)
        for s, (begin, count) in zip(self.segments, self._spans):
            for observer in s.observers:
                at = index[begin : begin + count]
                observer.on_write(layer, k_store[s.cache.slot : s.cache.slot + 1], v_store[s.cache.slot : s.cache.slot + 1],
                                  at, k[:, :, begin : begin + count], v[:, :, begin : begin + count])
        # Advanced indices on dims 0 and 2 put the N tokens first: values go in as [N, heads, dim].
        k_store[token_slot, :, index] = k[0].transpose(0, 1)
        v_store[token_slot, :, index] = v[0].transpose(0, 1)
        keys = k_store if rows is None else k_store.index_select(0, rows)
        values = v_store if rows is None else v_store.index_select(0, rows)
        for r, (s, (begin, count)) in enumerate(zip(self.segments, self._spans)):
            for observer in s.observers:
                observer.on_attend(layer, q[:, :, begin : begin + count], keys[r : r + 1, :, : s.cache.seq_len],
                                   None if rule.dense is None else rule.dense[r : r + 1, ..., : s.cache.seq_len])
        return self.backend.attend_packed(q, keys, values, rule, mask)


def begin(positions: torch.Tensor, cache: CacheView | CacheFork | None, observers: Sequence[ForwardObserver],
          segments: Sequence[Segment] | None, layout: AttentionLayout, attention_backend: str = DEFAULT) -> Attention:
    """The attention of a forward over ``positions``: of ``segments`` (packed requests), else of one
    request's ``cache`` watched by ``observers``, else (no cache) a plain full forward; attended by
    the backend registered as ``attention_backend``."""
    if segments is None:
        segments = [] if cache is None else [Segment(cache, positions, observers)]
    return Attention(positions, segments, layout, get_backend(attention_backend))


def _key_positions(live: torch.Tensor) -> torch.Tensor:  # the position of each key column of a cache: its index
    return torch.arange(live.shape[-1], device=live.device)
