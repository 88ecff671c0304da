"""Building blocks both families share: fp32 RMSNorm, fp32 rotary embeddings, cached attention."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import SequenceTooLongError
from .cache import KVCache


def check_positions(positions: torch.Tensor, max_positions: int) -> None:
    if positions.numel() and int(positions.max()) >= max_positions:
        raise SequenceTooLongError(
            f"sequence of {int(positions.max()) + 1} positions is longer than the model's maximum of {max_positions}"
        )


def layer_devices(blocks: nn.ModuleList) -> list[torch.device]:
    """Where each transformer block runs: the device accelerate's hook executes it on (a block
    offloaded by ``device_map`` has its weights on "meta" between calls), else its weights'."""
    devices = []
    for block in blocks:
        hook = getattr(block, "_hf_hook", None)
        execution = getattr(hook, "execution_device", None)
        devices.append(torch.device(execution) if execution is not None else next(block.parameters()).device)
    return devices


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the weight dtype, as LLaDA and Qwen2 do."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[n, head_dim]`` for absolute positions, in float32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, heads, n, head_dim]`` in float32 and return it in its own dtype."""
    dtype = x.dtype
    x = x.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos + rotated * sin).to(dtype)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    layer: int,
    cache: KVCache | None,
) -> torch.Tensor:
    """Bidirectional attention of the recomputed positions over every valid position.

    ``q``: ``[batch, heads, n, head_dim]``; ``k``/``v``: ``[batch, kv_heads, n, head_dim]``.
    Without a cache the keys are just the given positions (a plain full forward).
    Returns ``[batch, n, heads * head_dim]``.
    """
    cos, sin = rope
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    key_mask = None
    packed = hasattr(cache, "query_rows")  # a batch's forward: several requests' positions in one row
    if cache is not None:
        k, v, key_mask = cache.update(layer, positions, k, v)
    if packed:
        q = cache.query_rows(q)
    if hasattr(cache, "probe"):  # a cache policy may watch where the queries look (drift_refresh)
        cache.probe(layer, q, k, key_mask, positions)
    grouped = k.shape[1] != q.shape[1]  # Dream: 4 K/V heads for 28 query heads
    if grouped and key_mask is not None:
        # SDPA's grouped-query path has no fused kernel that takes a mask on CUDA (flash takes
        # none): with a mask, repeated K/V keep the memory-efficient kernel.
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=key_mask,
                                         enable_gqa=grouped and key_mask is None)
    if packed:
        out = cache.token_rows(out)
    return out.transpose(1, 2).flatten(2)
