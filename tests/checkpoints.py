"""Tiny random checkpoints in the exact on-disk formats of the real families.

LLaDA: LLaDA-8B-Instruct's config.json keys with small sizes and every parameter name of its
real weight index (32 blocks), sharded safetensors with an index. Dream: Dream-v0-Instruct-7B's
config keys and Qwen2 parameter names. Both get tokenizer files with a chat template.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from dllm_local.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM
from dllm_local.tiny.tokenizer import build_tokenizer

REFERENCE = Path(__file__).resolve().parents[1] / "assets" / "reference" / "llada-8b-instruct"

DREAM_CONFIG = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "mask_token_id": 151666, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "pad_token_id": 151643,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064,
}
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{{ '<|im_start|>assistant\n' }}"
)


def reference_weight_names() -> set[str]:
    return set(json.loads((REFERENCE / "model.safetensors.index.json").read_text())["weight_map"])


def llada_config(**sizes) -> LLaDAConfig:
    raw = json.loads((REFERENCE / "config.json").read_text())
    raw.pop("auto_map")
    raw.update(d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=96, vocab_size=768, embedding_size=768,
               max_sequence_length=128, mask_token_id=2, eos_token_id=1, pad_token_id=1)
    raw.update(sizes)
    return LLaDAConfig(**raw)


def dream_config(**sizes) -> DreamConfig:
    raw = dict(DREAM_CONFIG)
    raw.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=800, max_position_embeddings=128, mask_token_id=790, eos_token_id=1, pad_token_id=1,
               bos_token_id=1, rope_theta=10000.0)
    raw.update(sizes)
    return DreamConfig(**raw)


def _noisy_norms(model: torch.nn.Module, seed: int) -> None:
    # Norm weights of ones would hide a norm applied to the wrong tensor; random ones do not.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g) if "norm" in name else 0.1 * torch.randn(p.shape, generator=g))


def build_llada(path: Path, seed: int = 0, shard_size: str = "400KB", **sizes) -> Path:
    torch.manual_seed(seed)
    model = LLaDAModelLM(llada_config(**sizes))
    _noisy_norms(model, seed)
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size=shard_size)
    tok = build_tokenizer()
    tok.save_pretrained(path)
    return path


def build_dream(path: Path, seed: int = 0, **sizes) -> Path:
    torch.manual_seed(seed)
    model = DreamModel(dream_config(**sizes))
    _noisy_norms(model, seed)
    model.save_pretrained(path, max_shard_size="100KB")
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    # Dream's hub tokenizer names a remote-code class; the loader must not need it.
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "DreamTokenizer"
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path
