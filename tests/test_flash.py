"""Flash-dLLM as released (cache ``flash``, unmasking ``flash_verify``): the verify query's
arithmetic, the sliding window's rules read back from real traces, and the knobs' messages.
Token identity with the released generator is ``test_flash_parity.py``'s."""
from __future__ import annotations

import pytest
import torch

import dllm_local
from dllm_local import Settings, SettingsError
from dllm_local.errors import SequenceTooLongError
from dllm_local.policies.flash_dllm import _verify_visibility
from dllm_local.prompts import encode_prompt
from dllm_local.tiny.tasks import make_problems

RELEASED = dict(gen_length=64, block_size=16, cache="flash", unmask="flash_verify", trace="full")
PROMPTS = [p.prompt for task in ("arithmetic", "poker", "records") for p in make_problems(task, 2, 0)]


@pytest.fixture(scope="module")
def traces(tiny):
    return [dllm_local.generate(tiny, prompt, Settings(**RELEASED)) for prompt in PROMPTS]


@torch.inference_mode()
def test_verify_query_reads_the_cache_where_it_does_not_compute(tiny):
    """A fork with ``visible`` reads the cache at every position but its own rows: over an exact
    cache, tracked rows and a mask copy that cannot see the draft give the full forward's logits."""
    model = tiny.model
    ids = encode_prompt(tiny, PROMPTS[0])
    x = torch.tensor([ids + [tiny.mask_id] * 24])
    L, b = x.shape[1], len(ids) + 5
    everything = torch.arange(L)
    view = model.new_cache(1, L).alloc(L)
    full = model(x, everything, view, sequence=x).logits[0]  # fills the cache exactly
    tracked = torch.tensor([3, 7, len(ids) - 1, len(ids) + 2])
    draft = full[b].argmax()
    tokens = torch.cat([x[0, tracked], draft[None], torch.tensor([tiny.mask_id])])
    positions = torch.cat([tracked, torch.tensor([b, b])])
    visible = _verify_visibility(len(tracked), 1, x.device)
    logits = model(tokens[None], positions, view.fork(visible), sequence=x).logits[0]
    torch.testing.assert_close(logits[: len(tracked)], full[tracked], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[-1], full[b], atol=1e-5, rtol=1e-5)
    # Had the mask copy seen the draft, it would not be the full forward's.
    seen = torch.ones_like(visible)
    assert (model(tokens[None], positions, view.fork(seen), sequence=x).logits[0, -1] - full[b]).abs().max() > 1e-3
    assert bool(view.valid[:L].all())  # and nothing was written or dropped


def test_verify_visibility_is_the_released_mask():
    v = _verify_visibility(2, 3, torch.device("cpu")).int()
    # rows: tracked t0 t1, drafts d0 d1 d2, mask copies m0 m1 m2
    assert v.tolist() == [
        [1, 1, 0, 0, 0, 1, 1, 1],
        [1, 1, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 0, 0, 0, 1, 1],  # d0: itself, the mask copies after it
        [1, 1, 1, 1, 0, 0, 0, 1],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 1],  # m0: no draft, every mask copy from itself on
        [1, 1, 1, 0, 0, 0, 1, 1],  # m1: the draft ranked before it
        [1, 1, 1, 1, 0, 0, 0, 1],
    ]


def test_recomputing_everything_is_exact(tiny):
    r = dllm_local.generate(tiny, PROMPTS[2], Settings(**{**RELEASED, "unmask": "threshold"}, cache_params={"track_num": -1},
                                                      exact_drift=True))
    assert len(r.trace.steps) > 1
    assert all(s.exact["max_prob_error"] <= 1e-5 and s.full_refresh for s in r.trace.steps)


def _replay(trace):
    """Per step: the answer positions decoded before it, and the first end-of-text length so far."""
    P, n = trace.prompt_len, trace.gen_length
    decoded, length = set(range(P)), P + n
    for s in trace.steps:
        yield s, set(decoded), length
        decoded |= {c[0] for c in s.committed}
        ends = [c[0] for c in s.committed if c[1] == 1]  # the tiny model's end of text
        if ends and length == P + n:
            length = max(ends) + 1


def test_the_window_is_the_next_block_of_undecoded_answer_positions(traces):
    slid = 0
    for r in traces:
        P, n = r.trace.prompt_len, r.trace.gen_length
        for s, decoded, length in _replay(r.trace):
            undecoded = [p for p in range(P, P + n) if p not in decoded]
            assert sorted(s.policy["window"]) == undecoded[:16]
            assert all(P <= c[0] < length for c in s.committed)  # nothing past the first end of text
            slid += sorted(s.policy["window"]) != list(range(undecoded[0], undecoded[0] + 16))
    assert slid  # somewhere the window is not a contiguous block


def test_first_end_of_text_ends_the_answer(traces):
    for r in traces:
        P = r.trace.prompt_len
        *_, (last, decoded, length) = _replay(r.trace)
        decoded |= {c[0] for c in last.committed}
        ends = [c[0] for c in last.committed if c[1] == 1]
        length = max(ends) + 1 if ends and length == P + r.trace.gen_length else length
        assert all(p in decoded for p in range(P, length))  # decoding ran until then, and stopped
        assert all(t == 1 for t in r.token_ids[length - P:])


def test_tracked_are_the_newest_commits_then_other_decoded_positions(traces):
    for r in traces:
        previous = set()
        for s, decoded, _ in _replay(r.trace):
            tracked = set(s.policy["tracked"])
            if s.step == 0:
                assert s.full_refresh and not tracked
            else:
                assert tracked <= decoded and len(tracked) == min(4 * 16, len(decoded))
                assert previous <= tracked  # the last step's accepted drafts are the newest
            previous = {a[0] for a in s.policy["accepted_at"]} if s.policy["verify_accepted"] else set()


def test_verify_accepts_a_prefix_whose_product_stays_over_gamma(traces):
    accepted = 0
    for r in traces:
        assert r.stats.nfe == sum(s.forwards for s in r.trace.steps)
        for s in r.trace.steps:
            assert s.forwards == 1 + (s.policy["verify_candidates"] > 0)
            assert s.policy["verify_candidates"] <= 8
            probs = [a[2] for a in s.policy["accepted_at"]]
            assert len(probs) == s.policy["verify_accepted"] and torch.tensor(probs).prod() >= 0.8 - 1e-6
            assert {a[0] for a in s.policy["accepted_at"]} <= {c[0] for c in s.committed}
            accepted += len(probs)
    assert accepted  # verification really added commits on these prompts


def test_same_seed_same_tokens(tiny):
    settings = Settings(**{**RELEASED, "temperature": 0.8, "seed": 5})
    assert dllm_local.generate(tiny, PROMPTS[1], settings).token_ids == dllm_local.generate(tiny, PROMPTS[1], settings).token_ids


@pytest.mark.parametrize("kind, params, knob", [
    ("cache", {"track_num": -2}, "track_num"), ("cache", {"mask_num": 0}, "mask_num"), ("cache", {"pad_to": 4096}, "pad_to"),
    ("unmask", {"gamma": 0}, "gamma"), ("unmask", {"gamma": 1.5}, "gamma"), ("unmask", {"threshold": 0}, "threshold"),
])
def test_bad_values_name_the_knob(kind, params, knob):
    with pytest.raises(SettingsError, match=knob):
        Settings(**{**RELEASED, f"{kind}_params": params})


def test_the_padded_span_counts_against_the_models_length(tiny):
    room = tiny.max_length - len(encode_prompt(tiny, PROMPTS[0]))  # the answer fills the model's length
    fits = {**RELEASED, "gen_length": room, "block_size": room}
    dllm_local.stream(tiny, PROMPTS[0], Settings(**fits, cache_params={"pad_to": 0}))
    with pytest.raises(SequenceTooLongError, match="end-of-text positions"):
        dllm_local.stream(tiny, PROMPTS[0], Settings(**fits))


@pytest.mark.parametrize("unmask", ["fixed", "self_verify", "revise"])
def test_block_by_block_unmasking_is_refused_with_the_sliding_window(unmask):
    with pytest.raises(SettingsError, match=f"{unmask} unmasking policy decodes block by block.*use threshold"):
        Settings(**{**RELEASED, "unmask": unmask})


def test_early_stop_is_refused_with_its_own_end_of_text_rule():
    with pytest.raises(SettingsError, match="early_stop"):
        Settings(**RELEASED, early_stop=True)


def test_flash_verify_needs_a_position_wise_model(dream_dir):
    dream = dllm_local.load(str(dream_dir), device="cpu")
    with pytest.raises(SettingsError, match="repeats positions"):
        dllm_local.stream(dream, "hi", Settings(**{**RELEASED, "cache": "dual"}))
    assert dllm_local.generate(dream, "hi", Settings(**{**RELEASED, "unmask": "threshold", "gen_length": 16})).trace.steps
