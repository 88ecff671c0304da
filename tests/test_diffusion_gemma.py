"""DiffusionGemma through transformers' own classes: a tiny random checkpoint that the tests write
with transformers' ``save_pretrained``, loaded by the project's loader and decoded one pass at a
time, gives the tokens and the number of denoising passes of transformers' ``model.generate`` at
the same seed and settings."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dllm_local import Settings, SettingsError
from dllm_local.cli import main as cli_main
from dllm_local.errors import ModelLoadError
from dllm_local.models.loading.loader import load
from dllm_local.prompts import encode_prompt
from dllm_local.decoding.sampler import generate
from dllm_local.serving.engine import Engine
from dllm_local.tiny_checkpoints.random_diffusion_gemma import build_checkpoint
from dllm_local.trace import Trace, fold

PROMPT = "Tom has 3 apples. He gets 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("diffusion-gemma"), init_seed=7)


@pytest.fixture(scope="module")
def handle(checkpoint):
    return load(str(checkpoint))


def reference(handle, settings: Settings) -> tuple[list[int], int]:
    """transformers' own ``generate`` at the settings' seed: the new tokens and its decoder passes."""
    model = handle.model
    passes = []
    hook = model.model.decoder.register_forward_hook(lambda *_: passes.append(1))
    params = dict(settings.canvas_params)
    if "entropy_bound" in params:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

        params["sampler_config"] = EntropyBoundSamplerConfig(params.pop("entropy_bound"))
    model.config.canvas_length = params.pop("canvas_length", handle.canvas_length)
    ids = torch.tensor([encode_prompt(handle, PROMPT)])
    try:
        torch.manual_seed(settings.seed)
        out = model.generate(ids, max_new_tokens=settings.gen_length, **params)
    finally:
        hook.remove()
    return out.sequences[0, ids.shape[1]:].tolist(), len(passes)


CASES = [
    dict(gen_length=16, seed=0),
    dict(gen_length=48, seed=1),  # three canvases
    dict(gen_length=40, seed=2),  # ends inside a canvas: whole canvases all the same
    dict(gen_length=32, seed=3, canvas_params={"confidence_threshold": 2.0}),  # the stopping rule ends canvases
    dict(gen_length=32, seed=4, canvas_params={"entropy_bound": 1.5, "t_max": 1.2, "t_min": 0.1,
                                               "max_denoising_steps": 20, "stability_threshold": 2,
                                               "confidence_threshold": 1.0}),
    dict(gen_length=24, seed=5, canvas_params={"canvas_length": 8, "max_denoising_steps": 12}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: json.dumps(c, sort_keys=True))
def test_the_answer_and_the_passes_are_transformers_generate_s(handle, case):
    settings = Settings(block_size=8, trace="full", **case)
    result = generate(handle, PROMPT, settings)
    tokens, passes = reference(handle, settings)
    trace = result.trace
    assert trace.final_ids[:len(tokens)] == tokens and result.stats.nfe == passes == len(trace.steps)
    assert all(t == handle.mask_id for t in trace.final_ids[len(tokens):])  # canvases never started: pad
    canvas = settings.canvas_params.get("canvas_length", 16)
    assert trace.gen_length == len(trace.final_ids) == -(-settings.gen_length // canvas) * canvas
    # One step record per decoder pass; the encoder's passes apart, one per canvas.
    canvases = sorted({s.block for s in trace.steps})
    assert result.stats.encoder_forwards == len(canvases) == sum(s.canvas["encoder"] is not None for s in trace.steps)
    # The answer is each canvas's last draft, pad after the first end token.
    drafts = [t for c in canvases for t in [s for s in trace.steps if s.block == c][-1].canvas["draft"]]
    end = next((i for i, t in enumerate(drafts) if t in handle.stop_ids), len(drafts))
    assert tokens == drafts[:end + 1] + [handle.mask_id] * (len(tokens) - end - 1)


def test_stopping_rule_state_is_what_ended_each_canvas(handle):
    settings = Settings(gen_length=48, block_size=8, seed=3, canvas_params={"confidence_threshold": 2.0})
    steps = generate(handle, PROMPT, settings).trace.steps
    early = [s for s in steps if s.canvas["finished"]]
    assert early, "a threshold of 2 nats should end some canvas early"
    for s in early:
        assert s.canvas["stable"] and s.canvas["confident"] and s.canvas["mean_entropy"] < 2.0
        assert s is [t for t in steps if t.block == s.block][-1]
    assert any(s.step_in_block < 47 for s in early)  # before the last of its 48 steps
    for s in steps:
        c = s.canvas
        assert not c["finished"] or (c["stable"] and c["confident"])
        assert len(c["accepted"]) == len(c["sampled"]) >= 1  # the lowest-entropy token always fits the bound
        low = sorted(c["entropy"])[:len(c["accepted"])]  # the sampler keeps the lowest entropies
        assert sorted(c["entropy"][p - c["start"]] for p in c["accepted"]) == pytest.approx(low, abs=1e-4)
        assert sum(low) - max(low) <= c["entropy_bound"] + 1e-4
        assert set(map(int, c["experts"])) == {0, 1} and all(len(e) <= 8 for e in c["experts"].values())


def test_the_temperature_schedule_falls_from_t_max_to_t_min(handle):
    steps = generate(handle, PROMPT, Settings(gen_length=16, block_size=16, canvas_params={"max_denoising_steps": 10}))
    temperatures = [s.canvas["temperature"] for s in steps.trace.steps]
    assert temperatures[0] == pytest.approx(0.8) and temperatures[-1] == pytest.approx(0.4 + 0.4 / 10)
    assert temperatures == sorted(temperatures, reverse=True)


def test_every_end_token_the_generation_config_names_ends_the_answer(checkpoint, tmp_path):
    """A token the model draws mid-canvas, made an end token: transformers stops after that canvas
    and pads what follows; ours keeps the same, pads included, and the text stops before it."""
    first = generate(load(str(checkpoint)), PROMPT, Settings(gen_length=48, block_size=8, seed=1)).trace
    end = first.final_ids[5]
    folder = tmp_path / "ends"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = [*config["eos_token_id"], end]
    (folder / "generation_config.json").write_text(json.dumps(config))
    handle = load(str(folder))
    assert end in handle.stop_ids
    settings = Settings(gen_length=48, block_size=8, seed=1)
    result = generate(handle, PROMPT, settings)
    tokens, passes = reference(handle, settings)
    cut = result.trace.final_ids.index(end)
    assert result.trace.final_ids[:len(tokens)] == tokens and result.stats.nfe == passes
    assert cut <= 5 and len(tokens) < 48  # it ended in an earlier canvas
    assert all(t == handle.mask_id for t in result.trace.final_ids[cut + 1:])
    assert result.text == handle.tokenizer.decode(result.trace.final_ids[:cut], skip_special_tokens=True)


def test_the_same_seed_gives_the_same_tokens_and_another_seed_others(handle):
    runs = [generate(handle, PROMPT, Settings(gen_length=32, block_size=8, seed=s)).trace.final_ids for s in (9, 9, 10)]
    assert runs[0] == runs[1] != runs[2]


def test_a_canvas_trace_round_trips_through_the_schema(handle):
    for level in ("summary", "full"):
        trace = generate(handle, PROMPT, Settings(gen_length=32, block_size=8, trace=level)).trace
        text = trace.to_json()
        assert Trace.from_json(text).to_json() == text
        kv = trace.steps[1].kv["0"]
        if level == "full":  # the encoder's entries: exact by construction, stored as nothing; past the canvas, nothing yet
            start = trace.steps[1].canvas["start"]
            assert kv["k"][:start] == [None] * start and kv["k"][start + 16:] == [None] * (32 - 16)
            assert all(c is not None for c in kv["k"][start:start + 16])
            assert trace.steps[0].kv["0"]["k"][start:start + 16] == [None] * 16  # nothing before a first pass
        else:
            assert set(kv) == {"k_mean", "k_min", "v_mean", "v_min"}
    bad = json.loads(text)
    bad["steps"][0]["canvas"]["accepted"] = [-1]
    with pytest.raises(Exception, match="accepted"):
        Trace.from_json(json.dumps(bad))


def test_masked_diffusion_settings_are_refused_with_one_message(handle):
    with pytest.raises(SettingsError, match="cache 'dual'.*unmask 'threshold'.*canvas_params"):
        generate(handle, PROMPT, Settings(cache="dual", unmask="threshold"))
    with pytest.raises(SettingsError, match="t_max"):
        Settings(canvas_params={"t_max": 0.3, "t_min": 0.5})
    with pytest.raises(SettingsError, match="t_max"):  # the checkpoint's t_max is 0.8
        generate(handle, PROMPT, Settings(canvas_params={"t_min": 0.9}))
    with pytest.raises(SettingsError, match="unknown knob"):
        Settings(canvas_params={"steps": 3})


def test_info_and_the_cli_json(checkpoint, handle, capsys):
    assert cli_main(["info", str(checkpoint)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["family"], info["kind"], info["experts"], info["active_experts"], info["canvas_length"]) == \
        ("diffusion_gemma", "canvas", 8, 2, 16)
    argv = ["generate", "--model", str(checkpoint), "--prompt", PROMPT, "--json", "--seed", "2", "--gen-length", "32",
            "--block-size", "8", "--entropy-bound", "0.5"]
    assert cli_main(argv) == 0
    trace = Trace.from_json(capsys.readouterr().out)
    settings = Settings(gen_length=32, block_size=8, seed=2, canvas_params={"entropy_bound": 0.5})
    tokens, passes = reference(handle, settings)
    assert trace.final_ids == tokens and trace.stats.nfe == passes and trace.settings["canvas_params"] == {"entropy_bound": 0.5}


def test_the_engine_streams_a_canvas_run_as_the_page_reads_it(checkpoint):
    import multiprocessing

    engine = Engine(multiprocessing.Event(), model=str(checkpoint), guider=None)
    events = []
    engine.run(PROMPT, Settings(gen_length=32, block_size=8, seed=4).to_dict(), events.append)
    trace = list(fold(events))[-1]["trace"]
    parsed = Trace.from_dict(trace)
    assert parsed.gen_length == 32 and len(parsed.steps) == parsed.stats.nfe and parsed.model["kind"] == "canvas"
    shown = {t for s in parsed.steps for t in s.canvas["draft"]}
    assert shown <= {int(i) for i in trace["vocab"]}  # every draft token's text came with its step


def test_the_loader_checks_a_canvas_checkpoint_as_any_other(checkpoint, tmp_path):
    folder = tmp_path / "other-sizes"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3
    config["text_config"]["layer_types"].append("full_attention")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="says 3 layers, the weights have 2"):
        load(str(folder))
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "diffusion_gemma_v9"}))
    with pytest.raises(ModelLoadError, match="unsupported model_type.*diffusion_gemma"):
        load(str(folder))


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_quantized_loads_say_what_transformers_quantized(checkpoint, bits):
    """transformers' bitsandbytes path leaves tied weights in full precision, and every text
    layer's weights are tied between encoder and decoder; the experts are fused 3-D tensors, which
    bitsandbytes does not take either. What it quantizes (the self-conditioning MLP, the vision
    tower) is told in the summary, with the memory."""
    pytest.importorskip("bitsandbytes")
    quantized, full = load(str(checkpoint), quantization=bits), load(str(checkpoint))
    summary = quantized.summary()
    assert quantized.quantization == bits and quantized.memory_bytes < full.memory_bytes
    decoder = quantized.model.model.decoder
    assert type(decoder.self_conditioning.gate_proj).__name__ in ("Linear8bitLt", "Linear4bit")
    assert type(decoder.layers[0].self_attn.q_proj).__name__ == "Linear"
    assert decoder.layers[0].experts.gate_up_proj.dtype == quantized.dtype  # not int8, not packed 4-bit
    assert 0 < summary["quantized_share"] < 0.5 and "model.decoder.self_conditioning" in summary["quantized_modules"]
    result = generate(quantized, PROMPT, Settings(gen_length=16, block_size=16, seed=1))
    assert result.stats.nfe == len(result.trace.steps) >= 1 and len(result.trace.final_ids) == 16


@pytest.mark.parametrize("argv", [["bench", "--n", "1"], ["sweep", "--n", "1"], ["eval", "--n", "2", "--batch-size", "2"]])
def test_masked_diffusion_tools_refuse_a_canvas_model_before_they_start(checkpoint, argv, capsys):
    assert cli_main([*argv, "--model", str(checkpoint), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "works on masked-diffusion models" in err and "canvas model (DiffusionGemma)" in err and "%" not in err


def test_in_bfloat16_the_trace_holds_the_entropies_the_sampler_used(checkpoint):
    """The sampler and the stopping rule read the float32 processed logits; the logits that
    condition the next step are cast to the model's dtype. The trace's entropies are the former:
    the kept ones meet the bound, and a canvas that ended was confident by the rule's own numbers."""
    handle = load(str(checkpoint), dtype="bfloat16")
    settings = Settings(gen_length=32, block_size=8, seed=3, canvas_params={"confidence_threshold": 2.0})
    result = generate(handle, PROMPT, settings)
    tokens, passes = reference(handle, settings)
    assert result.trace.final_ids[:len(tokens)] == tokens and result.stats.nfe == passes
    for step in result.trace.steps:
        c = step.canvas
        kept = [c["entropy"][p - c["start"]] for p in c["accepted"]]
        assert sum(kept) - max(kept) <= c["entropy_bound"] + 1e-5
        assert not c["finished"] or (c["confident"] and c["mean_entropy"] < 2.0)


def test_a_run_stopped_before_its_first_pass_answers_nothing(handle):
    from dllm_local.decoding.sampler import stream

    run = stream(handle, PROMPT, Settings(gen_length=32, block_size=8))
    run.stop()
    assert list(run) == []
    trace = run.result.trace
    assert trace.stats.stopped and trace.stats.nfe == 0 and trace.stats.tokens_per_forward == 0
    assert trace.final_ids == [handle.mask_id] * 32 and trace.text == ""
    assert handle.model.config.canvas_length == handle.canvas_length
