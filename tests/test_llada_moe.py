"""LLaDA-MoE: a tiny random checkpoint in the released format (model_type "llada" with OLMoE's MoE
keys, sharded safetensors under the released names, no mask_token_id: the tokenizer's <|mask|>)
loads natively, its full-forward logits equal an independent transcription of the released
modelling code (tests/llada_moe_reference.py) in float32, and the project's decoding equals LLaDA's
generate.py over that reference at temperature 0, token for token."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dllm_local import Settings
from dllm_local.models.loading.loader import load
from dllm_local.prompts import encode_prompt
from dllm_local.decoding.sampler import generate
from dllm_local.tiny_checkpoints.random_llada_moe import build_checkpoint
from llada_moe_reference import ReferenceLLaDAMoE, llada_generate

PROMPT = [{"role": "user", "content": "Tom has 3 apples. He gets 4 more. How many apples does he have?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("llada-moe"), init_seed=0)


@pytest.fixture(scope="module")
def handle(checkpoint):
    return load(str(checkpoint), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(checkpoint) -> ReferenceLLaDAMoE:
    return ReferenceLLaDAMoE(checkpoint)


def test_loads_the_released_format(checkpoint, handle):
    raw = json.loads((checkpoint / "config.json").read_text())
    assert raw["model_type"] == "llada" and "mask_token_id" not in raw and "auto_map" in raw
    assert (handle.family, handle.kind, handle.block_size) == ("lladamoe", "masked", None)
    assert handle.experts == (raw["num_experts"], raw["num_experts_per_tok"])
    assert handle.mask_id == handle.tokenizer.convert_tokens_to_ids("<|mask|>")
    assert handle.eos_id == handle.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(handle.model.state_dict())
    assert len(set(index.values())) == 2
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in index and "model.layers.0.self_attn.q_norm.weight" in index
    text = handle.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<role>HUMAN</role>") and text.endswith("<|role_end|><role>ASSISTANT</role>")


@torch.no_grad()
def test_full_forward_logits_equal_the_reference(handle, reference):
    x = torch.tensor([encode_prompt(handle, PROMPT) + [handle.mask_id] * 16])
    ours, theirs = handle.model(x).logits, reference.logits(x)
    diff = (ours - theirs).abs().max().item()
    print(f"LLaDA-MoE float32 max logit difference: {diff:.3g} (logits up to {theirs.abs().max().item():.3g})")
    assert diff <= 1e-5


def test_fixed_decoding_equals_llada_generate_on_the_reference(handle, reference):
    prompt = torch.tensor([encode_prompt(handle, PROMPT)])
    expected = llada_generate(reference, prompt, steps=16, gen_length=16, block_length=8, mask_id=handle.mask_id)
    run = generate(handle, PROMPT, Settings(gen_length=16, block_size=8, unmask="fixed", temperature=0.0))
    assert run.token_ids == expected
    assert len(set(expected)) > 1  # not a tie everywhere
    assert run.stats.nfe == 16
    routed = run.trace.steps[0].experts
    assert sorted(routed) == ["0", "1"] and all(0 < len(e) <= handle.experts[0] for e in routed.values())


def test_dual_cache_with_threshold_decodes(handle):
    run = generate(handle, PROMPT, Settings(gen_length=16, block_size=8, cache="dual", unmask="threshold",
                                            temperature=0.0))
    assert len(run.token_ids) == 16 and handle.mask_id not in run.token_ids


@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_quantized_loads_decode_on_the_cpu(checkpoint, quantization):
    quantized = load(str(checkpoint), device="cpu", quantization=quantization)
    assert quantized.quantization == quantization
    run = generate(quantized, PROMPT, Settings(gen_length=4, block_size=4, unmask="fixed"))
    assert len(run.token_ids) == 4 and quantized.mask_id not in run.token_ids
