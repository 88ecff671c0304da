"""The cost model of a mixture of experts (DiffusionGemma): the experts a forward reads, checked
against the experts the real tiny model routed in real runs; the 26B-A4B layout and its memory per
precision against transformers' own DiffusionGemmaConfig; dense targets as before."""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import dllm_local
from dllm_local import Settings
from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import (DIFFUSIONGEMMA_26B_A4B_TEXT, TARGET_MODELS, Experts, TargetModel,
                                           concurrency_crossovers, concurrency_curve, project)
from dllm_local.models.loading.footprint import loaded_bytes, quantized_linears, stored_bytes, weight_read_bytes
from dllm_local.models.loading.loader import load

ROOT = Path(__file__).resolve().parents[1]
H100 = DEVICES["H100"]
GEMMA = TARGET_MODELS["DiffusionGemma-26B-A4B"]


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-diffusiongemma")


def _run(handle, canvas_length: int) -> dict:
    settings = Settings(gen_length=canvas_length, block_size=canvas_length, trace="summary", seed=1,
                        canvas_params={"canvas_length": canvas_length, "max_denoising_steps": 8})
    return dllm_local.generate(handle, "What is 2 plus 3?", settings).trace.to_dict()


def _tiny_target(handle) -> TargetModel:
    """The tiny model as the cost model sees one: its experts' bytes as loaded (fp32 here)."""
    text = handle.model.config.text_config
    experts = handle.model.model.decoder.layers[0].experts
    return TargetModel("tiny", 0.0, float(weight_read_bytes(handle.model)),
                       Experts(text.num_experts, text.top_k_experts, text.num_hidden_layers,
                               stored_bytes(experts) / text.num_experts))


@pytest.mark.parametrize("canvas_length", [1, 4, 32])
def test_the_experts_a_canvas_pass_reads_are_the_ones_the_cost_model_expects(tiny, canvas_length):
    trace = _run(tiny, canvas_length)
    experts, routed = trace["model"]["experts"], trace["model"]["active_experts"]
    counts = [len(ids) for step in trace["steps"] for ids in step["canvas"]["experts"].values()]
    assert counts and all(step["g"] == canvas_length for step in trace["steps"])
    # A pass of T tokens, each sent to k of E experts, reads from k to min(E, k x T) of them.
    assert all(routed <= n <= min(experts, routed * canvas_length) for n in counts)
    target = _tiny_target(tiny)
    expected = target.experts.distinct(canvas_length)
    assert routed <= expected <= min(experts, routed * canvas_length)
    observed = sum(counts) / len(counts)
    if canvas_length == 1:
        assert counts == [routed] * len(counts) and expected == pytest.approx(routed)
    # The routed experts' read, counted from the run, against the cost model's term.
    read_observed = target.experts.layers * observed * target.experts.bytes_each
    assert target.expert_read_bytes(canvas_length) == pytest.approx(read_observed, rel=0.15)
    if canvas_length == 32:  # a whole canvas: every expert, as the handle's weight read counts
        assert set(counts) == {experts} and expected > experts - 1e-3
        assert target.read_bytes(canvas_length) == pytest.approx(tiny.weight_read_bytes, rel=1e-4)


def test_a_canvas_models_forward_reads_its_text_weights_not_its_vision_tower(tiny):
    model = tiny.model
    vision = stored_bytes(model.model.encoder.vision_tower) + stored_bytes(model.model.encoder.embed_vision)
    assert vision > 0 and tiny.weight_read_bytes == stored_bytes(model) - vision
    # Encoder and decoder share the text weights: the decoder's, once, are all a pass reads.
    assert tiny.weight_read_bytes == stored_bytes(model.model.decoder)


def test_a_canvas_run_projected_counts_its_encoder_passes_and_the_experts(tiny):
    trace = _run(tiny, 32)
    stats = trace["stats"]
    rows = project(stats, len(trace["prompt_ids"]), trace["gen_length"], GEMMA, H100)
    run, _, ar = rows
    assert run["g"] == 32 and run["experts_read"] == pytest.approx(128 * (1 - (1 - 8 / 128) ** 32))
    assert ar["experts_read"] == pytest.approx(8) and ar["experts_total"] == 128
    # One canvas: the encoder read only the prompt (the prefill no row counts).
    assert stats["encoder_forwards"] == 1 and run["encoder_ms"] == 0.0
    two = project({**stats, "encoder_forwards": 3, "nfe": 10}, 20, 96, GEMMA, H100)[0]
    assert two["encoder_forwards"] == 2
    assert two["encoder_ms"] == pytest.approx(2 * GEMMA.floor_s(32, H100) * 1e3 / 10)
    assert two["tokens_per_s"] == pytest.approx(two["tau"] / (two["floor_ms"] + two["encoder_ms"]) * 1e3)


def test_dense_targets_are_unchanged():
    stats = {"mean_g": 32.0, "content_tokens_per_forward": 2.0, "content_tokens": 20, "nfe": 10}
    for name in ("LLaDA-8B-Instruct", "Dream-v0-Instruct-7B"):
        model = TARGET_MODELS[name]
        assert model.experts is None and model.read_bytes(1) == model.read_bytes(10**5) == model.weight_bytes
        for row in project(stats, 40, 256, model, H100):
            assert row["read_ms"] == pytest.approx(model.weight_bytes / H100.bandwidth * 1e3)
            assert row["floor_ms"] == max(row["read_ms"], row["compute_ms"]) and row["encoder_ms"] == 0.0
            assert row["experts_read"] is None


def _meta_26b():
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):
        return DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=DIFFUSIONGEMMA_26B_A4B_TEXT))


def test_the_26b_a4b_target_is_transformers_config_counted():
    model = _meta_26b()
    decoder = model.model.decoder
    layers = decoder.layers
    experts = sum(p.numel() for layer in layers for p in layer.experts.parameters())
    text = sum(p.numel() for p in decoder.parameters())
    e = GEMMA.experts
    assert (e.per_layer, e.routed, e.layers) == (128, 8, 30) == (
        model.config.text_config.num_experts, model.config.text_config.top_k_experts, len(layers))
    assert e.bytes_each == 2 * experts / (30 * 128)
    assert GEMMA.weight_bytes == 2 * text  # every text weight, the tied head reading the embedding
    assert GEMMA.params == text - experts + 30 * 8 * experts / (30 * 128)
    assert GEMMA.params == pytest.approx(3.84e9, rel=1e-3) and text == pytest.approx(25.25e9, rel=1e-3)
    # One token reads 8 experts a layer, a canvas of 256 tokens all 128 but 9e-6.
    assert GEMMA.read_bytes(1) == pytest.approx(2 * GEMMA.params)
    assert 128 - GEMMA.experts.distinct(256) == pytest.approx(8.5e-6, rel=0.05)


def test_memory_per_precision_from_the_config_and_what_quantization_covers():
    model = _meta_26b()
    everything = sum(p.numel() for p in model.parameters())
    bf16, int8, nf4 = (loaded_bytes(model, q) for q in (None, "8bit", "4bit"))
    assert bf16 == 2 * everything
    names = {id(m): name for name, m in model.named_modules()}
    covered = {names[id(m)].split(".")[2] for m in quantized_linears(model)}
    # Tied text layers are kept by transformers' quantizer, the experts are no nn.Linear.
    assert covered == {"vision_tower", "embed_vision", "self_conditioning"}
    small = sum(m.weight.numel() for m in quantized_linears(model))
    assert small < 0.01 * everything and nf4 < int8 < bf16 and bf16 - nf4 < 1.5 * small
    # The docs give these numbers.
    docs = (ROOT / "docs" / "performance.md").read_text()
    section = docs[docs.index("## DiffusionGemma (mixture of experts)"):]
    for value in (bf16, int8, nf4):
        assert f"{value / 1e9:.2f} GB" in section


def test_loaded_bytes_is_what_bitsandbytes_stores(tiny):
    pytest.importorskip("bitsandbytes")
    for quantization in ("4bit", "8bit"):
        handle = load("tiny-diffusiongemma", quantization=quantization)
        unquantized = next(p for p in handle.model.lm_head.parameters())
        assert stored_bytes(handle.model) == loaded_bytes(tiny.model, quantization, unquantized.element_size())
        assert {type(m).__name__ for m in handle.model.model.decoder.layers.modules()} >= {"Linear"}


def test_moe_concurrency_counts_the_experts_each_batch_reads():
    x = GEMMA.crossover_positions(H100)
    assert GEMMA.read_bytes(x) / H100.bandwidth == pytest.approx(x * 2 * GEMMA.params / H100.flops)
    # At τ = 4 a 256-token canvas reads every expert, one AR token 8: AR leads at one request,
    # diffusion from about 3 requests, AR again past the overtaking point.
    c = concurrency_crossovers(GEMMA, H100, 256, 4)
    assert 1 < c["ar_leads_until"] < c["diffusion_saturates"] < c["ar_overtakes"] < c["ar_saturates"]
    for b, ar_ahead in ((1, True), (c["ar_leads_until"] * 1.2, False), (c["ar_overtakes"] * 0.9, False),
                        (c["ar_overtakes"] * 1.1, True)):
        row = concurrency_curve(GEMMA, H100, 256, 4, [b])[0]
        assert (row["ar_tokens_per_s"] > row["diffusion_tokens_per_s"]) == ar_ahead, b
    # At the model card's τ (15-20 tokens per forward) diffusion leads from one request.
    assert concurrency_crossovers(GEMMA, H100, 256, 15)["ar_leads_until"] == 0.0


def test_gpu_check_builds_and_counts_a_diffusiongemma_on_the_cpu_at_tiny_sizes():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check
    from transformers import Gemma4VisionConfig

    from dllm_local.tiny_checkpoints.random_diffusion_gemma import TEXT_SIZES, VISION_SIZES

    args = gpu_check.parse_args(["--device", "cpu"])
    assert gpu_check.diffusiongemma_rows(args, torch.device("cpu"), H100) == []  # CUDA only
    text = {k: v for k, v in TEXT_SIZES.items() if k not in ("num_hidden_layers", "layer_types")}
    vision = Gemma4VisionConfig(**{k: v for k, v in VISION_SIZES.items() if k != "model_type"})
    with tempfile.TemporaryDirectory() as folder:
        gpu_check.write_diffusiongemma(Path(folder), gpu_check.diffusiongemma_config(2, {**text, "vocab_size": 708},
                                                                                     vision), torch.device("cpu"))
        handle = dllm_local.load(folder, device="cpu", quantization=None)
        row = gpu_check.diffusiongemma_row(handle, None, 2, H100)
    assert row["layers"] == 2 and row["G"] == 256 and row["pass_ms"] > 0
    assert row["counted_gb"] == pytest.approx(row["memory_gb"], rel=0.01)
    assert re.fullmatch(r"\d+ Linear", row["linears"])
