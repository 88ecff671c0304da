"""What the families built as embedding, layers, final norm and output head share (Dream, SDAR,
LLaDA2, LLaDA-MoE, Fast-dLLM v2): weight init, the embeddings, the KV cache, and the forward
around the layers. Each family's file keeps what is its own: config, attention, MLP or experts."""
from __future__ import annotations

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from .attention import BIDIRECTIONAL, AttentionLayout, ForwardObserver, Segment, begin
from .cache import CacheFork, CacheView, KVCache
from .layers import RMSNorm, check_positions, layer_devices, rope_cos_sin
from .llada import DiffusionLMOutput


class LayerStackLM(PreTrainedModel):
    """``self.model`` holds ``embed_tokens`` (or the family's name for it, ``get_input_embeddings``),
    ``layers`` and ``norm``; ``self.lm_head`` the output head. Each layer is called as
    ``layer(x, rope, attention)``."""

    base_model_prefix = "model"
    _supports_sdpa = True
    packs_requests = True  # every layer but attention is per position
    layout: AttentionLayout = BIDIRECTIONAL
    block_size: int | None = None
    experts: tuple[int, int] | None = None
    sub_block: int | None = None  # block diffusion decoded in sub-blocks, as released (Fast-dLLM v2)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def rope_dim(self) -> int:
        """The channels of a head that rotate (all of them unless the family says fewer)."""
        return self.config.head_dim

    def new_cache(self, slots: int = 1, max_len: int | None = None) -> KVCache:
        c, ref = self.config, self.get_input_embeddings().weight
        dtype = ref.dtype if ref.is_floating_point() else torch.bfloat16  # a quantized embedding: bf16 K/V
        return KVCache(c.num_hidden_layers, slots, c.num_key_value_heads, max_len or c.max_positions, c.head_dim, dtype,
                       layer_devices(self.model.layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: CacheView | CacheFork | None = None,
        observers: tuple[ForwardObserver, ...] = (),
        segments: list[Segment] | None = None,
        layout: AttentionLayout | None = None,
        **unused,
    ) -> DiffusionLMOutput:
        """Logits ``[batch, n, vocab]`` for the ``n`` given tokens at absolute ``positions``, under
        ``layout`` (default: the model's own). With a cache only these positions are computed,
        their K/V written, each attending every valid entry the layout allows (``observers``
        watching); ``segments``: several requests packed in one row; without, a full forward."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        bounds = check_positions(positions, self.config.max_positions)
        attention = begin(positions, bounds, cache, observers, segments, layout or self.layout)
        rope = rope_cos_sin(positions, self.rope_dim(), self.config.rope_theta)
        x = self.get_input_embeddings()(input_ids)
        for layer in self.model.layers:
            x = layer(x, rope, attention)
        return DiffusionLMOutput(logits=self.lm_head(self.model.norm(x)))
