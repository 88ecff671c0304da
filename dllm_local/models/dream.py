"""Dream (Dream-org/Dream-v0-Instruct-7B): a bidirectional Qwen2-layout diffusion LM.

Two differences from LLaDA beyond parameter names: q/k/v carry biases, and the logits are
shifted by one (the prediction for position i comes from hidden state i-1; position 0 keeps
its own), because Dream was initialised from an autoregressive Qwen2.5.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from transformers import PretrainedConfig

from .attention import BIDIRECTIONAL, Attention
from .cache import CacheFork, CacheView
from .config_rules import QWEN2_KEYS, ConfigRules, Whole
from .family import QWEN2_WEIGHTS, FamilySpec, register
from .layers import FusedProjections, RMSNorm, SwiGLU, attend
from .stack import LayerStackLM


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int = 4,
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1000000.0,
        mask_token_id: int = 151666,
        tie_word_embeddings: bool = False,
        initializer_range: float = 0.02,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.mask_token_id = mask_token_id
        if kwargs.get("rope_scaling", 0) is None:
            kwargs.pop("rope_scaling")  # Dream's config carries a null one; transformers warns on it
        kwargs.setdefault("pad_token_id", 151643)
        kwargs.setdefault("bos_token_id", 151643)
        kwargs.setdefault("eos_token_id", 151643)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


class DreamAttention(FusedProjections):
    fuses = {"qkv": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: DreamConfig, index: int) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.index = index
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, h: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        b, n, _ = h.shape
        q, k, v = self.project("qkv", h)
        q = q.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return self.o_proj(attend(q, k, v, rope, self.index, attention))


class DreamDecoderLayer(nn.Module):
    def __init__(self, config: DreamConfig, index: int) -> None:
        super().__init__()
        self.self_attn = DreamAttention(config, index)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamBaseModel(nn.Module):
    def __init__(self, config: DreamConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DreamDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DreamModel(LayerStackLM):
    config_class = DreamConfig
    _no_split_modules = ["DreamDecoderLayer"]
    packs_requests = False  # its shifted logits read each position's predecessor: one request a forward
    layout = BIDIRECTIONAL
    block_size = None  # bidirectional: no block of its own
    experts = None  # dense
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DreamConfig) -> None:
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def run_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: CacheView | CacheFork | None,
                   sequence: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The prediction for position p needs hidden state p-1. When p-1 is not among the given
        positions it is recomputed too (exact, since recomputing a cached position is) from its
        token in ``sequence`` (the whole sequence, ``[batch, L]``); the run is sorted by position."""
        run_positions, run_ids = positions, input_ids
        if cache is not None:
            missing = _missing_predecessors(positions)
            if missing.numel():
                if sequence is None:
                    raise ValueError("a cached Dream forward whose positions miss a predecessor needs `sequence`")
                extra_ids = sequence[:, missing].expand(input_ids.shape[0], -1)
                run_positions = torch.cat([positions, missing])
                run_ids = torch.cat([input_ids, extra_ids], dim=1)
        order = torch.argsort(run_positions)
        return run_ids[:, order], run_positions[order]

    def read_logits(self, logits: torch.Tensor, positions: torch.Tensor, run_positions: torch.Tensor) -> torch.Tensor:
        """Only the requested positions' logits, shifted: row j of the sorted run predicts the
        position after it; position 0 keeps its own."""
        predecessor = torch.where(positions > 0, positions - 1, positions)
        take = torch.searchsorted(run_positions, predecessor).to(logits.device)
        return logits[:, take]


def _missing_predecessors(positions: torch.Tensor) -> torch.Tensor:
    """The positions p - 1 that are not given, for the given p > 0 (sorted, without repeats)."""
    before = torch.unique(positions[positions > 0] - 1)
    return before[~torch.isin(before, positions)]


DREAM_KEYS = {**QWEN2_KEYS, "intermediate_size": Whole()}
register(FamilySpec(config=DreamConfig, model=DreamModel, kind="masked", weights=QWEN2_WEIGHTS,
                    tokenizer="Qwen2Tokenizer", rules=ConfigRules(DREAM_KEYS)))  # its tokenizer_config.json names a remote-code class
