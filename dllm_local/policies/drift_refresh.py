"""Refresh when the block's attention drifts (after Elastic-Cache), else reuse like DualCache.

At each block start the whole cache is refreshed and, at ``probe_layer``, the attention mass the
block's queries put on every position is kept as the reference. Each later step recomputes only
the block (as DualCache does) and measures the same mass again; its cosine with the reference,
over the ``top_k`` positions the reference attended to most, is the drift. Under ``gamma`` the
next step refreshes the whole cache (and takes a new reference). ``gamma`` 1 refreshes every step
(no cache); ``gamma`` 0 never refreshes inside a block (DualCache).
"""
from __future__ import annotations

import torch

from ..errors import SettingsError
from ..models.observers import AttentionProbe
from .cache import CachePolicy, Plan, _full


class DriftRefresh(CachePolicy):
    def reset(self, state, cache, model):
        layers = model.config.num_hidden_layers
        if self.probe_layer is not None and self.probe_layer >= layers:
            # Refused, not clamped: the trace records the setting, and it would name a layer never probed.
            raise SettingsError(f"probe_layer {self.probe_layer} is past this model's {layers} layers "
                                f"(0 to {layers - 1}); leave it empty for the middle one")
        self._probe = AttentionProbe(layers // 2 if self.probe_layer is None else self.probe_layer)
        self._reference: torch.Tensor | None = None
        self._refresh_next = False
        self._full = False
        self._drift: float | None = None

    def observers(self):
        return (self._probe,)

    def plan(self, state, cache):
        self._probe.queries = state.block_positions()
        self._full = state.step_in_block == 0 or self._refresh_next
        return _full(state) if self._full else Plan.over(state.block_start, state.block_end, state.x.device)

    def observe(self, state, cache, signals):
        mass = self._probe.mass
        if self._full:
            self._reference, self._drift = mass.clone(), None  # kept past this forward, whose outputs a CUDA graph reuses
            self._refresh_next = self.gamma >= 1
            return
        top = torch.topk(self._reference, min(self.top_k, self._reference.numel())).indices
        drift = float(torch.nn.functional.cosine_similarity(self._reference[top], mass[top], dim=0))
        self._drift = round(drift, 6)
        self._refresh_next = self.gamma >= 1 or drift < self.gamma

    def info(self):
        return {"drift": self._drift, "refresh_next": self._refresh_next}
