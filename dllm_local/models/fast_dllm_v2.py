"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_1.5B and _7B): Qwen2.5 turned block diffusion.

The weights are a Qwen2.5-Instruct's, under Qwen2's names (q/k/v with biases; the 1.5B ties its
head to the embedding and ships no ``lm_head.weight``). What changes is the attention and the head's
reading: at inference every position attends its own block of ``bd_size`` (32) and every block
before it, at absolute positions, and the prediction for position p comes from hidden state p - 1
(the token shift Dream has, kept from the autoregressive model it was tuned from). Dream's forward
is exactly that under a block-causal layout, so this family is Dream's model with the checkpoint's
config and ``BlockCausal(bd_size)``.

Its released ``generate`` (sub-blocks of 8 inside each block, a token past each finished block
taken from the store forward's last row) is the engine's business, not the model's.
"""
from __future__ import annotations

from .attention import BlockCausal
from .config_rules import ConfigRules, Whole
from .dream import DREAM_KEYS, DreamConfig, DreamModel
from .family import QWEN2_WEIGHTS, FamilySpec, register


class FastDLLMv2Config(DreamConfig):
    """The released config.json: Qwen2.5's keys (Dream's, read the same way), ``bd_size``,
    ``layer_types`` and the remote-code ``auto_map`` (kept, never run). It names no mask id: the
    tokenizer's ``|<MASK>|`` is the mask."""

    model_type = "Fast_dLLM_Qwen"

    def __init__(self, hidden_act: str = "silu", use_sliding_window: bool = False, layer_types: list[str] | None = None,
                 bd_size: int = 32, tie_word_embeddings: bool = False, **kwargs) -> None:
        if hidden_act != "silu":
            raise ValueError(f"hidden_act {hidden_act!r}: Fast-dLLM v2's MLP is Qwen2's SwiGLU (silu)")
        if use_sliding_window:
            raise ValueError("use_sliding_window: the released Fast-dLLM v2 checkpoints attend their whole past")
        if kwargs.get("rope_scaling") is not None:
            raise ValueError("rope_scaling: the released Fast-dLLM v2 checkpoints use plain RoPE")
        kwargs.setdefault("eos_token_id", 151645)  # <|im_end|>, the released generate's stop token
        kwargs.setdefault("max_position_embeddings", 32768)
        layer_types = layer_types or ["full_attention"] * kwargs.get("num_hidden_layers", 28)
        super().__init__(mask_token_id=None, tie_word_embeddings=tie_word_embeddings, hidden_act=hidden_act,
                         use_sliding_window=use_sliding_window, layer_types=layer_types, bd_size=bd_size, **kwargs)


# Its generate decodes each block in sub-blocks of 8 (``small_block_size``), as released.
RELEASED_SUB_BLOCK = 8


class FastDLLMv2ForCausalLM(DreamModel):
    """Dream's shifted-head Qwen2 model under ``BlockCausal(bd_size)``: a forward without cache is
    the released model's inference forward (its ``eval_block_diff_mask``) with the logits shifted
    as its ``generate`` shifts them; with a cache, finished blocks' K/V are exact."""

    config_class = FastDLLMv2Config
    packs_requests = False  # the shifted head reads each position's predecessor: one request a forward

    def __init__(self, config: FastDLLMv2Config) -> None:
        super().__init__(config)
        self.layout = BlockCausal(config.bd_size)
        self.block_size = config.bd_size
        self.sub_block = RELEASED_SUB_BLOCK


register(FamilySpec(
    config=FastDLLMv2Config, model=FastDLLMv2ForCausalLM, kind="block", weights=QWEN2_WEIGHTS,
    tokenizer="Qwen2Tokenizer",
    mask_token="|<MASK>|",  # id 151665 in the released tokenizers (added_tokens.json)
    rules=ConfigRules({**DREAM_KEYS, "bd_size": Whole()})))
