"""LLaDA2.x (inclusionAI/LLaDA2.0-mini, LLaDA2.1-mini, -flash): a block-diffusion mixture of experts.

The Bailing-MoE-v2 layout under a block-causal mask: a fused query/key/value projection with a
per-head RMSNorm on queries and keys, rotary embeddings on the first half of each head only,
``first_k_dense_replace`` dense layers, then layers whose MLP is a shared expert plus ``k`` of
``num_experts`` routed ones, chosen by sigmoid scores plus a load-balancing bias within the best
``topk_group`` of ``n_group`` expert groups. Parameter names follow the released checkpoints
(``model.word_embeddings``, ``model.layers.N.attention.query_key_value``, ``mlp.gate.expert_bias``).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig

from .attention import Attention, BlockCausal
from .config_rules import MAX_EXPERTS, MAX_LAYERS, QWEN2_KEYS, ConfigRules, Real, Values, Whole, grouped, routed
from .family import FamilySpec, WeightNames, register
from .layers import Experts, RMSNorm, SwiGLU, apply_rope
from .stack import LayerStackLM

# The block LLaDA2 was trained with and its released generate decodes by (block_length=32); the
# released config.json names none.
TRAINED_BLOCK = 32


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        intermediate_size: int = 5120,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_qk_norm: bool = True,
        use_bias: bool = False,
        rms_norm_eps: float = 1e-6,
        max_position_embeddings: int = 32768,
        rope_theta: float = 600000.0,
        partial_rotary_factor: float = 0.5,
        num_experts: int | None = 256,
        num_shared_experts: int | None = 1,
        num_experts_per_tok: int = 8,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        moe_intermediate_size: int = 512,
        first_k_dense_replace: int = 1,
        tie_word_embeddings: bool = False,
        pad_token_id: int = 156892,
        **kwargs,
    ) -> None:
        if hidden_act != "silu":
            raise ValueError(f"hidden_act {hidden_act!r}: LLaDA2's released checkpoints use silu")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_qk_norm = use_qk_norm
        self.use_bias = use_bias
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        if kwargs.get("rope_scaling", 0) is None:
            kwargs.pop("rope_scaling")  # the release carries a null one; transformers warns on it
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    def is_moe(self, layer: int) -> bool:
        return self.num_experts is not None and layer >= self.first_k_dense_replace


class LLaDA2MoeGate(nn.Module):
    """Sigmoid router: the bias steers the choice only; the weights are the unbiased scores of
    the chosen experts, normalised to sum 1, times ``routed_scaling_factor`` (all in float32)."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[N, hidden]`` -> expert ids ``[N, k]`` and their float32 weights ``[N, k]``."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        biased = scores + self.expert_bias.float()
        n = biased.shape[0]
        groups = biased.view(n, self.n_group, -1).topk(2, dim=-1)[0].sum(-1)  # a group's best two
        chosen = torch.topk(groups, self.topk_group, dim=-1, sorted=False)[1]
        in_group = torch.zeros_like(groups).scatter_(1, chosen, 1).bool()
        allowed = in_group[:, :, None].expand(n, self.n_group, biased.shape[1] // self.n_group).reshape(n, -1)
        ids = torch.topk(biased.masked_fill(~allowed, float("-inf")), self.top_k, dim=-1)[1]
        weights = scores.gather(1, ids)
        if self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return ids, weights * self.scale


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.gate = LLaDA2MoeGate(config)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = (None if config.num_shared_experts is None else
                               SwiGLU(config.hidden_size, config.moe_intermediate_size * config.num_shared_experts))

    def forward(self, x: torch.Tensor, layer: int, attention: Attention) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        ids, weights = self.gate(flat)
        attention.routed(layer, ids.view(shape[0], shape[1], -1)[0])  # batch rows share positions
        out = self.experts.routed(flat, ids)
        y = (out.float() * weights[..., None]).sum(1).to(x.dtype)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(shape)


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.rope_dim = config.rope_dim
        self.query_key_value = nn.Linear(config.hidden_size, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim,
                                         bias=config.use_qkv_bias)
        if config.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.use_qk_norm = config.use_qk_norm
        self.dense = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=config.use_bias)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on the first ``rope_dim`` of each head; the rest passes unrotated."""
        d = self.rope_dim
        return torch.cat([apply_rope(x[..., :d], cos, sin), x[..., d:]], dim=-1)

    def forward(self, h: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        b, n, _ = h.shape
        qkv = self.query_key_value(h).view(b, n, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=2))
        if self.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        cos, sin = rope
        return self.dense(attention(self.index, self._rotate(q, cos, sin), self._rotate(k, cos, sin), v))


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.attention = LLaDA2MoeAttention(config, index)
        self.mlp = (LLaDA2MoeSparseMoeBlock(config) if config.is_moe(index)
                    else SwiGLU(config.hidden_size, config.intermediate_size))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), rope, attention)
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, LLaDA2MoeSparseMoeBlock):
            return x + self.mlp(h, self.index, attention)
        return x + self.mlp(h)


class LLaDA2MoeModel(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LLaDA2MoeModelLM(LayerStackLM):
    config_class = LLaDA2MoeConfig
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]
    block_size = TRAINED_BLOCK

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        self.layout = BlockCausal(TRAINED_BLOCK)
        self.experts = None if config.num_experts is None else (config.num_experts, config.num_experts_per_tok)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, LLaDA2MoeGate):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            nn.init.zeros_(module.expert_bias)
        else:
            super()._init_weights(module)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings

    def rope_dim(self) -> int:
        return self.config.rope_dim

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The logits in float32 (the reference's ``.float()``)."""
        return self.lm_head(x).float()


def _check(values: Values) -> None:
    """The gate's groups: equal groups of two or more experts (a group scores by its best two),
    ``topk_group`` of them searched, holding at least ``num_experts_per_tok`` experts."""
    routed(values, "num_experts", "num_experts_per_tok")
    grouped(values, "num_experts", "num_experts_per_tok", "n_group", "topk_group")


RULES = ConfigRules({
    **QWEN2_KEYS, "head_dim": Whole(optional=True), "intermediate_size": Whole(), "moe_intermediate_size": Whole(),
    "num_experts": Whole(high=MAX_EXPERTS, optional=True), "num_shared_experts": Whole(optional=True),
    "num_experts_per_tok": Whole(high=MAX_EXPERTS), "n_group": Whole(high=MAX_EXPERTS),
    "topk_group": Whole(high=MAX_EXPERTS), "first_k_dense_replace": Whole(0, MAX_LAYERS),
    "routed_scaling_factor": Real(0, low_open=True), "partial_rotary_factor": Real(0, 1, low_open=True),
}, _check)


register(FamilySpec(
    config=LLaDA2MoeConfig, model=LLaDA2MoeModelLM, kind="block",
    weights=WeightNames("model.word_embeddings.weight", r"model\.layers\.(\d+)\.",
                        lambda c: ([c.vocab_size, c.hidden_size], c.num_hidden_layers)),
    tokenizer="PreTrainedTokenizerFast",
    mask_token="<|mask|>",  # id 156895 in the release; config.json names no mask_token_id
    rules=RULES))
