"""What every attention backend is given: a forward's ``KeyRule``, and the protocol a backend keeps."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, Sequence

import torch


class Allows(Protocol):
    """A layout's rule for one query and one key, elementwise over broadcast position tensors
    (``models.attention.AttentionLayout.allows``)."""

    def allows(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor: ...


@dataclass
class KeyRule:
    """Which keys each query of one forward may attend: as the layout's dense mask, and as the data
    it was built from, so that a backend takes the form it runs on. Query ``i``, at position
    ``queries[i]``, of row ``query_row[i]`` (None: one request, every row the same queries),
    attends key column ``j`` of its own row where ``live[row, j]`` (None: every key) and the row's
    layout allows the pair (key ``j`` at position ``keys[j]``). No ``layouts``: the dense mask is
    the whole rule (a fork's own ``visible`` rows)."""

    dense: torch.Tensor | None  # [rows, 1, 1 or n, keys], SDPA's mask and what observers read; None: every key
    queries: torch.Tensor  # [N]
    keys: torch.Tensor  # [keys]
    live: torch.Tensor | None  # [rows, keys]
    layouts: Sequence[Allows]  # one for every row, or one per row
    query_row: torch.Tensor | None = None  # [N]: packed requests, each query's row (its request's slot)
    query_col: torch.Tensor | None = None  # [N]: its place in its row, were the rows padded to ``width``
    width: int = 0  # the most queries of one row

    def to(self, device: torch.device, non_blocking: bool = False) -> KeyRule:
        """The rule with its tensors on ``device`` (a model spread over several)."""
        moved = {f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)


class AttentionBackend(Protocol):
    """How queries attend keys. ``mask`` is called once a forward (and once for each further device
    of a spread model), ``attend`` or ``attend_packed`` once a layer with what it returned."""

    def mask(self, rule: KeyRule) -> Any:
        """``rule`` in this backend's own form."""

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Any) -> torch.Tensor:
        """``q`` ``[rows, heads, n, head_dim]`` over ``keys``/``values`` ``[rows, kv_heads, keys,
        head_dim]`` (``kv_heads`` divides ``heads``: grouped K/V); returns ``q``'s shape."""

    def attend_packed(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rule: KeyRule,
                      mask: Any) -> torch.Tensor:
        """Packed requests: ``q`` ``[1, heads, N, head_dim]``, the requests' queries one after
        another, each over its own row of ``keys``/``values`` ``[rows, kv_heads, keys, head_dim]``;
        returns ``q``'s shape."""
