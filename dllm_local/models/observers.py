"""Instruments of the forward: counts, KV drift and an attention probe, as ``ForwardObserver``s.

The recorder installs a counter and (with a trace) a drift meter on each request's forwards; a
cache policy that watches where the block's queries look installs a probe. None of them changes
what the forward computes; the few products they take are part of its time. None reads a value
back inside the forward (a compiled forward is one graph with them); a forward padded to a fixed
length tells them after it how many of its positions were real (``on_end``).
"""
from __future__ import annotations

import torch

from .attention import ForwardObserver


class ForwardCounter(ForwardObserver):
    """Entries the last forward recomputed, and entries it read back (attended, not recomputed):
    ``reads`` stays on the device until the step record reads it with the rest."""

    def __init__(self) -> None:
        self.positions: torch.Tensor | None = None
        self.recomputed = 0
        self.reads: torch.Tensor | int = 0

    def on_begin(self, positions, was_valid, live):
        self.positions = positions
        self.recomputed = positions.numel()
        self._live = live.sum()
        self.reads = self._live - self.recomputed

    def on_end(self, count):
        self.positions, self.recomputed = self.positions[:count], count
        self.reads = self._live - count


class DriftMeter(ForwardObserver):
    """The KV drift of the last forward: before each write, the dot products of the entries about
    to be replaced with the fresh ones (and their norms), so no snapshot of the cache is taken and
    no entry copied (a run of positions is read as a view)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self._products: list[torch.Tensor] = []
        self._was_valid: torch.Tensor | None = None

    def on_begin(self, positions, was_valid, live):
        self._was_valid, self._products = was_valid, []

    def on_write(self, layer, k_rows, v_rows, index, k, v):
        # Taken even where nothing was held (the first forward): NaN there, without asking the device.
        products = _drift_products(k_rows[:, :, index], k, v_rows[:, :, index], v)
        self._products.append(products.to(self._was_valid.device, non_blocking=True))

    def on_end(self, count):
        self._was_valid = self._was_valid[:count]
        self._products = [p[..., :count] for p in self._products]

    def cosines(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[layers, n]`` K and V cosines over the recomputed positions, NaN where the cache held
        nothing before."""
        if not self._products:
            nothing = torch.full((self.n_layers, len(self._was_valid)), float("nan"), device=self._was_valid.device)
            return nothing, nothing
        cos = _cosines(torch.stack(self._products))  # [layers, 2, n]
        cos = torch.where(self._was_valid, cos, torch.tensor(float("nan"), device=cos.device))
        return cos[:, 0], cos[:, 1]

    def summary(self, shown: torch.Tensor | None = None) -> torch.Tensor:
        """Four numbers per layer, ``[layers, 4]``: K mean, K min, V mean, V min of the cosines over
        the positions replaced (of those ``shown``, a mask over the recomputed ones; NaN where none
        was): the trace's summary level, the same cosines as ``cosines`` without the NaN
        bookkeeping over every position."""
        if not self._products:
            return torch.full((self.n_layers, 4), float("nan"), device=self._was_valid.device)
        replaced = self._was_valid if shown is None else self._was_valid & shown.to(self._was_valid.device)
        cos = _cosines(torch.stack(self._products))  # [layers, 2, n]
        # Masked reductions, not a gather of the replaced ones: a gather's size is the device's to tell.
        count = replaced.sum()
        mean = torch.where(replaced, cos, 0.0).sum(-1) / count  # NaN where none was replaced
        least = torch.where(replaced, cos, float("inf")).amin(-1)
        least = torch.where(count > 0, least, float("nan"))
        return torch.stack([mean, least], -1).flatten(1)


class AttentionProbe(ForwardObserver):
    """At ``layer``, the attention mass the ``queries`` positions put on every key (``mass``,
    ``[seq_len]``, summed over heads and queries): one explicit softmax at one layer, beside the
    fused attention. A cache policy sets ``queries`` before each forward."""

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.queries: torch.Tensor | None = None
        self.mass: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None

    def on_begin(self, positions, was_valid, live):
        self._positions = positions

    def on_attend(self, layer, q, keys, key_mask):
        if layer != self.layer:
            return
        rows = torch.searchsorted(self._positions.to(q.device), self.queries.to(q.device))
        q = q[:, :, rows].float()
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)  # grouped-query: one K head per group
        scores = q @ keys.to(q.dtype).transpose(-1, -2) / q.shape[-1] ** 0.5
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask, float("-inf"))
        self.mass = scores.softmax(-1).sum((0, 1, 2))


def _drift_products(old_k: torch.Tensor, k: torch.Tensor, old_v: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dot products of the replaced and fresh K and V, and their squared norms, over head_dim:
    ``[6, *leading dims]``, in float32."""
    vd = torch.linalg.vecdot
    old_k, k, old_v, v = old_k.float(), k.float(), old_v.float(), v.float()
    return torch.stack([vd(old_k, k), vd(old_k, old_k), vd(k, k), vd(old_v, v), vd(old_v, old_v), vd(v, v)])


def _cosines(products: torch.Tensor) -> torch.Tensor:
    """K and V cosines ``[layers, 2, n]`` from ``_drift_products`` stacked over layers
    (``[layers, 6, batch, heads, n]``): dot products and norms summed over heads, then the batch mean."""
    p = products.sum(-2)
    return (p[:, 0::3] / (p[:, 1::3] * p[:, 2::3]).sqrt().clamp_min(1e-8)).mean(-2)


def position_cosine(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Cosine per position over heads x head_dim, averaged over the batch: ``[batch, heads, n,
    head_dim]`` -> ``[n]``, dot products over head_dim summed over heads (no transposed copy)."""
    old, new = old.float(), new.float()
    dot = torch.linalg.vecdot(old, new).sum(-2)
    norms = torch.linalg.vecdot(old, old).sum(-2) * torch.linalg.vecdot(new, new).sum(-2)
    return (dot / norms.sqrt().clamp_min(1e-8)).mean(-2)


class ExpertsRouted(ForwardObserver):
    """A mixture of experts' choices in the last forward: per layer, the experts any computed
    position was routed to (kept on the device until the step record reads them)."""

    def __init__(self, n_experts: int) -> None:
        self.n_experts = n_experts
        self._chosen: dict[int, torch.Tensor] = {}
        self._count: int | None = None

    def on_begin(self, positions, was_valid, live):
        self._chosen, self._count = {}, None

    def on_route(self, layer, experts):
        self._chosen[layer] = experts

    def on_end(self, count):
        self._count = count

    def routed(self) -> dict[str, list[int]]:
        """Layer (as text) -> the distinct experts routed to, ascending; dense layers absent."""
        out = {}
        for layer, chosen in sorted(self._chosen.items()):
            used = torch.zeros(self.n_experts, dtype=torch.bool, device=chosen.device)
            used[chosen[: self._count].flatten()] = True
            out[str(layer)] = used.nonzero().flatten().tolist()
        return out
