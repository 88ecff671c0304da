"""SDAR and SDAR MoE: the tiny checkpoints in the released format, logits against the reference
transcription (tests/sdar_reference.py), decoding against SDAR's block_diffusion_generate."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import dllm_local
from dllm_local.errors import ModelLoadError
from dllm_local.models.attention import ForwardObserver
from dllm_local.models.sdar import SDARConfig, SDARMoeConfig
from dllm_local.tiny_checkpoints.random_sdar import build_checkpoint

import sdar_reference as ref

RELEASED = json.loads((Path(__file__).parent / "data" / "sdar_released.json").read_text())
KINDS = ["dense", "moe"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sdar")
    return {kind: build_checkpoint(root / kind, moe=kind == "moe") for kind in KINDS}


@pytest.fixture(scope="module")
def handles(folders):
    return {kind: dllm_local.load(str(folders[kind]), device="cpu", dtype="float32") for kind in KINDS}


def _layer_names(names) -> set[str]:
    import re

    return {re.sub(r"experts\.\d+\.", "experts.E.", re.sub(r"layers\.\d+\.", "layers.N.", n)) for n in names}


def test_the_released_configs_parse_unchanged():
    config = SDARConfig.from_dict(RELEASED["config_4b"])
    assert (config.block_size, config.max_positions, config.num_hidden_layers, config.head_dim) == (4, 32768, 36, 128)
    assert config.eos_token_id == 151643 and not config.tie_word_embeddings
    first = SDARConfig.from_dict(RELEASED["config_8b_first_upload"])  # no block_size, no mask_token_id
    assert first.block_size == 4 and first.hidden_size == 4096
    # SDAR-30B-A3B's expert sizes are Qwen3-30B-A3B's.
    moe = SDARMoeConfig.from_dict({**RELEASED["config_4b"], "model_type": "sdar_moe", "num_experts": 128,
                                   "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True})
    assert (moe.num_experts, moe.num_experts_per_tok, moe.sparse_layer(0)) == (128, 8, True)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_checkpoint_loads_as_block_diffusion(kind, handles):
    h = handles[kind]
    assert (h.family, h.kind, h.block_size) == ({"dense": "sdar", "moe": "sdar_moe"}[kind], "block", 4)
    assert h.experts == (None if kind == "dense" else (8, 2))
    assert h.mask_id == h.tokenizer.convert_tokens_to_ids("<|MASK|>") == h.tokenizer.mask_token_id
    assert {h.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")} <= set(h.stop_ids)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_files_are_the_released_format(kind, folders):
    path = folders[kind]
    config = json.loads((path / "config.json").read_text())
    moe = RELEASED["moe"]
    assert sorted(config) == sorted(RELEASED["config_keys"] + (moe["extra_config_keys"] if kind == "moe" else []))
    fixed = {**RELEASED["config_fixed"], **({k: moe[k] for k in ("architectures", "model_type")} if kind == "moe" else {})}
    assert {k: config[k] for k in fixed if k != "auto_map"} == {k: v for k, v in fixed.items() if k != "auto_map"}
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert sorted(index) == RELEASED["index_keys"]
    assert sorted(set(index["weight_map"].values())) == RELEASED["shards"]
    names = _layer_names(index["weight_map"])
    expected = set(RELEASED["weight_names"])
    if kind == "moe":
        expected = expected - {f"model.layers.N.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= set(moe["sparse_layer_names"])
    assert names == expected
    assert set(json.loads((path / "generation_config.json").read_text())) == set(RELEASED["generation_config"])
    tok = json.loads((path / "tokenizer_config.json").read_text())
    assert sorted(tok) == RELEASED["tokenizer_config_keys"]
    assert {k: tok[k] for k in RELEASED["tokenizer"]} == RELEASED["tokenizer"]
    import hashlib

    assert hashlib.sha256((path / "chat_template.jinja").read_bytes()).hexdigest() == RELEASED["chat_template_sha256"]
    assert all((path / f).is_file() for f in RELEASED["tokenizer_files"])


def _ids(h, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(h.tokenizer) - 8, (1, n), generator=g)
    ids[0, n - 6 :: 2] = h.mask_id
    return ids


@pytest.mark.parametrize("kind", KINDS)
def test_full_forward_equals_the_reference(kind, handles, folders):
    h, model = handles[kind], ref.load(folders[kind])
    n = 23  # ends inside a block
    ids = _ids(h, n)
    with torch.no_grad():
        ours = h.model(ids).logits
    theirs = ref.forward(model, ids, ref.block_mask(6, 4)[:, :n, :n], torch.arange(n)[None])
    diff = (ours - theirs).abs().max().item()
    print(f"sdar {kind}: full forward max |logit diff| {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.parametrize("moe, sizes", [(False, {"tie_word_embeddings": True}), (True, {"mlp_only_layers": [0]})],
                         ids=["tied head (SDAR-1.7B)", "a dense layer among the experts"])
def test_layout_variants_equal_the_reference(moe, sizes, tmp_path):
    path = build_checkpoint(tmp_path / "variant", init_seed=1, moe=moe, **sizes)
    h, model = dllm_local.load(str(path), device="cpu", dtype="float32"), ref.load(path)
    ids = _ids(h, 14)
    with torch.no_grad():
        diff = (h.model(ids).logits - ref.forward(model, ids, ref.block_mask(4, 4)[:, :14, :14], torch.arange(14)[None]))
    print(f"sdar {sizes}: full forward max |logit diff| {diff.abs().max().item():.2e}")
    assert diff.abs().max() <= 1e-5


class _Routes(ForwardObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []

    def on_route(self, layer: int, experts: torch.Tensor) -> None:
        self.seen.append((layer, experts.clone()))


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_over_the_cache_equals_the_reference(kind, handles, folders):
    """Prefill two blocks (stored), then a block of masks that reads them: SDAR's store_kv=True
    then store_kv=False, against our KV cache written then attended under the block-causal layout."""
    h, model = handles[kind], ref.load(folders[kind])
    ids = _ids(h, 12, seed=1)
    ids[0, 8:] = h.mask_id
    mask = ref.block_mask(3, 4)
    past: list = []
    ref.forward(model, ids[:, :8], mask[:, :8, :8], torch.arange(8)[None], past, store_kv=True)
    theirs = ref.forward(model, ids[:, 8:], mask[:, 8:, :], torch.arange(8, 12)[None], past, store_kv=False)
    view = h.model.new_cache(1, 64).alloc()
    routes = _Routes()
    with torch.no_grad():
        h.model(ids[:, :8], positions=torch.arange(8), cache=view)
        ours = h.model(ids[:, 8:], positions=torch.arange(8, 12), cache=view, observers=(routes,)).logits
    diff = (ours - theirs).abs().max().item()
    print(f"sdar {kind}: cached block max |logit diff| {diff:.2e}")
    assert diff <= 1e-5
    assert [layer for layer, _ in routes.seen] == [layer for layer, _ in model.routed]
    for (_, a), (_, b) in zip(routes.seen, model.routed):
        assert a.shape == (4, 2) and torch.equal(a, b)


def test_bfloat16_forward_runs(folders, handles):
    h = dllm_local.load(str(folders["moe"]), device="cpu", dtype="bfloat16")
    ids = _ids(h, 10)
    with torch.no_grad():
        low, full = h.model(ids).logits, handles["moe"].model(ids).logits
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    assert (low.float() - full).abs().max() < 0.5


def _copy(folder: Path, tmp_path: Path, **changes) -> Path:
    out = tmp_path / "bad"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_a_config_whose_layers_differ_from_the_weights_is_refused(folders, tmp_path):
    with pytest.raises(ModelLoadError, match="layers|blocks"):
        dllm_local.load(str(_copy(folders["dense"], tmp_path, num_hidden_layers=3)), device="cpu", dtype="float32")


def test_sliding_window_attention_is_refused(folders, tmp_path):
    with pytest.raises(ModelLoadError, match="sliding"):
        dllm_local.load(str(_copy(folders["dense"], tmp_path, use_sliding_window=True)), device="cpu", dtype="float32")


def test_a_config_without_mask_id_or_block_size_reads_them_from_the_tokenizer_and_the_default(folders, tmp_path):
    """As SDAR's first uploads: the mask is the tokenizer's <|MASK|>, the block SDAR's 4."""
    h = dllm_local.load(str(_copy(folders["dense"], tmp_path, mask_token_id=None, block_size=None)),
                        device="cpu", dtype="float32")
    assert h.mask_id == h.tokenizer.convert_tokens_to_ids("<|MASK|>") and h.block_size == 4


# ------------------------------------------------------------------ decoding parity
def _engine_has_block_cache() -> bool:
    from dllm_local.policies import registry

    return "block" in registry.CACHE


engine = pytest.mark.skipif(not _engine_has_block_cache(), reason="the block cache (engine: block diffusion) is not in")
PROMPTS = ["What is 12 + 7?", "Add 3 and 4.", "Hi", "Name a colour."]


def _prompt(h) -> tuple[list[dict], list[int]]:
    """A chat prompt whose ids end inside a block."""
    from dllm_local.prompts import encode_prompt

    for text in PROMPTS:
        messages = [{"role": "user", "content": text}]
        ids = encode_prompt(h, messages)
        if len(ids) % h.block_size:
            return messages, ids
    raise AssertionError("every prompt ends on a block boundary")


@engine
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("unmask", ["fixed", "threshold"])
def test_decoding_equals_sdars_generate(kind, unmask, handles, folders):
    from dllm_local.decoding.sampler import generate
    from dllm_local.settings import Settings

    h, G, B = handles[kind], 16, 4
    messages, prompt = _prompt(h)
    params = {"threshold": 0.85} if unmask == "threshold" else {}
    ours = generate(h, messages, Settings(gen_length=G, block_size=B, unmask=unmask, unmask_params=params,
                                          cache="block", temperature=0.0))
    model = ref.load(folders[kind])
    strategy = "low_confidence_dynamic" if unmask == "threshold" else "low_confidence_static"
    x = ref.generate(model, prompt, h.mask_id, G, B, B, strategy, 0.85)
    print(f"sdar {kind} {unmask}: {model.denoising_forwards} denoising, {model.store_forwards} store forwards")
    assert list(ours.token_ids) == x[0, len(prompt):].tolist()
    assert ours.stats.nfe == model.denoising_forwards
    # The released loop stores the last block too, a forward whose K/V nothing reads; the engine
    # stores a finished block as the next one starts, so it skips that one.
    assert ours.stats.store_forwards == model.store_forwards - 1
    full = generate(h, messages, Settings(gen_length=G, block_size=B, unmask=unmask, unmask_params=params,
                                          cache="none", temperature=0.0))
    assert list(full.token_ids) == list(ours.token_ids)


@engine
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("unmask", ["fixed", "threshold"])
def test_an_answer_the_block_does_not_divide_equals_sdars_generate(kind, unmask, handles, folders):
    """block_diffusion_generate takes any gen_length: ceil((prompt + gen) / block) blocks at
    absolute positions, the first partly prompt. With absolute blocks (a block model's default on
    the command line) the engine takes the same lengths and decodes the same tokens with the same
    forwards."""
    from dllm_local.decoding.sampler import generate
    from dllm_local.settings import Settings

    h, G, B = handles[kind], 18, 4
    messages, prompt = _prompt(h)
    assert G % B and len(prompt) % B  # the answer is no whole number of blocks and starts inside one
    params = {"threshold": 0.85} if unmask == "threshold" else {}
    ours = generate(h, messages, Settings(gen_length=G, block_size=B, unmask=unmask, unmask_params=params,
                                          cache="block", temperature=0.0, absolute_blocks=True))
    model = ref.load(folders[kind])
    strategy = "low_confidence_dynamic" if unmask == "threshold" else "low_confidence_static"
    x = ref.generate(model, prompt, h.mask_id, G, B, B, strategy, 0.85)
    assert x.shape[1] == -(-(len(prompt) + G) // B) * B
    assert list(ours.token_ids) == x[0, len(prompt):].tolist()
    assert (ours.stats.nfe, ours.stats.store_forwards) == (model.denoising_forwards, model.store_forwards - 1)
