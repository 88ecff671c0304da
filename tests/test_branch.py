"""A branch: the run repeated with one change after one step (a position forced to a token, or sent
back to mask), decoded on with the same settings. Its steps up to the change are the original's;
the change holds; a branch is a trace like any other (it parses, exports and replays)."""
from __future__ import annotations

import pytest

from dllm_local.errors import SettingsError
from dllm_local.decoding.sampler import generate
from dllm_local.settings import Settings
from dllm_local.trace import Branch, Trace
from ui.parts.replay import state_at

PROMPT = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"
SETTINGS = dict(gen_length=32, block_size=8, cache="dual", unmask="fixed", steps=16, seed=3)


def run(tiny, branch: Branch | None = None, **overrides) -> Trace:
    return generate(tiny, PROMPT, Settings.from_dict({**SETTINGS, **overrides}), branch=branch).trace


def committed_at(trace: Trace, step: int) -> list:
    return [list(c) for c in trace.steps[step].committed]


@pytest.fixture(scope="module")
def original(tiny) -> Trace:
    return run(tiny)


def masked_after(trace: Trace, step: int) -> list[int]:
    """Absolute positions still masked after ``step``, in the block that step decoded."""
    state = state_at(trace.to_dict(), step)
    block = trace.steps[step].block
    P = trace.prompt_len
    return [P + p for p in range(block * 8, block * 8 + 8) if state["ids"][p] is None]


def test_forcing_a_token_repeats_the_steps_before_and_keeps_the_token(tiny, original):
    step = 1
    position = masked_after(original, step)[0]
    forced = 7 if original.final_ids[position - original.prompt_len] != 7 else 8
    branch = run(tiny, Branch(after_step=step, position=position, token=forced))
    for s in range(step + 1):
        assert committed_at(branch, s) == committed_at(original, s)
    assert branch.final_ids[position - branch.prompt_len] == forced
    assert branch.branch.replaced is None  # it was a mask
    assert all(position != p for s in branch.steps[step + 1:] for p, _, _ in s.committed)
    shown = state_at(branch.to_dict(), step)
    assert shown["ids"][position - branch.prompt_len] == forced
    before = state_at(branch.to_dict(), step - 1)
    assert before["ids"][position - branch.prompt_len] is None


def test_sending_a_commit_back_to_mask_decodes_it_again(tiny, original):
    step = 1
    P = original.prompt_len
    block = original.steps[step].block
    state = state_at(original.to_dict(), step)
    position = next(P + p for p in range(block * 8, block * 8 + 8) if state["ids"][p] is not None)
    branch = run(tiny, Branch(after_step=step, position=position, token=None))
    assert branch.branch.replaced == state["ids"][position - P]
    assert any(p == position for s in branch.steps[step + 1:] for p, _, _ in s.committed)
    assert state_at(branch.to_dict(), step)["ids"][position - P] is None


def test_a_branch_round_trips_through_its_file(tiny, original):
    position = masked_after(original, 0)[0]
    branch = run(tiny, Branch(after_step=0, position=position, token=5))
    again = Trace.from_json(branch.to_json())
    assert again.branch == branch.branch
    assert again.final_ids == branch.final_ids
    assert "branch" not in original.to_dict()  # a plain run's file is as it was


def test_a_branch_is_deterministic(tiny, original):
    position = masked_after(original, 0)[0]
    a = run(tiny, Branch(after_step=0, position=position, token=5))
    b = run(tiny, Branch(after_step=0, position=position, token=5))
    assert a.final_ids == b.final_ids and len(a.steps) == len(b.steps)


def test_changes_the_run_cannot_take_are_one_message(tiny, original):
    later = next(s for s, rec in enumerate(original.steps) if rec.block >= 1)
    with pytest.raises(SettingsError, match="finished before step"):
        run(tiny, Branch(after_step=later, position=original.prompt_len, token=None))
    with pytest.raises(SettingsError, match="vocabulary"):
        run(tiny, Branch(after_step=0, position=original.prompt_len, token=10**6))
    with pytest.raises(SettingsError, match="outside the answer"):
        run(tiny, Branch(after_step=0, position=original.prompt_len - 1, token=5))
    with pytest.raises(SettingsError, match="block by block"):
        run(tiny, Branch(after_step=0, position=original.prompt_len, token=5), cache="flash", unmask="threshold")


def test_the_views_draw_a_forced_token_as_forced(tiny, original):
    from xml.etree import ElementTree

    from ui.grid.tokens import token_grid_html
    from ui.run.position_panel import position_panel_html
    from ui.run.slides import grid_svg

    step = 1
    position = masked_after(original, step)[0]
    branch = run(tiny, Branch(after_step=step, position=position, token=5)).to_dict()
    answer_position = position - branch["prompt_len"] if "prompt_len" in branch else position - len(branch["prompt_ids"])
    for color_by in ("step", "confidence"):
        html = token_grid_html(branch, step, color_by=color_by)
        chip = html.split(f'data-pos="{answer_position}"', 1)[0].rsplit("<span", 1)[1]
        assert "dl-forced" in chip
        assert f"forced after step {step} by the branch" in html
        ElementTree.fromstring(grid_svg(branch, step, color_by))
    assert "forced there by the branch" in position_panel_html(branch, step, answer_position)
    assert "dl-forced" not in token_grid_html(branch, step - 1)  # before the change, nothing forced


def test_a_change_that_changes_nothing_is_refused_with_why(original):
    """Re-masking a position still masked, or forcing the token already standing there, would repeat
    the run unchanged: the page refuses it and says why (issue 59, item 4); the menu of tokens to
    force leaves the standing one out."""
    from ui.run.branching import candidate_choices, no_change

    trace, step = original.to_dict(), 1
    P = original.prompt_len
    masked = masked_after(original, step)[0] - P
    ids = state_at(trace, step)["ids"]
    committed = next(p for p, token in enumerate(ids) if token is not None)
    assert no_change(trace, step, masked, None) == (f"Position {masked} is still masked after step {step}: nothing to "
                                                    "re-mask; pick a committed token, or force a token there")
    why = no_change(trace, step, committed, str(ids[committed]))
    assert f"Position {committed} already holds" in why and "unchanged" in why
    assert no_change(trace, step, committed, None) == ""  # a commit sent back to mask: a real branch
    assert no_change(trace, step, masked, "5") == ""
    assert no_change(trace, step, committed, str(ids[committed] + 1)) == ""
    assert str(ids[committed]) not in [value for _, value in candidate_choices(trace, step, committed)]


def test_a_forced_end_of_text_keeps_its_mark_beside_the_folded_ends(tiny, original):
    """A forced end of text among the trailing ends stays a box of its own with its dashed outline:
    folded into the end chip its mark would never show (issue 59, item 4)."""
    import re

    from ui.grid.ends import COLLAPSE_PADDING
    from ui.grid.tokens import token_grid_html
    from ui.parts.replay import is_end_token

    step = len(original.steps) - 4
    position = masked_after(original, step)[0]
    branch = run(tiny, Branch(after_step=step, position=position, token=tiny.eos_id)).to_dict()
    p, ids = position - original.prompt_len, branch["final_ids"]
    assert all(is_end_token(branch, t) for t in ids[p - 1: p + COLLAPSE_PADDING])  # a run the grid would fold
    html = token_grid_html(branch, len(branch["steps"]) - 1)
    unfolded = re.sub(r"<details.*?</details>", "", html, flags=re.S)
    assert "<details" in html and f'data-pos="{p}"' in unfolded
    box = unfolded.split(f'data-pos="{p}"', 1)[0].rsplit("<span", 1)[1]
    assert "dl-forced" in box and "opacity" not in box  # not faded as padding: the outline reads
