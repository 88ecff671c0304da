"""The shipped tiny models and their task suite."""
from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import dllm_local
from dllm_local import Settings
from dllm_local.models.loading.loader import TINY_GUIDER, TINY_MODEL
from dllm_local.tiny.tasks import TASKS, make_problems, score, training_mix

QUICK = 30  # held-out problems per task in the guard below
# (task, settings, floor): what the shipped checkpoint scores on held-out problems, minus a margin
# for a 30-problem sample, so that a broken or swapped checkpoint fails (the shipped model scores
# 93.0% / 100% / 100% / 100% on 200 / 100 / 100 / 100 problems; see docs/tiny-models.md,
# "Quality").
GUARDS = [
    ("arithmetic", Settings(gen_length=64, block_size=64), 0.85),
    ("poker", Settings(gen_length=32, block_size=32), 0.95),
    ("sums", Settings(gen_length=32, block_size=32), 0.9),
    ("records", Settings(gen_length=64, block_size=64), 0.9),
]


def test_shipped_files_are_in_the_real_formats_and_small():
    cfg = json.loads((TINY_MODEL / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["architectures"] == ["LLaDAModelLM"]
    assert (TINY_MODEL / "model.safetensors").stat().st_size <= 20 * 2**20
    assert (TINY_GUIDER / "model.safetensors").stat().st_size <= 10 * 2**20
    tok_cfg = json.loads((TINY_MODEL / "tokenizer_config.json").read_text())
    assert tok_cfg.get("mask_token") == "<|mdm_mask|>"


def test_shipped_models_load(tiny, tiny_guider):
    assert tiny.family == "llada" and tiny.mask_id == tiny.tokenizer.mask_token_id
    assert tiny.tokenizer.convert_tokens_to_ids("<|eot_id|>") in tiny.stop_ids
    guider = AutoModelForCausalLM.from_pretrained(TINY_GUIDER)
    assert guider.config.model_type == "llama"
    assert tiny_guider.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()


def test_tokenizer_round_trips_and_splits_digits():
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    for ex in make_problems("records", 5, 3) + make_problems("arithmetic", 5, 3):
        for text in (ex.prompt, ex.answer):
            assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    pieces = tok.tokenize(" 1234 apples")
    assert [p.strip("Ġ") for p in pieces[:4]] == ["1", "2", "3", "4"]
    assert "Ġapples" in pieces  # whole words stay whole


def test_task_generators_are_deterministic_and_scored():
    for task in TASKS:
        a, b = make_problems(task, 20, 11), make_problems(task, 20, 11)
        assert a == b and a != make_problems(task, 20, 12)
        assert all(score(ex, ex.answer) for ex in a)
    assert training_mix(50, 1) == training_mix(50, 1)
    poker = make_problems("poker", 1, 0)[0]
    assert score(poker, "full house") and score(poker, "straight") and not score(poker, "straight house")
    sums = make_problems("sums", 1, 0)[0]
    total = sums.meta["total"]
    assert score(sums, f"1 + {total - 1} = {total}")
    assert not score(sums, f"0 + {total} = {total}") and not score(sums, f"1 + {total} = {total + 1}")
    assert not score(sums, f"1 and {total - 1}")


@pytest.mark.parametrize("task,settings,bar", GUARDS, ids=[g[0] for g in GUARDS])
def test_quick_held_out_eval_stays_above_the_bar(tiny, task, settings, bar):
    problems = make_problems(task, QUICK, 2024)
    correct = sum(score(ex, dllm_local.generate(tiny, ex.prompt, settings).text) for ex in problems)
    assert correct / QUICK >= bar, f"{task}: {correct}/{QUICK}"


def test_answers_end_cleanly_under_parallel_decoding_at_every_length(tiny):
    # DualCache + threshold 0.9 decodes the blocks after the answer fully masked, the state that
    # wrote stray tokens after the end of text before block-suffix training; 512 is the longest
    # answer region the model was trained on.
    problems = make_problems("arithmetic", 8, 5)
    clean = correct = 0
    for length in (64, 128, 256, 512):
        settings = Settings(gen_length=length, block_size=32, cache="dual", unmask="threshold",
                            unmask_params={"threshold": 0.9})
        for ex in problems:
            r = dllm_local.generate(tiny, ex.prompt, settings)
            tail = r.token_ids[r.stats.content_tokens:]
            clean += bool(tail) and all(t in tiny.stop_ids for t in tail)
            correct += score(ex, r.text)
    runs = 4 * len(problems)
    assert clean >= runs - 1 and correct >= 0.8 * runs, f"clean {clean}/{runs}, correct {correct}/{runs}"
    assert tiny.trained_length == 512
