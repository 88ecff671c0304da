"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base and -Instruct): LLaDA's masked diffusion on
OLMoE-style layers, 64 experts of which each position is routed to 8.

The released config.json says ``model_type: "llada"`` (as the dense LLaDA's does) with OLMoE's
keys; the loader tells them apart by those keys. Parameter names follow the released safetensors
(``model.layers.N.mlp.experts.E.gate_proj`` and so on), so the files load without remote code.
Arithmetic as the checkpoint's own ``modeling_lladamoe.py``: q/k RMSNorm per head (OLMoE in
transformers normalises the whole projection), the router's float32 softmax over all experts
(plus an expert bias where the config enables one) and its top-k taken as the weights, never
renormalised (the released code ignores ``norm_topk_prob``). Rotary tables are float32 (the
released code casts them to the activations' dtype first: identical in float32).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig

from .attention import Attention
from .config_rules import MAX_EXPERTS, QWEN2_KEYS, ConfigRules, Real, Whole, routed
from .family import QWEN2_WEIGHTS, FamilySpec, register
from .llada import LLaDAConfig
from .layers import Experts, FusedProjections, RMSNorm, SwiGLU, apply_rope, mix_experts
from .stack import LayerStackLM


class LLaDAMoEConfig(PretrainedConfig):
    model_type = "lladamoe"

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        dense_intermediate_size: int = 8192,
        expert_intermediate_size: int = 1024,
        shared_expert_intermediate_size: int | None = None,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 50000.0,
        partial_rotary_factor: float = 1.0,
        attention_bias: bool = False,
        clip_qkv: float | None = None,
        num_experts: int = 64,
        num_experts_per_tok: int = 8,
        qk_layernorm: bool = True,
        moe_layer_freq: list[int] | None = None,
        moe_router_enable_expert_bias: bool | None = False,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        **kwargs,
    ) -> None:
        if hidden_act != "silu":
            raise ValueError(f"hidden_act {hidden_act!r}: LLaDA-MoE's experts are SwiGLU (silu)")
        if kwargs.get("rope_scaling") is not None:  # absent or null: unscaled
            raise ValueError(f"rope_scaling {kwargs['rope_scaling']!r}: LLaDA-MoE's released rope is unscaled")
        kwargs.pop("rope_scaling", None)  # null in the released config; transformers warns on it
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dense_intermediate_size = dense_intermediate_size
        self.expert_intermediate_size = expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.attention_bias = attention_bias
        self.clip_qkv = clip_qkv
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.qk_layernorm = qk_layernorm
        self.moe_layer_freq = [1] * num_hidden_layers if moe_layer_freq is None else list(moe_layer_freq)
        self.moe_router_enable_expert_bias = bool(moe_router_enable_expert_bias)
        self.initializer_range = initializer_range
        kwargs.setdefault("pad_token_id", 156892)
        kwargs.setdefault("eos_token_id", 156892)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


class LLaDAMoESparseMoeBlock(nn.Module):
    def __init__(self, config: LLaDAMoEConfig, index: int) -> None:
        super().__init__()
        self.index, self.top_k = index, config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.expert_intermediate_size)
        bias = torch.zeros(config.num_experts) if config.moe_router_enable_expert_bias else None
        self.register_buffer("expert_bias", bias)  # saved with the weights where the config enables it

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        rows, width = x.shape[:-1].numel(), x.shape[-1]
        flat = x.reshape(rows, width)
        scores = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        if self.expert_bias is not None:  # the biased scores both choose and weigh, as released
            scores = scores + self.expert_bias
        weights, chosen = torch.topk(scores, self.top_k, dim=-1)
        weights = weights.to(x.dtype)
        # One forward's rows are variants of the same positions: the first row's routing is shown.
        attention.routed(self.index, chosen.view(-1, x.shape[-2], self.top_k)[0])
        out = mix_experts(flat, chosen, weights, self.experts)
        return out.view_as(x)


class LLaDAMoEAttention(FusedProjections):
    fuses = {"qkv": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: LLaDAMoEConfig, index: int) -> None:
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.index, self.clip, self.rotary_dim = index, config.clip_qkv, config.rotary_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(d, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps) if config.qk_layernorm else None
        self.k_norm = RMSNorm(hd, config.rms_norm_eps) if config.qk_layernorm else None

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: Attention) -> torch.Tensor:
        b, n, _ = h.shape
        q, k, v = self.project("qkv", h)
        q = q.view(b, n, self.n_heads, self.head_dim)
        k = k.view(b, n, self.n_kv_heads, self.head_dim)
        v = v.view(b, n, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return self.o_proj(attention(self.index, self._rotate(q, rope), self._rotate(k, rope), v))

    def _rotate(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotary on the first ``rotary_dim`` channels of each head (all of them unless the config
        gives a partial rotary factor); the rest pass through."""
        if self.rotary_dim == self.head_dim:
            return apply_rope(x, *rope)
        return torch.cat([apply_rope(x[..., : self.rotary_dim], *rope), x[..., self.rotary_dim :]], dim=-1)


class LLaDAMoEDecoderLayer(nn.Module):
    def __init__(self, config: LLaDAMoEConfig, index: int) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LLaDAMoEAttention(config, index)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.sparse = config.moe_layer_freq[index] != 0
        self.mlp = LLaDAMoESparseMoeBlock(config, index) if self.sparse else SwiGLU(d, config.dense_intermediate_size)
        shared = config.shared_expert_intermediate_size
        self.shared_expert = SwiGLU(d, shared) if self.sparse and shared is not None else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: Attention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        h = self.post_attention_layernorm(x)
        y = self.mlp(h, attention) if self.sparse else self.mlp(h)
        if self.shared_expert is not None:
            y = y + self.shared_expert(h)
        return x + y


class LLaDAMoEModel(nn.Module):
    def __init__(self, config: LLaDAMoEConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDAMoEDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LLaDAMoEModelLM(LayerStackLM):
    config_class = LLaDAMoEConfig
    _no_split_modules = ["LLaDAMoEDecoderLayer"]
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LLaDAMoEConfig) -> None:
        super().__init__(config)
        self.model = LLaDAMoEModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.experts = (config.num_experts, config.num_experts_per_tok)
        self.post_init()

    def rope_dim(self) -> int:
        return self.config.rotary_dim


RULES = ConfigRules({
    **QWEN2_KEYS, "dense_intermediate_size": Whole(), "expert_intermediate_size": Whole(),
    "shared_expert_intermediate_size": Whole(optional=True), "num_experts": Whole(high=MAX_EXPERTS),
    "num_experts_per_tok": Whole(high=MAX_EXPERTS), "partial_rotary_factor": Real(0, 1, low_open=True),
}, lambda values: routed(values, "num_experts", "num_experts_per_tok"))


register(FamilySpec(
    config=LLaDAMoEConfig, model=LLaDAMoEModelLM, kind="masked", weights=QWEN2_WEIGHTS,
    tokenizer="PreTrainedTokenizerFast",  # Ling's byte-level BPE in tokenizer.json
    mask_token="<|mask|>",  # the released config.json names no mask_token_id; the tokenizer's <|mask|> is 156895
    # The released config.json says "llada", as the dense LLaDA's does; its expert sizes tell it apart.
    claims=lambda raw: raw.get("model_type") == LLaDAConfig.model_type and "expert_intermediate_size" in raw,
    rules=RULES))
