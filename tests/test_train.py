"""Training the tiny models: block-suffix noising, the loss, and determinism by seed."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.tiny_checkpoints.train import BLOCK_SIZES, Stage, diffusion_loss, masking_times, train


def _answers(prompt_lengths: list[int], width: int) -> torch.Tensor:
    answer = torch.zeros(len(prompt_lengths), width, dtype=torch.bool)
    for row, start in enumerate(prompt_lengths):
        answer[row, start:] = True
    return answer


def test_block_suffix_rows_are_clean_then_one_noised_block_then_fully_masked():
    starts = [5, 9, 12, 20] * 16
    answer = _answers(starts, 20 + 256)
    times = masking_times(answer, torch.Generator().manual_seed(0), block_suffix_share=1.0)
    currents = set()
    for row, start in enumerate(starts):
        assert torch.all(times[row, :start] == 0)  # the prompt is never masked
        region = times[row, start:]
        assert torch.all(region[1:] >= region[:-1])  # clean, then the current block, then masked
        noised = ((region > 0) & (region < 1)).nonzero().flatten()
        assert len(noised) > 0 and torch.all(region[noised] == region[noised[0]])  # one t for the block
        first, last = noised[0].item(), noised[-1].item()
        assert any(first % s == 0 and last + 1 == min(first + s, len(region)) for s in BLOCK_SIZES)
        assert torch.all(region[last + 1:] == 1) and torch.all(region[:first] == 0)
        currents.add(first)
    assert len(currents) > 4  # the current block varies: later blocks are seen as finished ones


def test_independent_rows_use_one_masking_time_for_the_whole_answer():
    starts = [7, 11] * 8
    answer = _answers(starts, 11 + 64)
    times = masking_times(answer, torch.Generator().manual_seed(1), block_suffix_share=0.0)
    for row, start in enumerate(starts):
        region = times[row, start:]
        assert torch.all(times[row, :start] == 0) and torch.all(region == region[0]) and 0 < region[0] <= 1


def test_the_loss_counts_masked_answer_positions_weighted_by_one_over_t():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    ids = torch.randint(10, 100, (4, 40))
    answer = _answers([8, 8, 12, 12], 40)
    seen = {}

    class Recording(torch.nn.Module):
        def forward(self, noisy):
            seen["noisy"] = noisy
            logits = torch.zeros(*noisy.shape, 128)
            return type("Out", (), {"logits": logits})()

    gen = torch.Generator().manual_seed(2)
    loss = diffusion_loss(Recording(), ids, answer, tokenizer.mask_token_id, gen, 0.5)
    # Uniform logits: each masked position costs log(128), weighted 1/t, over the answer tokens.
    replay = torch.Generator().manual_seed(2)
    times = masking_times(answer, replay, 0.5)
    masked = torch.rand(ids.shape, generator=replay) < times
    assert torch.equal(seen["noisy"] == tokenizer.mask_token_id, masked) and not masked[~answer].any()
    expected = (torch.log(torch.tensor(128.0)) / times[masked]).sum() / answer.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def _train(tmp_path, kind: str, name: str, seed: int):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    stage = Stage("test", 2, 1e-3, 1, {32: 0.5, 64: 0.5}, 0.5)
    return train(kind, tmp_path / name, seed, 512, tokenizer, stages=(stage,), guider_steps=2, quiet=True)


@pytest.mark.parametrize("kind", ["diffusion", "guider"])
def test_training_is_deterministic_by_seed(tmp_path, kind):
    runs = [_train(tmp_path, kind, name, seed) for name, seed in (("a", 3), ("b", 3), ("c", 4))]
    weights = [(folder / "model.safetensors").read_bytes() for folder in runs]
    assert weights[0] == weights[1] != weights[2]


def test_the_model_folder_states_its_longest_length_and_keeps_a_loss_log(tmp_path):
    first = _train(tmp_path, "diffusion", "a", 3)
    assert json.loads((first / "config.json").read_text())["trained_gen_length"] == 64
    log = [json.loads(line) for line in (first / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [0, 1] and all(row["loss"] > 0 for row in log)
