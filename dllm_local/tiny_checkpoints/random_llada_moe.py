"""A tiny random LLaDA-MoE in the released on-disk format: config.json with the released keys
(``model_type: "llada"``, the OLMoE-style MoE keys, the remote-code auto_map we never run),
safetensors shards under the released tensor names with their model.safetensors.index.json,
generation_config.json, and tokenizer files: the embedded tiny model's byte-level BPE with
LLaDA-MoE's special tokens (``<|mask|>``, ``<role>``, ``</role>``, ``<|role_end|>``) and its chat
template. Never trained: it shows the mechanics (routing, caches, unmasking), not good answers.

``python -m dllm_local.tiny_checkpoints.random_llada_moe FOLDER`` writes one.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..tiny import checkpoint_cli

# The Instruct checkpoint's turns: <role>HUMAN</role>...<|role_end|><role>ASSISTANT</role>.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% set role = message['role'] | lower %}{% if role == 'user' %}"
    "{% set role = 'HUMAN' %}{% endif %}{% set role = role | upper %}"
    "{{ '<role>' + role + '</role>' + message['content'] + '<|role_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|mask|>", "<role>", "</role>", "<|role_end|>"]
# The 7B-A1B layout scaled down: every layer a mixture (moe_layer_freq all 1), no shared expert, an
# eighth of the experts routed (8 of 64 there). 32 experts: bitsandbytes' 4-bit CPU kernel takes
# output widths in multiples of 32 (the router's included) and input widths in multiples of 64.
SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
             dense_intermediate_size=128, expert_intermediate_size=64, num_experts=32, num_experts_per_tok=4,
             max_position_embeddings=1024)
AUTO_MAP = {"AutoConfig": "configuration_lladamoe.LLaDAConfig", "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
            "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"}


def tokenizer():
    """The tiny model's byte-level BPE with LLaDA-MoE's special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    from ..models.loading.find import TINY_MODEL

    tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    tok.add_special_tokens({"pad_token": "<|endoftext|>", "additional_special_tokens": SPECIAL_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def released_config(vocab_size: int, eos_id: int, **sizes) -> dict:
    """config.json as the hub's checkpoints write it, with ``sizes`` in place of the 7B's."""
    s = {**SIZES, **sizes}
    return {
        "architectures": ["LLaDAMoEModelLM"], "attention_bias": False, "attention_dropout": 0.0, "auto_map": AUTO_MAP,
        "bos_token_id": None, "clip_qkv": None, "dense_intermediate_size": s["dense_intermediate_size"],
        "eos_token_id": eos_id, "expert_intermediate_size": s["expert_intermediate_size"], "hidden_act": "silu",
        "hidden_size": s["hidden_size"], "initializer_range": 0.02,
        "max_position_embeddings": s["max_position_embeddings"], "model_type": "llada",
        "moe_layer_freq": s.get("moe_layer_freq", [1] * s["num_hidden_layers"]),
        "moe_router_enable_expert_bias": s.get("moe_router_enable_expert_bias", False),
        "moe_router_score_function": "softmax", "norm_topk_prob": False,
        "num_attention_heads": s["num_attention_heads"], "num_experts": s["num_experts"],
        "num_experts_per_tok": s["num_experts_per_tok"], "num_hidden_layers": s["num_hidden_layers"],
        "num_key_value_heads": s["num_key_value_heads"], "output_router_logits": False, "pad_token_id": eos_id,
        "partial_rotary_factor": s.get("partial_rotary_factor", 1.0), "qk_layernorm": True, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 50000.0, "routed_scaling_factor": 1, "router_aux_loss_coef": 0.01,
        "router_num_group": None, "router_topk_group": None,
        "shared_expert_intermediate_size": s.get("shared_expert_intermediate_size"), "tie_word_embeddings": False,
        "torch_dtype": "float32", "transformers_version": "4.52.0", "use_cache": False, "vocab_size": vocab_size,
    }


def build_checkpoint(path: str | Path, init_seed: int = 0, logit_scale: float = 16.0, shards: int = 2,
                     **sizes) -> Path:
    """Write a random LLaDA-MoE to ``path`` (weights drawn from ``init_seed``, float32) in
    ``shards`` safetensors files; ``logit_scale`` multiplies the output head so greedy decoding
    is not a tie, and the norms are random so a norm applied to the wrong tensor shows."""
    from safetensors.torch import save_file

    from ..models.llada_moe import LLaDAMoEConfig, LLaDAMoEModelLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    raw = released_config(len(tok), tok.eos_token_id, **sizes)
    torch.manual_seed(init_seed)
    model = LLaDAMoEModelLM(LLaDAMoEConfig.from_dict(raw))
    g = torch.Generator().manual_seed(init_seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({k: tensors[k] for k in part}, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    generation = {"bos_token_id": None, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.eos_token_id,
                  "transformers_version": "4.52.0"}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tok.save_pretrained(path)
    return path


if __name__ == "__main__":
    checkpoint_cli(build_checkpoint, __doc__)
