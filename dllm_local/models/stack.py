"""The one forward and KV cache of every family built as embedding, layers, norm and output head.

LLaDA, Dream, SDAR, LLaDA2, LLaDA-MoE and Fast-dLLM v2 share weight init, the embeddings, the KV
cache, and the forward around the layers. Each family's file keeps what is its own: config,
attention, MLP or experts, and the hooks that name its parts (LLaDA's ``transformer.blocks``) or
read its head (Dream's shifted logits)."""
from __future__ import annotations

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from .attention import BIDIRECTIONAL, AttentionLayout, ForwardObserver, Segment, begin
from .attention_backends import DEFAULT
from .cache import CacheFork, CacheView, KVCache
from ..errors import SequenceTooLongError
from .layers import RMSNorm, layer_devices, rope_table
from .protocol import DiffusionLMOutput


ROPE_ROWS = 16384  # 16 MB of float32 cos and sin at head dim 128


class LayerStackLM(PreTrainedModel):
    """By default ``self.model`` holds ``embed_tokens`` (or the family's name for it,
    ``get_input_embeddings``), ``layers`` and ``norm``; ``self.lm_head`` the output head. A family
    whose parts have other names says so in the hooks (``stack``, ``final_norm``, ``head``,
    ``cache_sizes``, ``rope_dim``); one whose head reads other positions than it returns, in
    ``run_inputs`` and ``read_logits``. Each layer is called as ``layer(x, rope, attention)``."""

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

    # ---------------------------------------------------------------- the hooks: a family's names
    def stack(self) -> nn.ModuleList:
        """The layers, in order."""
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of the final norm's output ``x``."""
        return self.lm_head(x)

    def cache_sizes(self) -> tuple[int, int, int, int]:
        """Layers, K/V heads, positions (the default cache length) and head dim, as the config names them."""
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.max_positions, c.head_dim

    def rope_dim(self) -> int:
        """The channels of a head that rotate (all of them unless the family says fewer)."""
        return self.config.head_dim

    # ---------------------------------------------------------------- the hooks: a head that reads elsewhere
    def run_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: CacheView | CacheFork | None,
                   sequence: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids and positions the layers compute for the requested ones: the same, unless the
        head reads positions not requested (Dream's, each position's predecessor)."""
        return input_ids, positions

    def read_logits(self, logits: torch.Tensor, positions: torch.Tensor, run_positions: torch.Tensor) -> torch.Tensor:
        """The requested ``positions``' logits from those of the computed ``run_positions``."""
        return logits

    def rope_table(self, device: torch.device, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos/sin of positions ``0 .. length - 1`` at least, on ``device``, kept as plain
        tensors (not weights). Built once for every position the model takes (and a cache's sink),
        where that is at most ``ROPE_ROWS``; past it (Dream's 131,072) in powers of two, rebuilt only
        for a longer forward: a compiled forward is specialised to the table's size."""
        tables = self.__dict__.setdefault("_rope_tables", {})
        if device not in tables or tables[device][0].shape[0] < length:
            every = self.config.max_positions + 1
            rows = every if every <= ROPE_ROWS else max(ROPE_ROWS, 1 << (length - 1).bit_length())
            tables[device] = rope_table(max(rows, length), self.rope_dim(), self.config.rope_theta, device)
        return tables[device]

    # ---------------------------------------------------------------- the cache and the forward
    def new_cache(self, slots: int = 1, max_len: int | None = None) -> KVCache:
        layers, kv_heads, positions, head_dim = self.cache_sizes()
        ref = self.get_input_embeddings().weight
        dtype = ref.dtype if ref.is_floating_point() else torch.bfloat16  # a quantized embedding: bf16 K/V
        return KVCache(layers, slots, kv_heads, max_len or positions, head_dim, dtype, layer_devices(self.stack()))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: CacheView | CacheFork | None = None,
        observers: tuple[ForwardObserver, ...] = (),
        segments: list[Segment] | None = None,
        layout: AttentionLayout | None = None,
        sequence: torch.Tensor | None = None,
        read: torch.Tensor | None = None,
        attention_backend: str = DEFAULT,
        **unused,
    ) -> DiffusionLMOutput:
        """Logits ``[batch, n, vocab]`` for the ``n`` given tokens at absolute ``positions``, under
        ``layout`` (default: the model's own). With a cache only these positions are computed,
        their K/V written, each attending every valid entry the layout allows (``observers``
        watching); ``segments``: several requests packed in one row; without, a full forward.
        ``sequence``: the whole sequence ``[batch, L]``, for a head that reads positions not given.
        ``read``: indices into ``positions``, the only rows the final norm and head compute (a
        model that ``packs_requests``: its head reads each position's own row); None: every row.
        ``attention_backend``: the registered backend that attends (``attention_backends``)."""
        bound = _positions_bound(input_ids, positions, cache, segments, self.config.max_positions)
        if positions is None:
            if input_ids.shape[1] > self.config.max_positions:
                raise SequenceTooLongError(f"sequence of {input_ids.shape[1]} positions is longer than the model's "
                                           f"maximum of {self.config.max_positions}")
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Given positions are the caller's to bound (a run checks its length once, as it starts):
        # reading them back here would stop the host at every forward.
        run_ids, run_positions = self.run_inputs(input_ids, positions, cache, sequence)
        attention = begin(run_positions, cache, observers, segments, layout or self.layout, attention_backend)
        cos, sin = self.rope_table(run_positions.device, bound)
        rope = cos[run_positions], sin[run_positions]
        x = self.get_input_embeddings()(run_ids)
        for layer in self.stack():
            x = layer(x, rope, attention)
        if read is not None:
            if not self.packs_requests:
                raise ValueError(f"{type(self).__name__}'s head reads other rows than it returns: it takes no read")
            x = x.index_select(1, read)
        logits = self.head(self.final_norm()(x))
        return DiffusionLMOutput(logits=self.read_logits(logits, positions, run_positions))


def _positions_bound(input_ids: torch.Tensor, positions: torch.Tensor | None, cache: CacheView | CacheFork | None,
                     segments: list[Segment] | None, max_positions: int) -> int:
    """A bound on the positions a forward computes, known on the host: its cache's length and sink,
    else its own length, else (positions given without a cache) the model's maximum."""
    view = segments[0].cache if segments else cache
    if view is not None:
        store = view.parent.store if isinstance(view, CacheFork) else view.store
        return store.max_len + 1
    return input_ids.shape[1] if positions is None else max_positions
