"""The released-Flash-dLLM reference (tests/flash_reference.py) checked on the tiny checkpoint:
its forward against the project's, and its generator against a plain full-recompute loop."""
from pathlib import Path

import pytest
import torch

from flash_reference import reference_forward, released_generate, verify_mask
from dllm_local.prompts import encode_prompt
from dllm_local.tiny.tasks import make_problems

WEIGHTS = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-llada"


def _prompt(tiny, task: str) -> list[int]:
    return encode_prompt(tiny, make_problems(task, 1, 0)[0].prompt)


def test_the_reference_forward_is_the_projects_plain_forward(tiny):
    ids = _prompt(tiny, "arithmetic")
    seq = ids + [tiny.mask_id] * 64 + [tiny.eos_id] * (128 - len(ids) - 64)
    t = torch.tensor([seq])
    with torch.no_grad():
        ours = tiny.model(t, torch.arange(len(seq)), None, sequence=t).logits[0].float()
    ref = reference_forward(WEIGHTS, seq)
    # both float32: they differ from a float64 forward by ~1.5e-5 on logits up to ~22, so 1e-5
    # holds relative to each logit (absolute max ~1.4e-5), not absolutely
    torch.testing.assert_close(ref, ours, rtol=1e-5, atol=1e-5)
    assert (ref - ours).abs().max().item() < 5e-5
    # positions are honoured: a permuted query gives the permuted logits
    perm = torch.randperm(len(seq), generator=torch.Generator().manual_seed(0))
    shuffled = reference_forward(WEIGHTS, torch.tensor(seq)[perm], perm)
    torch.testing.assert_close(shuffled, ref[perm], rtol=1e-5, atol=2e-5)


def _plain_loop(prompt, *, gen, block, threshold, mask_id, eos_id):
    """The released commit rule with every position below seqlen_k recomputed each step."""
    P = len(prompt)
    max_length = ((P + gen + block) // 128 + 1) * 128
    span = (P + gen) // 128 * 128 + 128
    x = list(prompt) + [mask_id] * gen + [eos_id] * (max_length - P - gen)
    order = list(range(P, max_length))  # undecoded positions, the window first
    limit, eos_seen, steps = P + gen, False, []
    while any(p < limit for p in order):
        window = order[:block]
        assert max(window) < span  # a window row beyond the span has no plain-forward twin
        probs = torch.softmax(reference_forward(WEIGHTS, x[:span])[window].double(), dim=-1)
        conf, tok = probs.max(dim=-1)
        if eos_seen:
            conf[torch.tensor(window) >= limit] = 0
        ranked = torch.sort(conf, descending=True, stable=True).indices.tolist()
        keep = max(int((conf >= threshold).sum()), 1)
        step = [(window[i], int(tok[i])) for i in ranked[:keep]]
        for pos, t in step:
            x[pos] = t
        if not eos_seen and any(t == eos_id for _, t in step):
            eos_seen, limit = True, max(p for p, t in step if t == eos_id) + 1
        order = [window[i] for i in ranked[keep:]] + order[block:]
        steps.append(step)
    return steps, x


@pytest.mark.parametrize("task,gen,block,threshold", [("records", 48, 8, 0.99), ("arithmetic", 32, 8, 0.999)])
def test_full_tracking_without_verify_is_the_plain_loop(tiny, task, gen, block, threshold):
    prompt = _prompt(tiny, task)
    want, x = _plain_loop(prompt, gen=gen, block=block, threshold=threshold, mask_id=tiny.mask_id, eos_id=tiny.eos_id)
    got = released_generate(WEIGHTS, prompt, gen_length=gen, block_length=block, threshold=threshold, track_num=-1,
                            verify=False, mask_id=tiny.mask_id, eos_id=tiny.eos_id)
    assert len(want) > 2  # several steps, so the window rule is exercised
    assert got["committed"] == want
    assert got["steps"] == len(want) and got["verify_forwards"] == 0
    assert got["tokens"] == x[len(prompt):got["seqlen_k"]]


def test_flash_verify_runs_and_keeps_the_released_short_history_quirk(tiny):
    prompt = _prompt(tiny, "poker")  # 19 tokens: with block 64 the first verify step has nd < T
    assert len(prompt) < 64
    r = released_generate(WEIGHTS, prompt, gen_length=64, block_length=64, threshold=0.9, gamma=0.8, verify=True,
                          mask_id=tiny.mask_id, eos_id=tiny.eos_id)
    assert r["short_history"] >= 1 and r["verify_kept"][0] == 0  # full_pos[nd - T: nd] is empty: nothing accepted
    assert r["verify_forwards"] == r["steps"] == len(r["committed"]) == len(r["verify_kept"])
    decoded = r["decoded"]
    assert len(decoded) == len(set(decoded)) and decoded == [p for step in r["committed"] for p, _ in step]
    P = len(prompt)
    assert all(p in set(decoded) for p in range(P, r["predicted_length"]))
    assert all(r["tokens"][p - P] == t for step in r["committed"] for p, t in step)


def test_verify_mask():
    m = verify_mask(4, 2).int().tolist()  # T = 4 tracked rows, drafts d0 d1, mask copies m0 m1
    assert m == [
        [1, 1, 1, 1, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 1],  # d0: tracked, itself, mask copies after it
        [1, 1, 1, 1, 1, 1, 0, 0],  # d1: tracked, d0 d1
        [1, 1, 1, 1, 0, 0, 1, 1],  # m0: tracked, mask copies from itself on
        [1, 1, 1, 1, 1, 0, 0, 1],  # m1: tracked, d0, itself
    ]
