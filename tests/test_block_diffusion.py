"""Block diffusion in the one decoding loop, on the tiny checkpoints of the released formats:
blocks at absolute positions, the block cache exact against full recompute, store forwards
counted apart, the policies that apply and the ones refused, and the CLI on every family."""
from __future__ import annotations

import json

import pytest
import torch

import dllm_local
from dllm_local import Settings, SettingsError
from dllm_local.cli import main as cli_main
from dllm_local.hub import TINY_FAMILIES
from dllm_local.prompts import encode_prompt
from dllm_local.decoding.batch import generate_batch
from dllm_local.decoding.sampler import generate
from dllm_local.trace import Trace

PROMPT = "What is 12 + 7?"  # 17 tokens on tiny-sdar: it ends inside a block


@pytest.fixture(scope="module")
def sdar():
    return dllm_local.load("tiny-sdar", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def llada2():
    return dllm_local.load("tiny-llada2", device="cpu", dtype="float32")


def test_blocks_sit_at_absolute_positions_and_the_answer_runs_to_its_last_block(sdar):
    P = len(encode_prompt(sdar, PROMPT))
    assert P % 4, "the prompt must end inside a block for this test"
    result = generate(sdar, PROMPT, Settings(gen_length=8, block_size=4, cache="block"))
    trace = result.trace
    end = -(-(P + 8) // 4) * 4
    assert trace.blocks_from == P - P % 4 and trace.gen_length == end - P == len(result.token_ids)
    assert trace.steps[0].block == 0 and trace.steps[0].stored == [0, P - P % 4]  # the prompt's whole blocks
    stored = [s.stored for s in trace.steps if s.stored]
    assert stored[1:] == [[b, b + 4] for b in range(P - P % 4, end - 4, 4)]  # each finished block, but the last
    assert result.stats.store_forwards == len(stored)
    # A block's commits stay inside it: the first block holds the prompt's tail and its first answers.
    for step in trace.steps:
        start = trace.blocks_from + 4 * step.block
        assert all(start <= p < start + 4 and p >= P for p, _, _ in step.committed)


@pytest.mark.parametrize("unmask, params", [("fixed", {}), ("threshold", {"threshold": 0.6}), ("factor", {}),
                                            ("revise", {}), ("edit", {}), ("flash_verify", {"threshold": 0.6})])
def test_the_block_cache_is_exact(sdar, unmask, params):
    """Every unmasking policy decodes a block-diffusion model over the block cache with the
    tokens of full recompute under the block-causal mask; the exact-drift diagnostic (a full
    recompute beside each step) finds the stored entries equal and the drafts' probabilities
    unchanged to float32 rounding."""
    base = dict(gen_length=16, block_size=4, unmask=unmask, unmask_params=params)
    full = generate(sdar, PROMPT, Settings(**base, cache="none"))
    cached = generate(sdar, PROMPT, Settings(**base, cache="block", exact_drift=True))
    assert cached.token_ids == full.token_ids
    assert cached.stats.nfe <= full.stats.nfe + (unmask == "flash_verify")  # the same steps (verify: its own forwards)
    for step in cached.trace.steps:
        assert step.exact["max_prob_error"] <= 1e-5
        for layer in step.exact["cache_vs_exact"].values():
            held = layer["k"][: cached.trace.blocks_from + 4 * step.block]
            assert held and None not in held and min(held) >= 1 - 1e-5  # every stored entry, exact
            assert all(c is None for c in layer["k"][cached.trace.blocks_from + 4 * (step.block + 1):])  # not held yet


@pytest.mark.parametrize("block_sizes", [(8, 8, 8), (8, 16, 8)])
def test_a_batch_decodes_each_request_at_its_own_block_size_as_alone(sdar, block_sizes):
    """A batch's packed forward attends each request under its own run's layout: at block sizes other
    than the checkpoint's (4), all one or each its own, every request gives the tokens, denoising
    forwards and store forwards it gives alone."""
    assert sdar.model.block_size == 4
    prompts = [PROMPT, "Deal a poker hand and name it.", "hi"]
    settings = [Settings(gen_length=16, block_size=b, cache="block", unmask="threshold", seed=i)
                for i, b in enumerate(block_sizes)]
    batch = generate_batch(sdar, prompts, settings, share_budget=False)
    alone = [generate(sdar, p, s) for p, s in zip(prompts, settings)]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    assert [(r.stats.nfe, r.stats.store_forwards) for r in batch] == [(r.stats.nfe, r.stats.store_forwards) for r in alone]


@torch.inference_mode()
def test_full_recompute_logits_equal_the_cached_ones(llada2):
    """A cached forward of the current block over the stored blocks gives the logits of a full
    forward under the block-causal mask (float32, ~1e-5)."""
    from dllm_local.models.attention import BlockCausal

    ids = torch.tensor([encode_prompt(llada2, PROMPT) + [llada2.mask_id] * 40])
    n, B = ids.shape[1], 32
    full = llada2.model(ids, layout=BlockCausal(B)).logits[0]
    cache = llada2.model.new_cache(1, n).alloc(n)
    start = (n - 1) // B * B
    llada2.model(ids[:, :start], torch.arange(start), cache, layout=BlockCausal(B))  # the stored blocks
    block = torch.arange(start, n)
    cached = llada2.model(ids[:, start:], block, cache, layout=BlockCausal(B)).logits[0]
    assert (cached - full[start:]).abs().max() <= 1e-5 * max(1.0, float(full.abs().max()))


def test_cache_policies_that_make_no_sense_for_a_kind_are_refused(sdar):
    with pytest.raises(SettingsError, match="block-diffusion model.*--cache block"):
        generate(sdar, PROMPT, Settings(gen_length=8, block_size=4, cache="dual"))
    tiny = dllm_local.load("tiny")
    with pytest.raises(SettingsError, match="exact only under block-causal attention"):
        generate(tiny, PROMPT, Settings(gen_length=8, block_size=4, cache="block"))
    fast = dllm_local.load("tiny-fast-dllm-v2", device="cpu", dtype="float32")
    with pytest.raises(SettingsError, match="repeats positions"):  # its head reads the position before
        generate(fast, PROMPT, Settings(gen_length=32, block_size=32, cache="block", unmask="flash_verify"))


def test_the_trace_of_a_block_run_round_trips_and_a_masked_run_reads_as_before(llada2):
    result = generate(llada2, PROMPT, Settings(gen_length=32, block_size=32, cache="block", unmask="edit",
                                               trace="full"))
    data = json.loads(result.trace.to_json())
    assert data["blocks_from"] == result.trace.blocks_from and data["stats"]["store_forwards"] >= 1
    assert any("experts" in s for s in data["steps"]) and any("stored" in s for s in data["steps"])
    assert Trace.from_dict(data).to_dict() == data
    plain = generate(dllm_local.load("tiny"), PROMPT, Settings(gen_length=8, block_size=4)).trace.to_dict()
    assert "blocks_from" not in plain and not {"stored", "experts", "edited"} & set(plain["steps"][0])


def test_routed_experts_are_the_ones_the_router_chose(llada2):
    result = generate(llada2, PROMPT, Settings(gen_length=32, block_size=32, cache="block"))
    total, routed = llada2.experts
    for step in result.trace.steps:
        for layer, experts in step.experts.items():
            assert routed <= len(experts) <= total and experts == sorted(set(experts))


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_every_family_decodes_on_the_cli_with_json(capsys, name):
    assert cli_main(["generate", "--model", name, "--prompt", PROMPT, "--gen-length", "32", "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    info = trace["model"]
    assert info["kind"] == ("masked" if name == "tiny-llada-moe" else "block")
    if info["kind"] == "block":  # the model's own block and its exact cache, unless told otherwise
        assert trace["settings"]["block_size"] == info["block_size"] and trace["settings"]["cache"] == "block"
        assert trace["stats"]["store_forwards"] >= 1
    assert ("experts" in info) == (name in ("tiny-sdar-moe", "tiny-llada2", "tiny-llada-moe"))
    assert trace["final_ids"] and trace["stats"]["nfe"] >= 1


def test_bench_on_a_block_model_runs_the_block_set_at_its_own_block(capsys):
    """`bench` on a block-diffusion model: its exact block cache with each unmasking policy (and the
    full recompute it is read against), whatever set was asked for, each row a real run."""
    assert cli_main(["bench", "--model", "tiny-sdar", "--n", "1", "--repeats", "1", "--gen-length", "8", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "block-diffusion model: the block set" in err
    rows = [line.split("  ")[0] for line in out.splitlines() if line.startswith(("none +", "block +"))]
    assert rows[0].startswith("none + fixed") and "block + edit 0.7 0.5" in rows and len(rows) >= 6


@pytest.mark.parametrize("command, extra", [("eval", ["--n", "1", "--json"]),
                                            ("sweep", ["--n", "1", "--thresholds", "0.9"])])
def test_eval_and_sweep_take_a_block_models_block_and_cache_before_it_loads(capsys, command, extra):
    """eval and sweep make their settings before the model loads: from its config alone they take a
    block model's own block and its exact cache when the flags leave them unset."""
    assert cli_main([command, "--model", "tiny-sdar", "--gen-length", "8", "--quiet", *extra]) == 0
    out = capsys.readouterr().out
    if command == "eval":
        settings = json.loads(out)["settings"]
        assert (settings["block_size"], settings["cache"]) == (4, "block")
    else:
        rows = [line.split() for line in out.splitlines() if line.strip().startswith("0.9")]
        assert [row[1] for row in rows] == ["4"] and "block + threshold" in out  # its block alone, its cache
        assert cli_main(["sweep", "--model", "tiny", "--gen-length", "32", "--block-sizes", "32", "--quiet", *extra]) == 0
        assert "dual + threshold" in capsys.readouterr().out  # a masked model's sweep: the dual cache, as before
    assert cli_main(["eval", "--model", "tiny-sdar", "--gen-length", "8", "--quiet", "--n", "1", "--json",
                     "--block-size", "8", "--cache", "none"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["block_size"], settings["cache"]) == (8, "none")  # given flags stand


def test_a_block_model_takes_any_length_on_every_front_end(capsys, sdar):
    """Blocks at absolute positions take an answer the block does not divide (SDAR's release does,
    tests/test_sdar.py checks the tokens): eval and sweep (their settings made from the config
    alone), a batch (each request as alone) and the page, which rounds only a masked model's length."""
    from ui.run.controls import controls_from_settings, settings_from_controls

    for command, extra in (("eval", ["--n", "1", "--json"]), ("sweep", ["--n", "1", "--thresholds", "0.9"])):
        assert cli_main([command, "--model", "tiny-sdar", "--gen-length", "18", "--quiet", *extra]) == 0
        out = capsys.readouterr().out
        if command == "eval":
            assert json.loads(out)["settings"]["absolute_blocks"] is True
    settings = [Settings(gen_length=18, block_size=4, cache="block", absolute_blocks=True, seed=i) for i in range(2)]
    prompts = [PROMPT, "hi"]
    batch = generate_batch(sdar, prompts, settings, share_budget=False)
    alone = [generate(sdar, p, s) for p, s in zip(prompts, settings)]
    assert [(r.token_ids, r.stats.nfe) for r in batch] == [(r.token_ids, r.stats.nfe) for r in alone]
    controls = controls_from_settings({"gen_length": 18, "block_size": 4, "cache": "block"})
    chosen, notice = settings_from_controls(controls, model={"kind": "block", "block_size": 4})
    assert (chosen["gen_length"], chosen["absolute_blocks"], notice) == (18, True, "")
    assert Settings.from_dict(chosen).gen_length == 18
    masked, notice = settings_from_controls({**controls, "cache": "none"}, model={"kind": "masked"})
    assert masked["gen_length"] == 20 and "adjusted from 18 to 20" in notice and "absolute_blocks" not in masked


def test_absolute_blocks_are_a_block_models_alone(sdar):
    """Without absolute blocks the masked rule holds (a block must divide the answer), and a masked
    model refuses them: its blocks start at the answer."""
    with pytest.raises(SettingsError, match="block_size 4 does not divide gen_length 18"):
        Settings(gen_length=18, block_size=4)
    assert Settings(gen_length=16, block_size=4).to_dict() == Settings.from_dict(
        Settings(gen_length=16, block_size=4).to_dict()).to_dict()
    assert "absolute_blocks" not in Settings().to_dict()  # earlier settings and traces read as before
    tiny = dllm_local.load("tiny", device="cpu", dtype="float32")
    with pytest.raises(SettingsError, match="whose blocks start at the answer"):
        generate(tiny, PROMPT, Settings(gen_length=18, block_size=4, absolute_blocks=True))
    # steps are checked against the answer's 4 blocks; the prompt's tail makes the run's 5: each gets a step
    run = generate(sdar, PROMPT, Settings(gen_length=16, block_size=4, steps=4, cache="block"))
    assert len(run.token_ids) == 19 and run.stats.nfe == 5
