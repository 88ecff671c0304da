"""The `revise` policy (draft wide, verify narrow): committed tokens can go back to mask."""
from __future__ import annotations

import html

import pytest

import dllm_local
from dllm_local import Settings
from dllm_local.tiny.tasks import make_problems, score
from ui.parts.presets import load_presets

PROMPT = make_problems("arithmetic", 1, 7)[0].prompt


def _revise(**params) -> Settings:
    return Settings(gen_length=64, block_size=32, cache="dual", unmask="revise", unmask_params=params, trace="full")


def test_revise_without_verification_is_the_threshold_rule(tiny):
    for draft in (0.3, 0.9):
        revise = dllm_local.generate(tiny, PROMPT, _revise(draft_threshold=draft, verify_threshold=0.0))
        threshold = dllm_local.generate(tiny, PROMPT, _revise().with_(unmask="threshold", unmask_params={"threshold": draft}))
        assert revise.token_ids == threshold.token_ids and revise.stats.nfe == threshold.stats.nfe
        assert revise.stats.revisions == 0


@pytest.mark.parametrize("max_revisions", [1, 2])
def test_revisions_are_bounded_so_decoding_ends(tiny, max_revisions):
    # verify_threshold 1: every committed token is "unsure" and would be taken back forever.
    result = dllm_local.generate(tiny, PROMPT, _revise(draft_threshold=0.99, verify_threshold=1.0, max_revisions=max_revisions))
    revoked = [r for s in result.trace.steps for r in s.revoked]
    assert revoked and result.stats.revisions == len(revoked)
    per_position: dict[int, int] = {}
    for position, token, then, now in revoked:
        per_position[position] = per_position.get(position, 0) + 1
        assert 0 <= now <= 1.0 and 0 < then <= 1.0
    assert max(per_position.values()) <= max_revisions
    assert len(result.trace.steps) <= 64 + 2 + len(revoked)  # gen_length + blocks + revisions
    assert tiny.mask_id not in result.token_ids
    # A revoked position is masked again, then committed again later.
    first = result.trace.steps.index(next(s for s in result.trace.steps if s.revoked))
    position = result.trace.steps[first].revoked[0][0]
    assert any(c[0] == position for s in result.trace.steps[first + 1:] for c in s.committed)


def test_revise_keeps_poker_valid_with_fewer_forwards_than_self_verify(tiny):
    problems = make_problems("poker", 20, 1000)
    base = Settings(gen_length=32, block_size=32, cache="dual", trace="off")
    runs = {name: [dllm_local.generate(tiny, ex.prompt, base.with_(unmask=name, unmask_params=params, seed=i))
                   for i, ex in enumerate(problems)]
            for name, params in (("revise", {"draft_threshold": 0.1}), ("self_verify", {"threshold": 0.1}))}
    valid = sum(score(ex, r.text) for ex, r in zip(problems, runs["revise"]))
    assert valid >= 0.95 * len(problems)
    forwards = {name: sum(r.stats.nfe for r in rs) for name, rs in runs.items()}
    assert forwards["revise"] < forwards["self_verify"]


def test_revise_keeps_arithmetic_accuracy(tiny):
    problems = make_problems("arithmetic", 20, 2024)
    base = Settings(gen_length=64, block_size=32, trace="off")
    one_per_step = sum(score(ex, dllm_local.generate(tiny, ex.prompt, base).text) for ex in problems)
    revise = sum(score(ex, dllm_local.generate(tiny, ex.prompt, base.with_(cache="dual", unmask="revise")).text)
                 for ex in problems)
    assert revise >= one_per_step - 0.02 * len(problems) - 1e-9


def test_the_numbers_card_counts_revisions_and_net_commits(tiny):
    from ui.parts import replay
    from ui.parts import tables

    result = dllm_local.generate(tiny, PROMPT, _revise(draft_threshold=0.99, verify_threshold=1.0))
    nums = replay.numbers(result.trace.to_dict())
    assert nums["revisions"] == result.stats.revisions > 0
    assert nums["committed"] == 64  # every position once, net of the tokens taken back
    assert "tokens taken back" in tables.numbers_html(nums)


def test_revise_preset_takes_a_word_back_and_the_grid_shows_its_history(tiny):
    from ui.grid import tokens as grid
    from ui.parts import replay

    preset = next(p for p in load_presets()[0].values() if p["settings"]["unmask"] == "revise")
    result = dllm_local.generate(tiny, preset["prompt"], Settings.from_dict(preset["settings"]))
    assert score(make_problems("poker", 1, 0)[0], result.text)  # a real hand in the end
    trace = result.trace.to_dict()
    first = next(i for i, s in enumerate(trace["steps"]) if s["revoked"])
    position, token, then, now = trace["steps"][first]["revoked"][0]
    assert now < preset["settings"]["unmask_params"]["verify_threshold"] <= 1 and then >= 0.3
    p = position - len(trace["prompt_ids"])
    state = replay.state_at(trace, first)
    committed_at = next(i for i, s in enumerate(trace["steps"]) if any(c[0] == position for c in s["committed"]))
    assert state["ids"][p] is None and state["history"][p][0][:3] == [token, committed_at, first]
    page = grid.token_grid_html(trace, len(trace["steps"]) - 1)
    box = next(b for b in page.split('<span class="dl-tok') if f'"pos {p} ·' in b)
    shown = html.escape(grid.token_label(trace, token), quote=False)  # a special token as its marker
    assert "dl-revised" in box and f"<s class=\"dl-revoked\"" in box and f"history: '{shown}'" in box
    assert result.stats.nfe <= len(trace["steps"])  # no verification forward
