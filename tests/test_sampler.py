"""The sampler: fast paths against the plain full-recompute path, policies, trace, settings."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dllm_local
from dllm_local import Settings, SettingsError
from dllm_local.prompts import encode_prompt
from dllm_local.tiny.tasks import make_problems as problems

PROMPT = problems("arithmetic", 1, 7)[0].prompt


def tokens(handle, settings, prompt=PROMPT, guider=None):
    return dllm_local.generate(handle, prompt, settings, guider).token_ids


def llada_generate(model, prompt, steps, gen_length, block_length, mask_id):
    """LLaDA's generate.py (temperature 0, low-confidence remasking), written out plainly."""
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        start = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, start : start + block_length] == mask_id
        mask_num = block_mask_index.sum(dim=1, keepdim=True)
        base, remainder = mask_num // steps, mask_num % steps
        num_transfer = torch.zeros(1, steps, dtype=torch.int64) + base
        num_transfer[0, : remainder[0]] += 1
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x).logits
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, start + block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            _, select = torch.topk(confidence[0], k=int(num_transfer[0, i]))
            transfer[0, select] = True
            x[transfer] = x0[transfer]
    return x[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("gen_length,block_size,steps", [(32, 32, 32), (64, 16, 32)])
@torch.no_grad()
def test_none_fixed_equals_plain_llada_generate(tiny, gen_length, block_size, steps):
    prompt = torch.tensor([encode_prompt(tiny, PROMPT)])
    expected = llada_generate(tiny.model, prompt, steps, gen_length, block_size, tiny.mask_id)
    got = tokens(tiny, Settings(gen_length=gen_length, block_size=block_size, steps=steps, cache="none", unmask="fixed"))
    assert got == expected
    assert tiny.mask_id not in got


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_equals_none(tiny, cache):
    base = Settings(gen_length=64, block_size=32, unmask="threshold", unmask_params={"threshold": 0.7})
    expected = tokens(tiny, base)
    got = tokens(tiny, base.with_(cache=cache, cache_params={"refresh_every": 1}))
    assert got == expected


def test_threshold_one_commits_the_most_confident_and_only_certain_others(tiny):
    # As both released generators compare (Fast-dLLM, Flash-dLLM): p >= 1 passes where float64 rounds to 1.
    base = Settings(gen_length=64, block_size=32, cache="dual")
    run = dllm_local.generate(tiny, PROMPT, base.with_(unmask="threshold", unmask_params={"threshold": 1.0}))
    for s in run.trace.steps:
        ranked = sorted((c for _, _, c in s.committed), reverse=True)
        assert all(c == 1.0 for c in ranked[1:])
    if all(len(s.committed) == 1 for s in run.trace.steps):  # nothing certain: one token per step, as fixed
        assert run.token_ids == tokens(tiny, base.with_(unmask="fixed"))


def test_threshold_commits_several_tokens_per_forward(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=64, block_size=32, unmask="threshold"))
    assert r.stats.nfe < 64 and max(len(s.committed) for s in r.trace.steps) > 1
    for s in r.trace.steps:
        # Everything committed is >= tau, or it is the single most confident position.
        if len(s.committed) > 1:
            assert min(c for _, _, c in s.committed) >= 0.9


def test_factor_rule_matches_its_definition(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=64, block_size=32, unmask="factor", unmask_params={"factor": 1.0}))
    assert r.stats.nfe < 64 and max(len(s.committed) for s in r.trace.steps) > 1
    for s in r.trace.steps:
        conf = sorted((c for _, _, c in s.committed), reverse=True)
        n = len(conf)
        if n > 1:
            assert (n + 1) * (1 - conf[-1]) < 1.0 + 1e-6


def test_adaptive_limits_equal_dual_and_none(tiny):
    base = Settings(gen_length=64, block_size=32, unmask="threshold", unmask_params={"threshold": 0.7})
    dual = dllm_local.generate(tiny, PROMPT, base.with_(cache="dual"))
    as_dual = dllm_local.generate(tiny, PROMPT, base.with_(cache="adaptive", cache_params={"floor": 0.0}))
    assert as_dual.token_ids == dual.token_ids
    assert [s.g for s in as_dual.trace.steps] == [s.g for s in dual.trace.steps]
    as_none = dllm_local.generate(tiny, PROMPT, base.with_(cache="adaptive", cache_params={"floor": 1.0}))
    assert as_none.token_ids == tokens(tiny, base)
    assert all(s.reads == 0 for s in as_none.trace.steps)


def test_adaptive_budget_caps_cached_positions_and_evicts_k_and_v_together(tiny):
    budget = 40
    settings = Settings(gen_length=64, block_size=32, cache="adaptive", unmask="threshold",
                        cache_params={"budget": budget, "floor": 0.3})
    run = dllm_local.stream(tiny, PROMPT, settings)
    evicted_seen = False
    for _ in run:
        cache = run.cache
        assert cache.num_cached() <= budget
        dropped = (~cache.valid[: cache.seq_len]).nonzero().flatten()
        if dropped.numel():
            evicted_seen = True
            for k, v in zip(cache.k, cache.v):
                assert k[:, :, dropped].abs().sum() == 0 and v[:, :, dropped].abs().sum() == 0
    assert evicted_seen and run.result.trace.steps[-1].policy["evicted"] > 0


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "freecache", "adaptive"])
@pytest.mark.parametrize("unmask", ["fixed", "threshold", "factor", "self_verify"])
def test_every_cache_combines_with_every_unmasking_policy(tiny, cache, unmask):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache=cache, unmask=unmask))
    assert tiny.mask_id not in r.token_ids
    assert sum(len(s.committed) for s in r.trace.steps) == 32
    assert "The answer is" in r.text


def test_dual_cache_reads_more_than_it_recomputes(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=128, block_size=32, cache="dual", unmask="fixed"))
    refreshes = [s for s in r.trace.steps if s.full_refresh]
    assert len(refreshes) == 4  # one per block
    assert all(s.g == 32 for s in r.trace.steps if not s.full_refresh)
    assert r.stats.cache_hit_rate > 0.5


def test_freecache_window_shrinks_and_never_refreshes(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=128, block_size=32, cache="freecache", unmask="threshold"))
    assert sum(s.full_refresh for s in r.trace.steps) == 1
    by_block = {}
    for s in r.trace.steps[1:]:
        if s.step_in_block > 0:
            by_block.setdefault(s.block, set()).add(s.g)
    assert max(by_block[0]) == 128
    assert all(max(g) <= (4 - b) * 32 for b, g in by_block.items())  # the window shrinks
    entering = [s for s in r.trace.steps if s.step_in_block == 0 and s.block > 0]
    assert all(s.g == (4 - s.block) * 32 + 32 for s in entering)  # window + the block just finished


def test_same_seed_same_tokens_with_sampling(tiny):
    s = Settings(gen_length=32, block_size=32, temperature=1.0, seed=5, unmask="threshold")
    assert tokens(tiny, s) == tokens(tiny, s)
    poker = problems("poker", 1, 3)[0].prompt  # three valid answers: the seed picks one
    outputs = {tuple(tokens(tiny, s.with_(seed=k), poker)) for k in range(8)}
    assert len(outputs) > 1


def test_trace_json_round_trips_exactly(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="dual", trace="full", exact_drift=True))
    text = r.trace.to_json()
    again = dllm_local.Trace.from_json(text)
    assert again == r.trace and again.to_json() == text
    with pytest.raises(ValueError, match="its schema_version is 99; this build reads version 1"):
        dllm_local.Trace.from_dict({**r.trace.to_dict(), "schema_version": 99})


def test_exact_drift_diagnostic(tiny):
    none = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, trace="full", exact_drift=True))
    for s in none.trace.steps:  # the full recompute is exact: no error, cosines of 1
        assert s.exact["max_prob_error"] < 1e-5
        assert min(min(v["k"]) for v in s.exact["cache_vs_exact"].values()) > 0.99999
    dual = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="dual", unmask="threshold",
                                                      trace="full", exact_drift=True))
    assert dual.stats.exact_forwards == len(dual.trace.steps)
    assert max(s.exact["max_prob_error"] for s in dual.trace.steps) > 1e-4
    assert dual.stats.exact_s > 0 and all(s.exact_ms > 0 for s in dual.trace.steps)


def test_trace_records_kv_cosines_and_confidences(tiny):
    r = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="dual", trace="full"))
    first, second = r.trace.steps[0], r.trace.steps[1]
    assert first.kv["0"]["k"][0] is None  # nothing cached before the first forward
    assert len(second.kv["0"]["k"]) == len(second.recomputed) == second.g
    assert all(0 <= c <= 1 for c in second.masked_confidence)
    assert set(p for p, _, _ in second.committed) <= set(second.masked_positions)
    summary = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="dual"))
    assert set(summary.trace.steps[1].kv["0"]) == {"k_mean", "k_min", "v_mean", "v_min"}


def test_stop_ends_the_run_between_steps(tiny):
    run = dllm_local.stream(tiny, PROMPT, Settings(gen_length=64, block_size=32))
    seen = 0
    for _ in run:
        seen += 1
        if seen == 3:
            run.stop()
    assert seen == 3 and run.result.stats.stopped


def test_early_stop_fills_the_tail_with_eos(tiny):
    base = Settings(gen_length=128, block_size=32, unmask="threshold")
    full = dllm_local.generate(tiny, PROMPT, base)
    early = dllm_local.generate(tiny, PROMPT, base.with_(early_stop=True))
    assert early.text == full.text and early.stats.nfe < full.stats.nfe


def test_multi_turn_messages_use_the_chat_template(tiny):
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": PROMPT}]
    ids = encode_prompt(tiny, messages)
    text = tiny.tokenizer.decode(ids)
    assert text.count("<|start_header_id|>") == 4 and text.endswith("assistant<|end_header_id|>\n\n")
    assert "The answer is" in dllm_local.generate(tiny, messages, Settings(gen_length=32, block_size=32)).text


@pytest.mark.parametrize("kwargs,knob", [
    ({"gen_length": 64, "block_size": 24}, "block_size"),
    ({"unmask": "threshold", "unmask_params": {"threshold": 0.0}}, "threshold"),
    ({"unmask": "threshold", "unmask_params": {"threshold": 1.5}}, "threshold"),
    ({"gen_length": 64, "block_size": 16, "steps": 3}, "steps"),
    ({"cache": "warp"}, "cache policy"),
    ({"unmask": "self_verify", "unmask_params": {"rho": -1}}, "rho"),
    ({"cache": "dual", "cache_params": {"refresh": 2}}, "refresh"),
])
def test_bad_settings_name_the_knob(kwargs, knob):
    with pytest.raises(SettingsError, match=knob):
        Settings(**kwargs)


def test_bad_inputs_at_run_time(tiny, tmp_path):
    with pytest.raises(SettingsError, match="prompt is empty"):
        dllm_local.generate(tiny, "   ", Settings())
    with pytest.raises(dllm_local.SequenceTooLongError, match="gen_length 1024"):
        dllm_local.generate(tiny, PROMPT, Settings(gen_length=1024, block_size=32))
    with pytest.raises(SettingsError, match="needs a guider"):
        dllm_local.generate(tiny, PROMPT, Settings(unmask="guided"))


def test_guider_with_a_different_tokenizer_is_refused(tiny, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    other = dllm_local.load_guider(str(tmp_path))
    with pytest.raises(SettingsError, match="tokenizer differs"):
        dllm_local.generate(tiny, PROMPT, Settings(unmask="guided"), other)


def test_dream_family_decodes_through_the_same_cache_mechanism(dream_dir):
    dream = dllm_local.load(str(dream_dir))
    base = Settings(gen_length=16, block_size=8, unmask="threshold", unmask_params={"threshold": 0.5})
    plain = dllm_local.generate(dream, "hi", base)
    refreshed = dllm_local.generate(dream, "hi", base.with_(cache="dual", cache_params={"refresh_every": 1}))
    assert refreshed.token_ids == plain.token_ids and dream.mask_id not in plain.token_ids
    dual = dllm_local.generate(dream, "hi", base.with_(cache="dual", trace="full"))
    # Dream's shift: the block's first position needs the hidden state before it, recomputed too.
    for step in dual.trace.steps:
        assert len(step.recomputed) == step.g == len(step.kv["0"]["k"])
        if not step.full_refresh:
            start = len(dual.trace.prompt_ids) + step.block * 8
            assert step.g == 9 and step.recomputed[0] == start - 1
    free = dllm_local.generate(dream, "hi", base.with_(cache="freecache", trace="full"))
    assert dream.mask_id not in free.token_ids
    second_block = [s for s in free.trace.steps if s.block == 1]
    start = len(free.trace.prompt_ids) + 8
    # Entering block 1 recomputes the finished block 0 once (its last commits), then freezes it.
    assert second_block[0].recomputed[0] == start - 8 - 1 and all(s.recomputed[0] == start - 1 for s in second_block[1:])


# ---------------------------------------------------------------- phenomena on the trained tiny model

def _invalid_rate(handle, problems, settings, guider=None) -> float:
    from dllm_local.tiny.tasks import score

    return sum(not score(ex, dllm_local.generate(handle, ex.prompt, settings.for_problem(i), guider).text)
               for i, ex in enumerate(problems)) / len(problems)


def test_parallel_commits_write_invalid_pairs_and_self_verify_sends_them_back(tiny):
    poker = problems("poker", 30, 77)
    # Greedy: the hands are full house 0.42, straight flush 0.29, straight 0.29, so the first word's
    # argmax is "straight" (0.58) and the second's "house" (0.42): one forward writes "straight house".
    base = Settings(gen_length=32, block_size=32)
    one_at_a_time = _invalid_rate(tiny, poker, base.with_(unmask="fixed"))
    parallel = _invalid_rate(tiny, poker, base.with_(unmask="threshold", unmask_params={"threshold": 0.1}))
    verified = _invalid_rate(tiny, poker, base.with_(unmask="self_verify", unmask_params={"threshold": 0.1}))
    assert one_at_a_time == 0
    assert parallel >= 0.8, "threshold 0.1 should commit both argmaxes in one forward ('straight house')"
    assert verified <= 1 / 30
    run = dllm_local.generate(tiny, poker[0].prompt, base.with_(unmask="self_verify", trace="full",
                                                                unmask_params={"threshold": 0.1}))
    checked = [s for s in run.trace.steps if s.policy.get("verified")]
    assert checked and all(s.forwards == 2 and s.kv for s in checked)


def test_guided_keeps_accuracy_with_fewer_forwards(tiny, tiny_guider):
    from dllm_local.tiny.tasks import score

    arithmetic = problems("arithmetic", 50, 303)
    base = Settings(gen_length=32, block_size=32)

    def run(settings, guider=None):
        results = [dllm_local.generate(tiny, ex.prompt, settings, guider) for ex in arithmetic]
        return sum(score(ex, r.text) for ex, r in zip(arithmetic, results)) / len(arithmetic), sum(r.stats.nfe for r in results)

    acc_one, nfe_one = run(base)
    acc_guided, nfe_guided = run(base.with_(unmask="guided"), tiny_guider)
    assert acc_guided >= acc_one - 0.02
    assert nfe_guided < nfe_one


@torch.no_grad()
def test_guider_cache_reuse_matches_a_fresh_guider_forward(tiny, tiny_guider):
    from dllm_local.decoding.sampler import Run

    run = Run(tiny, PROMPT, Settings(gen_length=32, block_size=32, unmask="guided"), tiny_guider)
    state = run.start()
    guided = run.unmask_policy
    guided.start_block(state)
    P = len(run.prompt_ids)
    seq = torch.tensor(run.prompt_ids + list(range(100, 132)))
    first = torch.arange(P, P + 20)
    guided.guider_logits(run.calls, seq, first)
    seq2 = seq.clone()
    seq2[P + 5 :] += 1  # the first five answer tokens stay: their guider K/V are reused
    later = torch.arange(P + 5, P + 25)
    got = guided.guider_logits(run.calls, seq2, later)
    fresh = tiny_guider.model(seq2[None, : P + 25]).logits[0, later - 1]
    torch.testing.assert_close(got, fresh, atol=1e-4, rtol=1e-4)
    assert guided._past.get_seq_length() == P + 24


@pytest.mark.parametrize("cache", ["dual", "adaptive"])
def test_summary_drift_is_the_mean_and_min_of_the_full_levels_cosines(tiny, cache):
    settings = Settings(gen_length=64, block_size=16, cache=cache, unmask="threshold")
    summary = dllm_local.generate(tiny, "Give two numbers whose sum is 9.", settings)
    full = dllm_local.generate(tiny, "Give two numbers whose sum is 9.", settings.with_(trace="full"))
    assert summary.token_ids == full.token_ids
    replaced_somewhere = False
    for step_s, step_f in zip(summary.trace.steps, full.trace.steps):
        for layer, numbers in step_s.kv.items():
            for which in "kv":
                cosines = [c for c in step_f.kv[layer][which] if c is not None]
                replaced_somewhere |= bool(cosines)
                want = (sum(cosines) / len(cosines), min(cosines)) if cosines else (None, None)
                got = (numbers[f"{which}_mean"], numbers[f"{which}_min"])
                assert (got[0] is None) == (want[0] is None)
                if cosines:
                    assert got == pytest.approx(want, abs=2e-5)
    assert replaced_somewhere and summary.trace.steps[0].kv["0"]["k_mean"] is None  # step 0 replaces nothing


@pytest.mark.parametrize("temperature", [1e-6, 1.0, 400.0, 1e308])
@pytest.mark.parametrize("unmask", ["fixed", "threshold"])
def test_any_finite_temperature_decodes_to_real_tokens(tiny, temperature, unmask):
    """LLaDA's noise, exp(logits) / (-log u)^T, is 0/0 from about T = 400: the draft was then a
    banned id and decoding never ended. Every finite temperature decodes, reproducibly."""
    s = Settings(gen_length=32, block_size=16, temperature=temperature, seed=3, unmask=unmask)
    prompt = problems("arithmetic", 1, 1000)[0].prompt
    first, again = dllm_local.generate(tiny, prompt, s), dllm_local.generate(tiny, prompt, s)
    assert first.token_ids == again.token_ids
    assert tiny.mask_id not in first.token_ids and max(first.token_ids) < len(tiny.tokenizer)
    assert first.stats.nfe <= 32


def test_at_a_tiny_temperature_the_noise_leaves_the_greedy_draft(tiny):
    logits = torch.tensor([[2.0, 1.0, -1.0], [0.0, 3.0, 1.0]])
    rng = torch.Generator().manual_seed(0)
    assert dllm_local.softmax.draft_tokens(logits, 1e-6, rng).tolist() == [0, 1]
    # At an enormous temperature the logits no longer matter: the noise alone picks, and never a banned id.
    banned = torch.tensor([[0.0, float("-inf"), 0.0]] * 200)
    picks = dllm_local.softmax.draft_tokens(banned, 1e308, torch.Generator().manual_seed(1))
    assert 1 not in picks.tolist() and set(picks.tolist()) == {0, 2}


def test_threshold_rule_at_one_passes_only_what_float64_rounds_to_one():
    from dllm_local.policies.unmask import _threshold_mask

    conf = torch.tensor([1.0, 1 - 1e-12, 0.9999996, 0.5], dtype=torch.float64)
    assert _threshold_mask(conf, 1.0).tolist() == [True, False, False, False]
    assert _threshold_mask(conf, 0.9).tolist() == [True, True, True, False]
