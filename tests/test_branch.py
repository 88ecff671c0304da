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
