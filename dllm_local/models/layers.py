"""Building blocks the families share: fp32 RMSNorm, fp32 rotary embeddings, attention's entry."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import Attention


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


def rope_table(positions: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[positions, head_dim]`` of every position ``0 .. positions - 1``, in float32
    (rotate-half layout): built once per model and device, each forward gathers its rows (the
    same products and cosines as computing them per forward, so the same bits)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.arange(positions, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, heads, n, head_dim]`` in float32 and return it in its own dtype."""
    dtype = x.dtype
    x = x.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos + rotated * sin).to(dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], layer: int,
           attention: Attention) -> torch.Tensor:
    """Rotate ``q`` and ``k`` (``[batch, heads or kv_heads, n, head_dim]``) to their positions and
    attend as this forward's ``attention`` lays out: ``[batch, n, heads * head_dim]``."""
    cos, sin = rope
    return attention(layer, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)


class SwiGLU(nn.Module):
    """The gated MLP of Llama, Qwen and their kin, with their weight names."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def mix_experts(flat: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, experts: nn.ModuleList) -> torch.Tensor:
    """``flat`` ``[N, hidden]`` through the experts each row was routed to (``chosen`` ``[N, k]``),
    weighted (``weights`` ``[N, k]``, in ``flat``'s dtype) and summed: each expert runs once, on
    exactly its rows, in ascending order of expert (as the references add them up)."""
    out = torch.zeros_like(flat)
    for expert in torch.unique(chosen).tolist():
        row, slot = torch.where(chosen == expert)
        out.index_add_(0, row, (experts[expert](flat[row]) * weights[row, slot, None]).to(out.dtype))
    return out
