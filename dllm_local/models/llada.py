"""LLaDA (GSAI-ML/LLaDA-8B-Instruct, LLaDA-1.5): a bidirectional Llama-style masked-diffusion LM.

Parameter names follow the released checkpoints exactly (``model.transformer.blocks.N.q_proj``
and so on), so the unmodified ``config.json`` and safetensors load without remote code.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig

from .attention import Attention
from .config_rules import MAX_LAYERS, ConfigRules, Real, Whole
from .family import FamilySpec, WeightNames, register
from .layers import FusedProjections, RMSNorm, attend
from .stack import LayerStackLM


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        n_layers: int = 32,
        mlp_hidden_size: int | None = 12288,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope_theta: float = 500000.0,
        rms_norm_eps: float = 1e-5,
        weight_tying: bool = False,
        include_bias: bool = False,
        mask_token_id: int = 126336,
        **kwargs,
    ) -> None:
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.weight_tying = weight_tying
        self.include_bias = include_bias
        self.mask_token_id = mask_token_id
        kwargs.setdefault("tie_word_embeddings", weight_tying)
        super().__init__(**kwargs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_size(self) -> int:
        return self.mlp_hidden_size or self.mlp_ratio * self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def max_positions(self) -> int:
        return self.max_sequence_length


class LLaDABlock(FusedProjections):
    fuses = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("ff_proj", "up_proj")}

    def __init__(self, config: LLaDAConfig, index: int) -> None:
        super().__init__()
        d, hd = config.d_model, config.head_dim
        self.index = index
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.attn_out = nn.Linear(config.n_heads * hd, d, bias=False)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, config.ffn_size, bias=False)
        self.up_proj = nn.Linear(d, config.ffn_size, bias=False)
        self.ff_out = nn.Linear(config.ffn_size, d, bias=False)

    def forward(self, x: torch.Tensor, rope, attention: Attention) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.project("qkv", self.attn_norm(x))
        q = q.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        x = x + self.attn_out(attend(q, k, v, rope, self.index, attention))
        gate, up = self.project("gate_up", self.ff_norm(x))
        return x + self.ff_out(F.silu(gate) * up)


class LLaDATransformer(nn.Module):
    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.embedding_size or config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(config, i) for i in range(config.n_layers))
        self.ln_f = RMSNorm(config.d_model, config.rms_norm_eps)
        if not config.weight_tying:
            self.ff_out = nn.Linear(config.d_model, config.embedding_size or config.vocab_size, bias=False)


class LLaDAModel(nn.Module):
    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__()
        self.transformer = LLaDATransformer(config)


class LLaDAModelLM(LayerStackLM):
    """The layer stack under the released names: ``transformer.wte``, ``.blocks``, ``.ln_f``, and
    ``ff_out`` as the head (or ``wte`` itself, with ``weight_tying``). Every layer but attention
    is per position, so a forward may pack several requests (``packs_requests``)."""

    config_class = LLaDAConfig
    _no_split_modules = ["LLaDABlock"]

    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = getattr(self.config, "init_std", 0.02) or 0.02
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer.wte

    def get_output_embeddings(self) -> nn.Module | None:
        return None if self.config.weight_tying else self.model.transformer.ff_out

    def stack(self) -> nn.ModuleList:
        return self.model.transformer.blocks

    def final_norm(self) -> nn.Module:
        return self.model.transformer.ln_f

    def head(self, x: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        return F.linear(x, t.wte.weight) if self.config.weight_tying else t.ff_out(x)

    def cache_sizes(self) -> tuple[int, int, int, int]:
        c = self.config
        return c.n_layers, c.n_kv_heads, c.max_sequence_length, c.head_dim


register(FamilySpec(
    config=LLaDAConfig, model=LLaDAModelLM, kind="masked",
    weights=WeightNames("model.transformer.wte.weight", r"model\.transformer\.blocks\.(\d+)\.",
                        lambda c: ([c.embedding_size or c.vocab_size, c.d_model], c.n_layers)),
    tokenizer="PreTrainedTokenizerFast", size_keys=("d_model", "n_heads", "n_kv_heads"),
    rules=ConfigRules({
        "d_model": Whole(), "n_heads": Whole(), "n_kv_heads": Whole(optional=True), "n_layers": Whole(high=MAX_LAYERS),
        "mlp_hidden_size": Whole(optional=True), "mlp_ratio": Whole(), "vocab_size": Whole(),
        "embedding_size": Whole(optional=True), "max_sequence_length": Whole(), "rope_theta": Real(0, low_open=True),
        "rms_norm_eps": Real(0, 1, low_open=True)})))
