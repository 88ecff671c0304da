"""The tiny block-diffusion model's making (dllm_local/tiny_checkpoints/fine_tune_block.py): the tiny LLaDA carried into
LLaDA2's format computes the same function, the objective noises one block per row, and a
fine-tuned folder loads as a block-diffusion model and decodes."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import PreTrainedTokenizerFast

import dllm_local
from dllm_local.models.attention import BlockCausal
from dllm_local.models.llada import LLaDAModelLM
from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.tiny_checkpoints import random_llada2
from dllm_local.tiny_checkpoints.fine_tune_block import block_loss, carry, fine_tune


@pytest.fixture(scope="module")
def source() -> LLaDAModelLM:
    return LLaDAModelLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()


def test_the_carried_model_is_the_tiny_llada_under_block_causal_attention(source):
    carried = carry(source).eval()
    ids = torch.randint(0, source.config.vocab_size, (2, 75), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = source(ids, layout=BlockCausal(32)).logits
        got = carried(ids).logits
        bidirectional = source(ids).logits
    assert (got - want).abs().max().item() < 1e-5
    # The layout is what differs from the tiny LLaDA: the first blocks cannot see the later ones.
    assert (got[:, :64] - bidirectional[:, :64]).abs().max().item() > 1e-2


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


def test_a_fine_tuned_folder_loads_as_a_block_diffusion_model_in_llada2s_format(tmp_path):
    folder = fine_tune(tmp_path / "tiny-block", steps=2, seed=0, token_budget=512, quiet=True)
    raw = json.loads((folder / "config.json").read_text())
    assert set(random_llada2.RELEASED) <= set(raw) and raw["model_type"] == "llada2_moe" and raw["num_experts"] is None
    handle = dllm_local.load(str(folder), device="cpu")
    assert (handle.family, handle.kind, handle.block_size, handle.experts) == ("llada2_moe", "block", 32, None)
    assert handle.mask_id == PreTrainedTokenizerFast.from_pretrained(TINY_MODEL).mask_token_id
    result = dllm_local.generate(handle, "What is 2 + 3?", dllm_local.Settings.from_dict(
        {"gen_length": 32, "block_size": 32, "cache": "block", "seed": 0}))
    assert result.stats.nfe > 0 and len(result.trace.steps) == result.stats.nfe
