"""A tiny random LLaDA2.x in the released on-disk format (inclusionAI/LLaDA2.0-mini's layout).

config.json with the release's keys (scaled-down sizes, its auto_map, architectures and
model_type), sharded safetensors under the release's weight names with
model.safetensors.index.json, generation_config.json, and tokenizer files: the embedded tiny
model's byte-level BPE plus LLaDA2's mask, role and end-of-role tokens and its chat template.
Two layers, the first dense and the second a mixture of experts (``first_k_dense_replace=1``), so
both layer kinds are exercised. Never trained: it shows the mechanics (block-causal attention,
routed experts, threshold commits and edits), not good answers. ``python -m dllm_local.tiny_checkpoints.random_llada2
FOLDER`` writes one.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..tiny import checkpoint_cli

MASK, ROLE_END = "<|mask|>", "<|role_end|>"
# The Ling/LLaDA2 chat layout: a system turn that always says "detailed thinking off", then
# "<role>HUMAN</role>...<|role_end|>" turns, and "<role>ASSISTANT</role>" to answer.
CHAT_TEMPLATE = (
    "{{ '<role>SYSTEM</role>' }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n' }}{% endif %}"
    "{{ 'detailed thinking off<|role_end|>' }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<role>HUMAN</role>' + message['content'] + '<|role_end|>' }}{% elif message['role'] == 'assistant' %}"
    "{{ '<role>ASSISTANT</role>' + message['content'] + '<|role_end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}"
)
AUTO_MAP = {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"}
# LLaDA2.0-mini's config.json, every key, at its released values (sizes scaled down below).
RELEASED = dict(
    architectures=["LLaDA2MoeModelLM"], attention_dropout=0.0, auto_map=AUTO_MAP, embedding_dropout=0.0,
    first_k_dense_replace=1, head_dim=128, hidden_act="silu", hidden_size=2048, initializer_range=0.02,
    intermediate_size=5120, max_position_embeddings=32768, max_window_layers=20, model_type="llada2_moe",
    moe_intermediate_size=512, moe_router_enable_expert_bias=True, n_group=8, norm_head=False, norm_softmax=False,
    norm_topk_prob=True, num_attention_heads=16, num_experts=256, num_experts_per_tok=8, num_hidden_layers=20,
    num_key_value_heads=4, num_shared_experts=1, output_dropout=0.0, output_router_logits=False, pad_token_id=156892,
    partial_rotary_factor=0.5, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=600000,
    routed_scaling_factor=2.5, router_dtype="fp32", score_function="sigmoid", tie_word_embeddings=False,
    topk_group=4, torch_dtype="bfloat16", transformers_version="4.56.0", use_bias=False, use_cache=True,
    use_qk_norm=True, use_qkv_bias=False, use_rmsnorm=True, use_sliding_window=False, sliding_window=4096,
    using_split_qkv_in_self_attention=False, vocab_size=157184,
)
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_window_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, n_group=4,
             topk_group=2, moe_intermediate_size=64, max_position_embeddings=1024)


def tokenizer():
    """The tiny model's byte-level BPE with LLaDA2's mask and role tokens and its chat template."""
    from transformers import PreTrainedTokenizerFast

    from ..models.loading.find import TINY_MODEL

    tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    tok.add_special_tokens({"mask_token": MASK, "additional_special_tokens": ["<role>", "</role>", ROLE_END]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_checkpoint(path: str | Path, init_seed: int = 0, logit_scale: float = 24.0, **sizes) -> Path:
    """Write a random LLaDA2 to ``path``, its weights drawn from ``init_seed``. ``logit_scale``
    multiplies the output head, so that some positions pass a 0.7-0.95 threshold and greedy picks
    are far from ties; norms and the experts' bias are drawn too, so a misplaced one shows."""
    from ..models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM

    path = Path(path)
    tok = tokenizer()
    raw = {**RELEASED, **SIZES, **sizes, "vocab_size": len(tok), "pad_token_id": tok.pad_token_id}
    torch.manual_seed(init_seed)
    model = LLaDA2MoeModelLM(LLaDA2MoeConfig.from_dict(raw)).eval()
    g = torch.Generator().manual_seed(init_seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
        # A trained model never drafts its mask token; a random one would, now and then, and the
        # released sampler would "commit" it (the engine never does), so its logit is held at 0.
        model.lm_head.weight[tok.convert_tokens_to_ids("<|mask|>")] = 0
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    model.save_pretrained(path, max_shard_size="200KB")  # sharded with an index, as released
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    eos = tok.eos_token_id
    generation = {"_from_model_config": True, "bos_token_id": tok.bos_token_id, "eos_token_id": eos,
                  "pad_token_id": tok.pad_token_id, "transformers_version": RELEASED["transformers_version"]}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tok.save_pretrained(path)
    return path


if __name__ == "__main__":
    checkpoint_cli(build_checkpoint, __doc__)
