"""LLaDA2.x: the tiny checkpoint in the released format loads natively, its logits equal an
independent transcription of the released modelling, its decoding equals the released samplers,
and it loads in 4-bit and 8-bit on the CPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import dllm_local
from dllm_local.models.attention import ForwardObserver
from dllm_local.prompts import encode_prompt
from dllm_local.tiny_checkpoints import random_llada2 as tiny

sys.path.insert(0, str(Path(__file__).parent))
from llada2_reference import Reference, answer, generate_v20, generate_v21  # noqa: E402

BLOCK = 32
PROMPT = [{"role": "user", "content": "What is 12 + 7?"}]  # 48 tokens: it ends inside the second block


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny.build_checkpoint(tmp_path_factory.mktemp("llada2") / "tiny-llada2")


@pytest.fixture(scope="module")
def handle(folder):
    return dllm_local.load(str(folder), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def ref(folder) -> Reference:
    return Reference(folder)


def test_loads_natively_from_the_released_format(folder, handle):
    raw = json.loads((folder / "config.json").read_text())
    assert set(raw) == set(tiny.RELEASED)  # every released key, nothing added
    assert raw["auto_map"] == tiny.AUTO_MAP and raw["architectures"] == ["LLaDA2MoeModelLM"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1 and all((folder / f).exists() for f in index.values())
    layer0 = {"attention.query_key_value", "attention.query_layernorm", "attention.key_layernorm", "attention.dense",
              "input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert {f"model.layers.0.{n}.weight" for n in layer0} <= set(index)
    moe = {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.expert_bias",
           "model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.1.mlp.experts.7.down_proj.weight"}
    assert moe <= set(index) and "model.layers.1.mlp.gate_proj.weight" not in index
    assert {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"} <= set(index)
    assert (folder / "generation_config.json").exists()
    assert handle.kind == "block" and handle.block_size == BLOCK and handle.experts == (8, 2)
    assert handle.mask_id == handle.tokenizer.convert_tokens_to_ids(tiny.MASK)
    assert handle.model.layout.block_size == BLOCK
    summary = handle.summary()
    assert summary["experts"] == 8 and summary["active_experts"] == 2 and summary["block_size"] == BLOCK
    assert encode_prompt(handle, PROMPT)[-3:] == handle.tokenizer.encode("<role>ASSISTANT</role>")[-3:]


class _Routes(ForwardObserver):
    def __init__(self) -> None:
        self.layers: dict[int, torch.Tensor] = {}

    def on_route(self, layer, experts):
        self.layers[layer] = experts.clone()


@pytest.mark.parametrize("n", [45, 77])
def test_full_forward_equals_the_reference(handle, ref, n):
    torch.manual_seed(n)
    ids = torch.randint(0, handle.model.config.vocab_size, (n,))
    with torch.no_grad():
        ours = handle.model(ids[None]).logits[0]
        # The same forward over a cache (every position written, the block-causal key mask), watched.
        routes = _Routes()
        view = handle.model.new_cache(1, n).alloc()
        cached = handle.model(ids[None], torch.arange(n), cache=view, observers=(routes,)).logits[0]
    theirs, _, routed = ref.forward(ids, torch.arange(n), _block_mask(n))
    diff = (ours - theirs).abs().max().item()
    print(f"LLaDA2 tiny, {n} positions (block {BLOCK}): max |logit difference| vs reference = {diff:.2e}")
    assert diff <= 1e-5
    assert (cached - theirs).abs().max().item() <= 1e-5
    assert list(routes.layers) == [1]  # the dense first layer reports nothing
    assert torch.equal(routes.layers[1], routed[0])


def _block_mask(n: int) -> torch.Tensor:
    from llada2_reference import block_diffusion_mask

    return block_diffusion_mask(n, BLOCK)


def test_bfloat16_forward(folder, handle):
    bf16 = dllm_local.load(str(folder), device="cpu", dtype="bfloat16")
    ids = torch.arange(40)[None]
    with torch.no_grad():
        a, b = handle.model(ids).logits, bf16.model(ids).logits
    assert b.dtype == torch.float32 and torch.isfinite(b).all()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


def test_reference_cache_is_exact_and_edits_happen(handle, ref):
    """The reference's own check: decoding over its exact block cache gives the tokens and the
    denoising forwards of full recompute, for LLaDA2.0's sampler and LLaDA2.1's editing one."""
    prompt = encode_prompt(handle, PROMPT)
    a = generate_v20(ref, prompt, handle.mask_id, handle.eos_id, 32, threshold=0.7)
    b = generate_v20(ref, prompt, handle.mask_id, handle.eos_id, 32, threshold=0.7, cache=True)
    assert (a.tokens, a.nfe) == (b.tokens, b.nfe) and b.store_forwards == 3  # prefill, two finished blocks
    c = generate_v21(ref, prompt, handle.mask_id, handle.eos_id, 32, cache=True)
    d = generate_v21(ref, prompt, handle.mask_id, handle.eos_id, 32)
    assert (c.tokens, c.nfe, c.edits) == (d.tokens, d.nfe, d.edits) and c.edits > 0


@pytest.mark.parametrize("unmask, params, threshold", [("fixed", {}, 1.0), ("threshold", {"threshold": 0.7}, 0.7)])
@pytest.mark.parametrize("cache", ["block", "none"])
def test_decoding_equals_the_released_generate(handle, ref, unmask, params, threshold, cache):
    """Temperature 0, a prompt ending inside a block: the same tokens and the same denoising
    forwards as LLaDA2.0's released generate (``threshold=1.0``: its one-per-step fallback)."""
    from dllm_local.decoding.sampler import generate
    from dllm_local.settings import Settings

    prompt = encode_prompt(handle, PROMPT)
    expected = generate_v20(ref, prompt, handle.mask_id, handle.eos_id, 64, threshold=threshold, cache=cache == "block")
    assert not set(expected.tokens) & set(handle.stop_ids)  # no early end: every block is decoded
    settings = Settings(gen_length=64, block_size=BLOCK, unmask=unmask, unmask_params=params, cache=cache,
                        temperature=0.0)
    result = generate(handle, PROMPT, settings)
    assert list(result.token_ids) == expected.tokens
    assert result.stats.nfe == expected.nfe
    if cache == "block":  # the released code stores the last block too, K/V nothing reads: skipped here
        assert result.stats.store_forwards == expected.store_forwards - 1


@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_quantized_loads_on_the_cpu(folder, handle, quantization):
    pytest.importorskip("bitsandbytes")
    q = dllm_local.load(str(folder), device="cpu", dtype="float32", quantization=quantization)
    assert q.summary()["quantized_share"] > 0
    prompt = encode_prompt(q, PROMPT)
    ids = torch.tensor(prompt + [q.mask_id] * 8)[None]
    with torch.no_grad():
        ours, exact = q.model(ids).logits[0, len(prompt):], handle.model(ids).logits[0, len(prompt):]
    tokens = ours.argmax(-1)
    assert ((0 <= tokens) & (tokens < q.model.config.vocab_size)).all()
    assert torch.nn.functional.cosine_similarity(ours, exact, dim=-1).min() > 0.9
    assert answer(tokens.tolist(), q.stop_ids, q.mask_id)


@pytest.mark.parametrize("cache", ["block", "none"])
def test_editing_equals_the_released_llada21_generate(handle, ref, cache):
    """LLaDA 2.1's quality mode (threshold 0.7, edit threshold 0.5) as the ``edit`` unmasking
    policy: the same tokens, denoising forwards and edits as its released generate."""
    from dllm_local.decoding.sampler import generate
    from dllm_local.settings import Settings

    prompt = encode_prompt(handle, PROMPT)
    expected = generate_v21(ref, prompt, handle.mask_id, handle.eos_id, 64, eos_early_stop=False, cache=cache == "block")
    assert expected.edits > 0  # the tiny model's drafts change as the block fills: edits do happen
    result = generate(handle, PROMPT, Settings(gen_length=64, block_size=BLOCK, unmask="edit", cache=cache))
    edits = [e for s in result.trace.steps for e in s.edited or []]
    assert list(result.token_ids) == expected.tokens
    assert (result.stats.nfe, len(edits)) == (expected.nfe, expected.edits)
    assert all(e[2] > 0.5 and e[1] != e[3] for e in edits)  # above the edit threshold, to another token


def test_editing_stops_at_the_end_of_a_block_as_released(handle, ref):
    """With early stop, the run ends after the block in which the answer's end-of-text is
    committed with no mask before it, as the released generate's eos_early_stop does."""
    from dllm_local.decoding.sampler import generate
    from dllm_local.settings import Settings

    prompt = encode_prompt(handle, PROMPT)
    expected = generate_v21(ref, prompt, handle.mask_id, handle.eos_id, 96, cache=True)
    result = generate(handle, PROMPT, Settings(gen_length=96, block_size=BLOCK, unmask="edit", cache="block",
                                               early_stop=True))
    assert answer(list(result.token_ids), (handle.eos_id,), handle.mask_id) == answer(expected.tokens, (handle.eos_id,),
                                                                                       handle.mask_id)
    assert result.stats.nfe == expected.nfe
