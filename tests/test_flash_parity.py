"""Token identity with Flash-dLLM's released generator (VILA-Lab/Flash-dLLM ``llada/generate.py``):
``flash`` + ``threshold`` and ``flash`` + ``flash_verify`` against ``flash_reference.py``, a
plain-torch transcription of its arithmetic (its Triton kernels do not run on a CPU), on the
shipped tiny LLaDA at temperature 0: the same tokens, the same steps, and a verify forward
wherever the released one had drafts to verify (it also runs one where none are left; we do not).

    python tests/test_flash_parity.py     # the parity table, cases x tokens x forwards each side
"""
from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest

import dllm_local
from dllm_local import Settings
from dllm_local.prompts import encode_prompt
from dllm_local.models.loading.find import TINY_MODEL
from dllm_local.tiny.tasks import make_problems

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flash_reference import released_generate  # noqa: E402

PROMPTS = [p.prompt for task in ("arithmetic", "poker", "records") for p in make_problems(task, 3, 0)]
# (unmask policy, threshold, verify): the released generator's two modes at tau 0.9 and 1
PAIRS = [("threshold", 0.9, False), ("threshold", 1.0, False), ("flash_verify", 0.9, True), ("flash_verify", 1.0, True)]
# (track_num, mask_num): the authors' defaults, and a tight tracking where the attention ranking decides
# what is recomputed (with 4 x 16 tracked, these short prompts have every decoded position tracked).
CASES = ([(unmask, tau, verify, gen, 4, 4) for unmask, tau, verify in PAIRS for gen in (64, 128)]
         + [(unmask, tau, verify, 64, 1, 1) for unmask, tau, verify in PAIRS])
BLOCK, GAMMA = 16, 0.8


@cache
def _tiny():
    return dllm_local.load("tiny")


def compare(unmask: str, tau: float, verify: bool, gen: int, track: int, masks: int, prompt: str) -> dict:
    handle = _tiny()
    params = {"threshold": tau, **({"gamma": GAMMA} if verify else {})}
    ours = dllm_local.generate(handle, prompt, Settings(
        gen_length=gen, block_size=BLOCK, cache="flash", cache_params={"track_num": track, "mask_num": masks},
        unmask=unmask, unmask_params=params, trace="summary"))
    ids = encode_prompt(handle, prompt)
    theirs = released_generate(str(TINY_MODEL), ids, gen_length=gen, block_length=BLOCK, threshold=tau, gamma=GAMMA,
                               track_num=track, mask_num=masks, verify=verify, mask_id=handle.mask_id,
                               eos_id=handle.eos_id)
    # Past the first end of text nothing is decoded: left masked there, end-of-text here.
    answer = [handle.eos_id if t == handle.mask_id else t for t in theirs["tokens"][:gen]]
    steps = len(ours.trace.steps)
    return {"same_tokens": ours.token_ids == answer, "steps": (steps, theirs["steps"]),
            "verify_forwards": (ours.stats.nfe - steps, theirs["verify_with_candidates"]),
            "released_verify_forwards": theirs["verify_forwards"],
            "padding_decoded": any(p >= len(ids) + gen for p in theirs["decoded"])}


@pytest.mark.parametrize("unmask, tau, verify, gen, track, masks", CASES)
def test_flash_decodes_as_the_released_generator(unmask, tau, verify, gen, track, masks):
    for prompt in PROMPTS:
        got = compare(unmask, tau, verify, gen, track, masks, prompt)
        assert not got["padding_decoded"], prompt  # the one place we choose otherwise (docs/flash-dllm.md)
        assert got["same_tokens"], prompt
        assert got["steps"][0] == got["steps"][1], prompt
        assert got["verify_forwards"][0] == got["verify_forwards"][1], prompt


def test_a_short_history_still_verifies_where_the_release_cannot():
    """Where prompt + decoded < 2 x block - 2 x drafts, the released verify query slices from a negative
    index and accepts nothing; ours carries the decoded positions there are: the same tokens, drafts
    accepted, and no more steps."""
    handle, accepted = _tiny(), 0
    for prompt in PROMPTS[:6]:  # arithmetic and poker: prompts of 19 to 30 tokens
        ours = dllm_local.generate(handle, prompt, Settings(gen_length=64, block_size=32, cache="flash",
                                                           unmask="flash_verify", trace="summary"))
        theirs = released_generate(str(TINY_MODEL), encode_prompt(handle, prompt), gen_length=64, block_length=32,
                                   threshold=0.9, gamma=GAMMA, verify=True, mask_id=handle.mask_id, eos_id=handle.eos_id)
        assert theirs["short_history"] and not any(theirs["verify_kept"])
        assert ours.token_ids == [handle.eos_id if t == handle.mask_id else t for t in theirs["tokens"][:64]]
        assert len(ours.trace.steps) <= theirs["steps"]
        accepted += sum(s.policy["verify_accepted"] for s in ours.trace.steps)
    assert accepted


if __name__ == "__main__":
    print("| case | prompts | tokens identical | steps (ours / released) | verify forwards (ours / released with drafts / released) |")
    print("|---|---|---|---|---|")
    for unmask, tau, verify, gen, track, masks in CASES:
        rows = [compare(unmask, tau, verify, gen, track, masks, p) for p in PROMPTS]
        total = lambda key, i: sum(r[key][i] for r in rows)  # noqa: E731
        print(f"| flash (track {track}, masks {masks}) + {unmask} tau {tau:g}{f', gamma {GAMMA:g}' if verify else ''}, "
              f"gen {gen} | {len(rows)} | "
              f"{sum(r['same_tokens'] for r in rows)} of {len(rows)} | {total('steps', 0)} / {total('steps', 1)} | "
              f"{total('verify_forwards', 0)} / {total('verify_forwards', 1)} / {sum(r['released_verify_forwards'] for r in rows)} |")
