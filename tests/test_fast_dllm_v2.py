"""Fast-dLLM v2: the released format loads natively, the forward equals the released modelling's,
and the engine's block + sub-block decoding equals the released ``generate`` at temperature 0."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from fast_dllm_v2_reference import Reference, generate, shift

import dllm_local
from dllm_local.models.attention import BlockCausal
from dllm_local.models.fast_dllm_v2 import FastDLLMv2Config
from dllm_local.tiny_checkpoints.random_fast_dllm_v2 import build_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# config.json's keys as released (Qwen2.5-Instruct's, with bd_size, layer_types, auto_map).
RELEASED_KEYS = {"architectures", "attention_dropout", "auto_map", "bd_size", "bos_token_id", "eos_token_id",
                 "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "layer_types",
                 "max_position_embeddings", "max_window_layers", "model_type", "num_attention_heads",
                 "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
                 "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache",
                 "use_sliding_window", "vocab_size"}
LAYER_TENSORS = [f"self_attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")] + [
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight"]


def released_names(layers: int, tied: bool) -> set[str]:
    """Qwen2's tensor names, as in the released safetensors (the 1.5B has no lm_head.weight)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"} | {f"model.layers.{i}.{t}" for i in range(layers)
                                                                  for t in LAYER_TENSORS}
    return names if tied else names | {"lm_head.weight"}


@pytest.fixture(scope="module", params=[True, False], ids=["1.5B-layout", "7B-layout"])
def folder(request, tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("fast_dllm_v2"), init_seed=1, tie_word_embeddings=request.param)


def file_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    names = set()
    for f in folder.glob("*.safetensors"):
        with safe_open(f, "pt") as fh:
            names |= set(fh.keys())
    return names


def test_released_format_loads_as_block_diffusion(folder):
    raw = json.loads((folder / "config.json").read_text())
    tied = raw["tie_word_embeddings"]
    assert set(raw) == RELEASED_KEYS and raw["model_type"] == "Fast_dLLM_Qwen" and raw["bd_size"] == 32
    assert "mask_token_id" not in raw
    assert file_names(folder) == released_names(raw["num_hidden_layers"], tied)
    if not tied:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == file_names(folder) and len(set(index["weight_map"].values())) > 1
    handle = dllm_local.load(str(folder), device="cpu", dtype="float32")
    assert handle.family == "Fast_dLLM_Qwen" and handle.kind == "block" and handle.block_size == 32
    model = handle.model
    assert model.layout == BlockCausal(32) and not model.packs_requests and model.experts is None
    assert handle.mask_id == handle.tokenizer.convert_tokens_to_ids("|<MASK>|")
    assert handle.eos_id == handle.tokenizer.convert_tokens_to_ids("<|im_end|>") == raw["eos_token_id"]
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    text = handle.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") and "You are Qwen" in text


def test_config_parses_qwen_style_variants():
    """Keys a Qwen2.5 config may carry instead (a sliding window it does not use, no layer_types)."""
    config = FastDLLMv2Config.from_dict({"model_type": "Fast_dLLM_Qwen", "sliding_window": 32768,
                                         "use_sliding_window": False, "num_hidden_layers": 3, "rope_scaling": None})
    assert config.layer_types == ["full_attention"] * 3 and config.max_positions == 32768 and config.bd_size == 32
    with pytest.raises(ValueError, match="sliding"):
        FastDLLMv2Config(use_sliding_window=True)


def test_full_forward_equals_the_released_modelling(folder):
    handle = dllm_local.load(str(folder), device="cpu", dtype="float32")
    ids = torch.randint(0, handle.model.config.vocab_size, (1, 77), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = handle.model(ids).logits
    reference, _, _ = Reference(folder).forward(ids)
    diff, scale = (ours - shift(reference)).abs().max().item(), reference.abs().max().item()
    print(f"Fast-dLLM v2 full forward, 77 positions, float32: max |logit difference| {diff:.2e} "
          f"(logits up to {scale:.0f}: {diff / scale:.1e} of them)")
    assert diff <= 1e-5 * max(1.0, scale)  # the tiny's logits are sharpened to tens: float32's rounding grows with them


def test_cached_forward_recomputes_a_missing_predecessor(folder):
    """Finished blocks' K/V in the cache, then one block's positions after them: its first position's
    prediction reads the previous block's last hidden state, recomputed from ``sequence``."""
    handle = dllm_local.load(str(folder), device="cpu", dtype="float32")
    model = handle.model
    ids = torch.randint(0, model.config.vocab_size, (1, 77), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(slots=1, max_len=96).alloc(77)
    with torch.no_grad():
        full = model(ids).logits
        model(ids[:, :64], torch.arange(64), cache=cache, sequence=ids)
        tail = model(ids[:, 64:], torch.arange(64, 77), cache=cache, sequence=ids).logits
    assert (tail - full[:, 64:]).abs().max().item() <= 1e-5


def test_bfloat16_forward_runs(folder):
    handle = dllm_local.load(str(folder), device="cpu", dtype="bfloat16")
    with torch.no_grad():
        logits = handle.model(torch.arange(40)[None] % 100).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_reference_finished_block_cache_is_exact(folder):
    """The transcription's caches against its own full forward: a block decoded over ``past`` (the
    finished blocks' K/V) sees what the whole sequence's forward sees."""
    ref = Reference(folder)
    ids = torch.randint(0, 700, (1, 96), generator=torch.Generator().manual_seed(5))
    full, _, _ = ref.forward(ids)
    _, past, _ = ref.forward(ids[:, :64], None, update_past=True)
    block, _, _ = ref.forward(ids[:, 64:], past)
    assert (block - full[:, 64:]).abs().max().item() <= 1e-5


def test_reference_generate_counts_its_forwards(folder):
    """The transcribed generate on a prompt longer than a block: one prefill, one store per block,
    several tokens committed by some denoising forwards at threshold 0.9 (the tiny is sharp enough),
    and the sub-block cache's reused K/V changing what some forward sees."""
    handle = dllm_local.load(str(folder), device="cpu", dtype="float32")
    from dllm_local.prompts import encode_prompt

    ids = encode_prompt(handle, [{"role": "user", "content": PROMPTS[0]}])
    runs = [generate(Reference(folder), ids, 96, handle.mask_id, handle.eos_id, threshold=0.9, use_block_cache=c)
            for c in (False, True)]
    for run in runs:
        assert run.store_forwards == 4 and len(run.ids) == (len(ids) // 32 + 3) * 32 + 1
        assert run.nfe == len(run.commits) < 96 - len(ids) % 32 and max(map(len, run.commits)) > 1
    assert runs[0].commits != runs[1].commits


def engine_has(subject: str) -> bool:
    """The engine commit named in issue 43's contract is in this checkout's history."""
    log = subprocess.run(["git", "log", "--format=%s"], cwd=ROOT, capture_output=True, text=True).stdout
    return any(line.startswith(subject) for line in log.splitlines())


PROMPTS = ["hi", "What is 12 + 30? Answer with the number only, then explain the steps in a few words."]


@pytest.mark.parametrize("threshold", [0.9, 0.3])
@pytest.mark.parametrize("sub_block_cache", [False, True])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_decoding_equals_the_released_generate(folder, prompt, threshold, sub_block_cache):
    from dllm_local.prompts import encode_prompt
    from dllm_local.decoding.sampler import generate as engine_generate
    from dllm_local.settings import Settings

    handle = dllm_local.load(str(folder), device="cpu", dtype="float32")
    ids = encode_prompt(handle, [{"role": "user", "content": prompt}])
    blocks = 3
    ref = generate(Reference(folder), ids, blocks * 32, handle.mask_id, handle.eos_id, threshold=threshold,
                   use_block_cache=sub_block_cache)
    end = (len(ids) // 32 + blocks) * 32  # the released generate decodes `blocks` blocks from the prompt's own
    settings = Settings(gen_length=end - len(ids) - (-len(ids) % 32), block_size=32, unmask="threshold",
                        unmask_params={"threshold": threshold}, cache="block",
                        cache_params={"sub_block": 8, "sub_block_cache": sub_block_cache}, temperature=0.0,
                        early_stop=True)
    result = engine_generate(handle, [{"role": "user", "content": prompt}], settings)
    assert list(result.token_ids) == ref.ids[len(ids):end]
    assert result.stats.nfe == ref.nfe
