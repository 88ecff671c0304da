"""The ``sdpa`` backend: ``F.scaled_dot_product_attention`` over the layout's dense boolean mask."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .rule import KeyRule


class SDPA:
    """PyTorch's fused attention with the dense mask (its fastest path where the mask is None).
    Packed requests are laid out one row per request, padded to the longest; the padding's outputs
    are never read."""

    def mask(self, rule: KeyRule) -> torch.Tensor | None:
        return rule.dense

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        grouped = keys.shape[1] != q.shape[1]  # Dream: 4 K/V heads for 28 query heads
        if grouped and mask is not None:
            # SDPA's grouped-query path has no fused kernel that takes a mask on CUDA (flash takes
            # none): with a mask, repeated K/V keep the memory-efficient kernel.
            keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
            values = values.repeat_interleave(q.shape[1] // values.shape[1], dim=1)
        return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
                                              enable_gqa=grouped and mask is None)

    def attend_packed(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rule: KeyRule,
                      mask: torch.Tensor | None) -> torch.Tensor:
        by_row = q.new_zeros(keys.shape[0], q.shape[1], rule.width, q.shape[3])
        by_row[rule.query_row, :, rule.query_col] = q[0].transpose(0, 1)  # advanced indices first: [N, heads, dim]
        out = self.attend(by_row, keys, values, mask)
        return out[rule.query_row, :, rule.query_col].transpose(0, 1)[None]
