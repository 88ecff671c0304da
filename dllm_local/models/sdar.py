"""SDAR (JetLM/SDAR-1.7B/4B/8B-Chat, TraDo-4B/8B) and SDAR MoE (SDAR-30B-A3B): block diffusion on Qwen3.

Qwen3's layout (RMSNorm on each head's queries and keys before the rotation, no q/k/v bias)
under a block-causal mask: blocks of ``block_size`` tokens (4 as released) at absolute positions
attend themselves and every earlier block. The MoE variant is Qwen3-MoE's: a softmax router over
``num_experts`` picking ``num_experts_per_tok``, renormalised when ``norm_topk_prob``, with the
released names ``mlp.gate`` and ``mlp.experts.N.{gate,up,down}_proj``. Parameter names are the
released checkpoints', so their unmodified files load without remote code.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig

from .attention import Attention, BlockCausal
from .config_rules import MAX_EXPERTS, MAX_LAYERS, QWEN2_KEYS, ConfigRules, Whole, routed
from .family import QWEN2_WEIGHTS, FamilySpec, register
from .layers import Experts, FusedProjections, RMSNorm, SwiGLU, attend, mix_experts
from .stack import LayerStackLM


class SDARConfig(PretrainedConfig):
    model_type = "sdar"

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int = 32,
        head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        use_sliding_window: bool = False,
        block_size: int = 4,
        tie_word_embeddings: bool = False,
        **kwargs,
    ) -> None:
        # What this implementation does not compute is refused here, not run wrongly.
        if hidden_act != "silu":
            raise ValueError(f"hidden_act {hidden_act!r}: only silu is supported")
        if rope_scaling not in (None, {}) and rope_scaling.get("rope_type", rope_scaling.get("type")) != "default":
            raise ValueError(f"rope_scaling {rope_scaling!r}: only plain rotary embeddings are supported")
        if use_sliding_window:
            raise ValueError("use_sliding_window: sliding-window attention is not supported")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.rope_theta = rope_theta
        self.attention_bias = attention_bias
        self.use_sliding_window = use_sliding_window
        self.block_size = block_size
        # The released config asks for flex attention (its training kernel); this model brings its
        # own attention, and transformers would otherwise insist on that backend at load.
        kwargs.pop("attn_implementation", None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    def sparse_layer(self, index: int) -> bool:
        """Layer ``index`` routes to experts (never, in the dense model)."""
        return False


class SDARMoeConfig(SDARConfig):
    model_type = "sdar_moe"

    def __init__(
        self,
        num_experts: int = 128,
        num_experts_per_tok: int = 8,
        moe_intermediate_size: int = 768,
        norm_topk_prob: bool = True,
        decoder_sparse_step: int = 1,
        mlp_only_layers: list[int] | None = None,
        **kwargs,
    ) -> None:
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.norm_topk_prob = norm_topk_prob
        self.decoder_sparse_step = decoder_sparse_step
        self.mlp_only_layers = list(mlp_only_layers or [])
        super().__init__(**kwargs)

    def sparse_layer(self, index: int) -> bool:
        return (index not in self.mlp_only_layers and self.num_experts > 0
                and (index + 1) % self.decoder_sparse_step == 0)


class SDARAttention(FusedProjections):
    fuses = {"qkv": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: SDARConfig, index: int) -> None:
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.index = index
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        b, n, _ = h.shape
        q, k, v = self.project("qkv", h)
        q = self.q_norm(q.view(b, n, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(b, n, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = v.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return self.o_proj(attend(q, k, v, rope, self.index, attention))


class SDARSparseMoeBlock(nn.Module):
    """Qwen3-MoE's experts: each position's top-k of a float32 softmax over the router's logits."""

    def __init__(self, config: SDARMoeConfig, index: int) -> None:
        super().__init__()
        self.index, self.top_k, self.norm_topk_prob = index, config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        b, n, d = x.shape
        flat = x.reshape(-1, d)
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(x.dtype)
        # The first row's choices: several rows of one forward are variants of the same positions.
        attention.routed(self.index, chosen.view(b, n, self.top_k)[0])
        out = mix_experts(flat, chosen, weights, self.experts)
        return out.view(b, n, d)


class SDARDecoderLayer(nn.Module):
    def __init__(self, config: SDARConfig, index: int) -> None:
        super().__init__()
        self.self_attn = SDARAttention(config, index)
        self.sparse = config.sparse_layer(index)
        self.mlp = (SDARSparseMoeBlock(config, index) if self.sparse
                    else SwiGLU(config.hidden_size, config.intermediate_size))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, attention) if self.sparse else self.mlp(h))


class SDARModel(nn.Module):
    def __init__(self, config: SDARConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SDARDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class SDARForCausalLM(LayerStackLM):
    config_class = SDARConfig
    _no_split_modules = ["SDARDecoderLayer"]
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # SDAR-1.7B ties them

    def __init__(self, config: SDARConfig) -> None:
        super().__init__(config)
        self.block_size = config.block_size
        self.layout = BlockCausal(config.block_size)
        self.model = SDARModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()



class SDARMoeForCausalLM(SDARForCausalLM):
    config_class = SDARMoeConfig

    def __init__(self, config: SDARMoeConfig) -> None:
        super().__init__(config)
        self.experts = (config.num_experts, config.num_experts_per_tok)


# Its tokenizer_config.json names the remote tokenization_qwen2 module; the tokenizer's mask token
# (id 151669 in the released vocabulary) is for a config.json without mask_token_id (the first
# uploads had none; block_size was added with it).
DENSE_KEYS = {**QWEN2_KEYS, "head_dim": Whole(), "intermediate_size": Whole(), "block_size": Whole()}
# The MoE's: experts routed per token within the experts (0 experts: every layer dense).
MOE_RULES = ConfigRules({
    **DENSE_KEYS, "num_experts": Whole(0, MAX_EXPERTS), "num_experts_per_tok": Whole(high=MAX_EXPERTS),
    "moe_intermediate_size": Whole(), "decoder_sparse_step": Whole(high=MAX_LAYERS),
}, lambda values: routed(values, "num_experts", "num_experts_per_tok"))
register(FamilySpec(config=SDARConfig, model=SDARForCausalLM, kind="block", weights=QWEN2_WEIGHTS,
                    tokenizer="Qwen2Tokenizer", mask_token="<|MASK|>", rules=ConfigRules(DENSE_KEYS)))
register(FamilySpec(config=SDARMoeConfig, model=SDARMoeForCausalLM, kind="block", weights=QWEN2_WEIGHTS,
                    tokenizer="Qwen2Tokenizer", mask_token="<|MASK|>", rules=MOE_RULES))
