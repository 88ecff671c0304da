"""Building blocks the families share: fp32 RMSNorm, fp32 rotary embeddings, attention's entry,
projections fused into one GEMM, experts as grouped GEMMs."""
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


class FusedProjections(nn.Module):
    """A module whose Linears that read one input (Q, K and V; gate and up) run as one GEMM once
    ``fuse``d: ``fuses`` names each group's Linears in order. Fused, each Linear's weight (and bias)
    is a view into the group's concatenated tensor, so the state dict and every weight name stay as
    released; ``project(group, x)`` returns each Linear's output, the same products as calling
    them one by one. Unfused (quantized or offloaded Linears, or training, whose gradients belong
    to each Linear's own weight) the Linears run one by one."""

    fuses: dict[str, tuple[str, ...]] = {}

    def fuse(self) -> None:
        """Concatenate each group's weights where its Linears allow it: plain Linears, all with a
        bias or none, of one dtype on one real device."""
        fused = {}
        for group, names in self.fuses.items():
            linears = [getattr(self, name) for name in names]
            params = [p for linear in linears for p in (linear.weight, linear.bias) if p is not None]
            if (not all(type(linear) is nn.Linear for linear in linears)
                    or len({linear.bias is None for linear in linears}) != 1
                    or len({(p.dtype, p.device) for p in params}) != 1 or params[0].device.type == "meta"):
                continue
            sizes = [linear.out_features for linear in linears]
            with torch.no_grad():
                weight = torch.cat([linear.weight for linear in linears])
                bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
            for linear, part, part_bias in zip(linears, weight.split(sizes), (bias.split(sizes) if bias is not None
                                                                              else [None] * len(linears))):
                linear.weight = nn.Parameter(part, requires_grad=linear.weight.requires_grad)
                if part_bias is not None:
                    linear.bias = nn.Parameter(part_bias, requires_grad=linear.bias.requires_grad)
            fused[group] = (weight, bias, sizes)
        self.__dict__["_fused"] = fused

    def _apply(self, fn, recurse: bool = True):
        # Moving or casting gives each weight new storage: fuse again there, never a stale copy.
        super()._apply(fn, recurse)
        if self.__dict__.get("_fused"):
            self.fuse()
        return self

    def project(self, group: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs of ``group``'s Linears on ``x``, in the order ``fuses`` names them."""
        fused = self.__dict__.get("_fused", {}).get(group)
        if fused is None or self.training:
            return tuple(getattr(self, name)(x) for name in self.fuses[group])
        weight, bias, sizes = fused
        return F.linear(x, weight, bias).split(sizes, dim=-1)


class SwiGLU(FusedProjections):
    """The gated MLP of Llama, Qwen and their kin, with their weight names (gate and up one GEMM
    once fused)."""

    fuses = {"gate_up": ("gate_proj", "up_proj")}

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project("gate_up", x)
        return self.down_proj(F.silu(gate) * up)


class Experts(nn.ModuleList):
    """A layer's SwiGLU experts (``experts.N.{gate,up,down}_proj``). Once ``stack``ed, each
    projection of all experts lives in one ``[experts, out, in]`` tensor, every expert's Linear
    weight a view into it (the state dict unchanged, no copy per forward), and a forward runs all
    experts as three grouped GEMMs; unstacked (quantized, offloaded or mixed experts) each expert
    runs on its own rows."""

    def __init__(self, count: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__(SwiGLU(hidden_size, intermediate_size) for _ in range(count))
        self.stacked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def stack(self) -> None:
        """Gather each projection's weights into one tensor where the experts allow it: plain
        unbiased Linears, all of one dtype on one real device."""
        linears = [(e.gate_proj, e.up_proj, e.down_proj) for e in self]
        weights = [linear.weight for trio in linears for linear in trio]
        if (not all(type(linear) is nn.Linear and linear.bias is None for trio in linears for linear in trio)
                or len({(w.dtype, w.device) for w in weights}) != 1 or not _grouped_gemm_runs(weights[0])):
            self.stacked = None
            return
        with torch.no_grad():
            stacked = tuple(torch.stack([trio[i].weight for trio in linears]) for i in range(3))
        for expert, trio in enumerate(linears):
            for i, linear in enumerate(trio):
                linear.weight = nn.Parameter(stacked[i][expert], requires_grad=False)
        self.stacked = stacked

    def _apply(self, fn, recurse: bool = True):
        # Moving or casting the module gives each weight new storage: stack it again there, so
        # the stacked tensors never go stale.
        super()._apply(fn, recurse)
        if self.stacked is not None:
            self.stack()
        return self

    def routed(self, flat: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """``flat`` ``[N, hidden]`` through the experts each row was routed to (``chosen``
        ``[N, k]``): ``[N, k, hidden]``, each (row, slot)'s output. Stacked, no host round trip:
        the pairs sorted by expert (rows ascending within one, as the loop feeds them), their
        group ends found by search, each projection one grouped GEMM."""
        rows, k = chosen.shape
        out = flat.new_empty(rows, k, flat.shape[-1])
        # torch 2.13 traces grouped_mm (its meta kernel) in bfloat16 only, though eager runs any
        # float dtype: a compiled forward in another dtype keeps the loop and its graph breaks.
        if self.stacked is None or (torch.compiler.is_compiling() and flat.dtype != torch.bfloat16):
            for expert in torch.unique(chosen).tolist():
                row, slot = torch.where(chosen == expert)
                out[row, slot] = self[expert](flat[row]).to(out.dtype)
            return out
        gate, up, down = self.stacked
        ids = chosen.flatten()
        order = torch.argsort(ids, stable=True)
        experts = torch.arange(len(self), device=ids.device, dtype=ids.dtype)
        ends = torch.searchsorted(ids[order], experts, right=True, out_int32=True)
        x = flat[order // k]
        hidden = F.silu(F.grouped_mm(x, gate.mT, offs=ends)) * F.grouped_mm(x, up.mT, offs=ends)
        return out.view(rows * k, -1).index_copy_(0, order, F.grouped_mm(hidden, down.mT, offs=ends)).view_as(out)


def _grouped_gemm_runs(weight: torch.Tensor) -> bool:
    """Whether ``grouped_mm`` runs where ``weight`` is: the CPU in any float dtype; CUDA only in
    bfloat16 from Hopper (compute capability 9.0) on, as torch 2.13 builds its kernels; never "meta"."""
    if weight.device.type == "cuda":
        return weight.dtype == torch.bfloat16 and torch.cuda.get_device_capability(weight.device) >= (9, 0)
    return weight.device.type == "cpu"


def pack_weights(model: nn.Module) -> None:
    """Once the model is loaded and placed: stack every mixture-of-experts layer's weights and
    fuse the projections that read one input (fewer, larger kernels; the same products)."""
    experts = [module for module in model.modules() if isinstance(module, Experts)]
    inside = {id(part) for module in experts for part in module.modules()}  # stacked, not fused
    for module in experts:
        module.stack()
    for module in model.modules():
        if isinstance(module, FusedProjections) and id(module) not in inside:
            module.fuse()


def mix_experts(flat: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, experts: Experts) -> torch.Tensor:
    """``flat`` ``[N, hidden]`` through the experts each row was routed to (``chosen`` ``[N, k]``),
    weighted (``weights`` ``[N, k]``, in ``flat``'s dtype) and summed in ascending order of expert,
    one addition after another from zero: the same float additions as the references' per-expert
    ``index_add_``."""
    chosen, slots = chosen.sort(dim=-1)
    weighted = (experts.routed(flat, chosen) * weights.gather(1, slots)[..., None]).to(flat.dtype)
    out = torch.zeros_like(flat)
    for slot in range(chosen.shape[1]):
        out = out + weighted[:, slot]
    return out
