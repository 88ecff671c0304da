"""The tiny block-diffusion model's making (dllm_local/tiny_checkpoints/fine_tune_block.py): the tiny LLaDA carried into
SDAR's format starts as the tiny model under block-causal attention (its tokens' rows carried, SDAR's new tokens as
the tiny tokens of the same role), the objective noises one block per row, a fine-tuned folder loads as an SDAR
block-diffusion model and decodes, and the shipped tiny-block answers."""
from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import PreTrainedTokenizerFast

import dllm_local
from dllm_local.models.attention import BlockCausal
from dllm_local.models.llada import LLaDAModelLM
from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.tiny.tasks import TASKS, make_problems, score
from dllm_local.tiny_checkpoints import random_sdar
from dllm_local.tiny_checkpoints.fine_tune_block import BLOCK, FINE_TUNE, SAME_ROLE, block_loss, carry, fine_tune
from dllm_local.tiny_checkpoints.train import diffusion_batch


@pytest.fixture(scope="module")
def source() -> LLaDAModelLM:
    return LLaDAModelLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()


def test_the_carried_model_starts_as_the_tiny_llada_under_block_causal_attention(source):
    tiny_tok, tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL), random_sdar.tokenizer()
    ids, _ = diffusion_batch(tiny_tok, random.Random(0), 0, 0, 2048, FINE_TUNE)
    carried = carry(source, tok, ids).eval()
    # SDAR's new tokens start as the tiny tokens of the same role, in the embedding and the head.
    for new, like in SAME_ROLE.items():
        a, b = tok.convert_tokens_to_ids(new), tiny_tok.convert_tokens_to_ids(like)
        assert torch.equal(carried.model.embed_tokens.weight[a], carried.model.embed_tokens.weight[b])
        assert torch.equal(carried.lm_head.weight[a], carried.lm_head.weight[b])
    held_out, _ = diffusion_batch(tiny_tok, random.Random(1), 1, 1, 2048, FINE_TUNE)
    with torch.no_grad():
        want = source(held_out, layout=BlockCausal(BLOCK)).logits[..., : len(tiny_tok)]
        got = carried(held_out).logits[..., : len(tiny_tok)]
    # Qwen3's query and key norms are the one change: most argmaxes agree (a weight carried to the
    # wrong place would leave next to none).
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.7


def test_the_objective_masks_answer_tokens_of_one_block_per_row_and_cuts_the_rows_after_it():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    mask = tokenizer.mask_token_id
    starts = [20, 40, 45, 70] * 8
    width = 160
    ids = torch.randint(10, 100, (len(starts), width), generator=torch.Generator().manual_seed(1))
    answer = torch.zeros_like(ids, dtype=torch.bool)
    for row, start in enumerate(starts):
        answer[row, start:] = True
    seen = {}

    class Recording(torch.nn.Module):
        def forward(self, noisy):
            seen["noisy"] = noisy
            return type("Out", (), {"logits": torch.zeros(*noisy.shape, 128)})()

    loss = block_loss(Recording(), ids, answer, mask, torch.Generator().manual_seed(2))
    noisy = seen["noisy"]
    assert noisy.shape[1] % 32 == 0 and noisy.shape[1] <= width  # cut at a block's end
    blocks_seen = set()
    for row, start in enumerate(starts):
        masked = (noisy[row] == mask).nonzero().flatten()
        if len(masked) == 0:
            continue
        block = {p // 32 for p in masked.tolist()}
        assert len(block) == 1 and masked.min() >= start  # one block, answer tokens only
        (b,) = block
        blocks_seen.add(b)
        assert torch.equal(noisy[row, : b * 32], ids[row, : b * 32])  # everything before it clean
    assert len(blocks_seen) > 2
    assert loss.item() > 0


def test_a_fine_tuned_folder_loads_as_an_sdar_block_diffusion_model(tmp_path):
    folder = fine_tune(tmp_path / "tiny-block", steps=2, seed=0, token_budget=512, quiet=True)
    raw = json.loads((folder / "config.json").read_text())
    assert set(random_sdar.DENSE) <= set(raw) and raw["model_type"] == "sdar" and raw["block_size"] == BLOCK
    assert raw["trained_tasks"] == list(TASKS)
    assert sorted(p.name for p in folder.glob("model*")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    handle = dllm_local.load(str(folder), device="cpu")
    assert (handle.family, handle.kind, handle.block_size) == ("sdar", "block", BLOCK)
    # The files load as the tokenizer it was trained with: the same ids for a task's text (Qwen2's
    # class would split each digit from the space before it).
    row = "<|im_start|>user\nWendy buys 7 bags with 8 apples each.<|im_end|>\n<|im_start|>assistant\n7 * 8 = 56.<|im_end|>"
    assert handle.tokenizer(row, add_special_tokens=False)["input_ids"] == random_sdar.tokenizer()(
        row, add_special_tokens=False)["input_ids"]
    assert handle.mask_id == random_sdar.tokenizer().convert_tokens_to_ids("<|MASK|>")
    result = dllm_local.generate(handle, "What is 2 + 3?", dllm_local.Settings.from_dict(
        {"gen_length": 32, "block_size": BLOCK, "cache": "block", "seed": 0}))
    assert result.stats.nfe > 0 and len(result.trace.steps) == result.stats.nfe


def test_the_shipped_tiny_block_answers_arithmetic():
    """A handful of held-out problems, one token per step: the model answers (the full figure,
    200 problems, is docs/tiny-models.md's)."""
    handle = dllm_local.load("tiny-block", device="cpu", dtype="float32")
    assert handle.trained_tasks == TASKS and handle.block_size == BLOCK
    problems = make_problems("arithmetic", 8, seed=1000)
    settings = dllm_local.Settings.from_dict({"gen_length": 64, "block_size": BLOCK, "cache": "block", "seed": 0})
    right = sum(score(p, dllm_local.generate(handle, p.prompt, settings).text) for p in problems)
    assert right >= 6, f"{right} of 8"
