"""Decoding always ends: drafts are real tokens (never the mask id, never a padded embedding row),
and a run that stops committing ends with a clear message within a hard bound."""
from __future__ import annotations

import pytest
import torch

import dllm_local
from dllm_local import Settings
from dllm_local.errors import DecodingError
from dllm_local.policies import registry
from dllm_local.policies.unmask import Selection, UnmaskPolicy
from dllm_local.prompts import encode_prompt

PROMPT = "Give two numbers whose sum is 9."


def _output_rows(handle) -> torch.Tensor:
    return handle.model.get_output_embeddings().weight


@pytest.fixture()
def tiny_copy():
    """A private copy of the tiny model whose output rows a test may change."""
    return dllm_local.load("tiny", device="cpu")


@torch.no_grad()
def test_a_mask_on_top_is_never_drafted_and_the_run_finishes(tiny_copy):
    h = tiny_copy
    rows = _output_rows(h)
    rows[h.mask_id] = 4 * rows[h.eos_id]  # wherever EOS is likely, the mask is likelier
    settings = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold", trace="off")
    ids = torch.tensor([encode_prompt(h, PROMPT) + [h.mask_id] * 64])
    assert (h.model(ids).logits[0].argmax(-1) == h.mask_id).any()  # the case that used to loop forever
    boosted = dllm_local.generate(h, PROMPT, settings)
    assert h.mask_id not in boosted.token_ids and boosted.stats.nfe <= 64 + 2

    # The same run with the mask logit removed by hand gives the same tokens.
    def drop_mask(module, args, out):
        out[..., h.mask_id] = float("-inf")
        return out

    hook = h.model.get_output_embeddings().register_forward_hook(drop_mask)
    try:
        by_hand = dllm_local.generate(h, PROMPT, settings)
    finally:
        hook.remove()
    assert by_hand.token_ids == boosted.token_ids


@torch.no_grad()
def test_padded_embedding_rows_are_never_drawn(tiny_copy):
    h = tiny_copy
    rows = _output_rows(h)
    padded = range(len(h.tokenizer), rows.shape[0])
    assert len(padded) > 0  # the tiny model pads its embedding, as LLaDA and Dream do
    for i in padded:
        rows[i] = 3 * rows[h.eos_id]
    ids = torch.tensor([encode_prompt(h, PROMPT) + [h.mask_id] * 64])
    probs = h.model(ids).logits[0, -64:].softmax(-1)
    assert probs[:, len(h.tokenizer):].sum(-1).mean() > 0.5  # unbanned, they would be drawn often
    drawn = []
    for seed in range(16):  # 16 x 64 = 1,024 draws at temperature 1, all of a run's in one forward
        settings = Settings(gen_length=64, block_size=64, temperature=1.0, seed=seed, unmask="threshold",
                            unmask_params={"threshold": 1e-9}, trace="off")
        drawn += dllm_local.generate(h, PROMPT, settings).token_ids
    assert len(drawn) == 1024 and max(drawn) < len(h.tokenizer)
    assert all(h.tokenizer.decode([t]) is not None for t in set(drawn))


class _NeverCommits(UnmaskPolicy):
    def select(self, state, cand, calls):
        return Selection(cand.positions[:0])


def test_a_policy_that_stops_committing_ends_with_a_clear_message(tiny):
    registry.register(registry.PolicySpec("unmask", "never", "Never", "Commits nothing (test).", _NeverCommits))
    try:
        with pytest.raises(DecodingError, match=r"did not finish within 34 forwards \(gen_length \+ blocks\)"):
            dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, unmask="never", trace="off"))
    finally:
        registry.unregister("unmask", "never")


def test_steps_beyond_gen_length_are_refused():
    with pytest.raises(dllm_local.SettingsError, match="steps"):
        Settings(gen_length=32, block_size=16, steps=64)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_dream_cache_refreshed_every_step_equals_no_cache(dream_dir, cache):
    dream = dllm_local.load(str(dream_dir))
    base = Settings(gen_length=32, block_size=16, unmask="threshold", unmask_params={"threshold": 0.5}, trace="off")
    plain = dllm_local.generate(dream, "hi", base)
    refreshed = dllm_local.generate(dream, "hi", base.with_(cache=cache, cache_params={"refresh_every": 1}))
    assert refreshed.token_ids == plain.token_ids
