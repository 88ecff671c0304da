"""The token grid of real tiny-model runs with the presets' settings: a folded run of end-of-text
tokens hides nothing that happened at the step shown, each stop token has a name of its own, and
every box names its position (and token) for the side panel."""
from __future__ import annotations

import html
import re

import pytest

from preset_runs import preset_trace
from ui.grid import tokens as grid
from ui.parts import replay

BOX = re.compile(r'<span class="(dl-tok[^"]*)" title="([^"]*)" data-pos="(\d+)"(?: data-token="(\d+)")? style="([^"]*)"')
FOLD = re.compile(r'<details class="dl-pad"[^>]*>(<summary[^>]*>[^<]*</summary>)(.*?)</details>', re.S)
RUNS = ("paper default", "several steps", "self-verifying", "revise")


def boxes(page: str) -> list[dict]:
    """Every box of the grid in order: its position, token, classes, hover, style and the chip it is folded under."""
    folds = [(m.start(2), m.end(2), m.group(1)) for m in FOLD.finditer(page)]
    return [{"pos": int(m.group(3)), "token": None if m.group(4) is None else int(m.group(4)),
             "classes": m.group(1).split(), "title": html.unescape(m.group(2)), "style": m.group(5),
             "chip": next((chip for a, b, chip in folds if a <= m.start() < b), None)} for m in BOX.finditer(page)]


@pytest.mark.parametrize("word", RUNS)
def test_no_event_of_the_step_shown_is_folded_away_or_faded(word):
    trace = preset_trace(word)
    P = replay.prompt_len(trace)
    folded_new = 0
    for step, record in enumerate(trace["steps"]):
        page = grid.token_grid_html(trace, step)
        shown = boxes(page)
        committed_here = {pos - P for pos, _, _ in record["committed"]}
        for box in shown:
            eventful = "dl-revised" in box["classes"] or "dl-sent-back" in box["title"] or "self-verify sent" in box["title"]
            if box["pos"] in committed_here:
                # outlined in its box, and in the chip of this step's commits if folded
                assert "dl-new" in box["classes"] and "outline:3px" in box["style"], (word, step, box["pos"])
                if box["chip"] is not None:
                    folded_new += 1
                    assert 'class="dl-pad-chip dl-new"' in box["chip"] and "outline:3px" in box["chip"]
                    assert "committed this step" in box["chip"]
            elif box["chip"] is not None:
                assert "dl-new" not in box["chip"], (word, step, box["pos"])  # a chip of earlier ends says nothing new
            if eventful or box["pos"] in committed_here:
                assert box["chip"] is None or box["pos"] in committed_here and not eventful
                assert "opacity" not in box["style"], (word, step, box["pos"])  # readable, not faded padding
        # each chip counts what it folds, and what it folds of this step's commits
        for chip, folded in ((m.group(1), m.group(2)) for m in FOLD.finditer(page)):
            first, last = map(int, re.search(r'data-from="(\d+)" data-to="(\d+)"', chip).groups())
            inside = [b["pos"] for b in boxes(folded)]
            assert inside == list(range(first, last + 1)) and f"× {len(inside)} end of text" in chip
            assert int(re.search(r'data-new="(\d+)"', chip).group(1)) == sum(p in committed_here for p in inside)
    if word == "paper default":
        assert folded_new >= 32  # DualCache's step that commits a block of end of text: all 32 outlined in a chip


def test_a_revised_end_of_text_stays_a_box_of_its_own():
    trace = preset_trace("revise")
    last = len(trace["steps"]) - 1
    revised = {p for p, history in enumerate(replay.state_at(trace, last)["history"]) if history}
    ids = replay.state_at(trace, last)["ids"]
    assert any(replay.is_end_token(trace, ids[p]) for p in revised), "the revise preset takes back an end of text"
    shown = [box for box in boxes(grid.token_grid_html(trace, last)) if box["pos"] in revised]
    assert [box["pos"] for box in shown] == sorted(revised)
    for box in shown:
        if box["pos"] in revised:
            assert box["chip"] is None and "dl-revised" in box["classes"] and "opacity" not in box["style"]


def test_distinct_stop_tokens_have_distinct_names_that_read_as_an_end():
    trace = preset_trace("paper default")
    stops = trace["model"]["stop_ids"]
    labels = [grid.token_label(trace, t) for t in stops]
    assert len(stops) >= 2 and len(set(labels)) == len(stops), labels
    assert all(label.startswith("⟨") and label.endswith("⟩") for label in labels)
    # every token of the run's vocabulary is told apart from every other
    vocab = [int(t) for t in trace["vocab"]]
    assert len({grid.token_label(trace, t) for t in vocab}) == len(vocab)
    last = len(trace["steps"]) - 1
    page = grid.token_grid_html(trace, last)
    final = replay.state_at(trace, last)["ids"]
    used = {t for t in final if t in stops}
    assert len(used) >= 2, "the run's answer holds both of the tiny model's stop tokens"
    for box in boxes(page):
        if box["token"] in stops:
            assert f"token '{grid.token_label(trace, box['token'])}'" in box["title"] and "end of text" in box["title"]
    legend = html.unescape(page.split('class="dl-legend"')[1])
    assert all(grid.token_label(trace, t) in legend for t in used) and "end of text" in legend
    # a stop token whose text does not say "end" is called an end of text all the same
    odd = {**trace, "vocab": {**trace["vocab"], str(stops[0]): "."}}
    assert grid.token_label(odd, stops[0]) == "⟨end .⟩"


@pytest.mark.parametrize("word", ("paper default", "self-verifying"))
def test_every_box_names_its_position_and_token_and_is_clickable(word):
    trace = preset_trace(word)
    n = replay.answer_length(trace)
    for step in (-1, 0, len(trace["steps"]) // 2, len(trace["steps"]) - 1):
        page = grid.token_grid_html(trace, step)
        ids = replay.state_at(trace, step)["ids"]
        shown = boxes(page)
        assert [b["pos"] for b in shown] == list(range(n)) == [b["pos"] for b in shown if "title" in b]
        assert page.count('class="dl-tok') == n  # no box left without its data-pos
        for box in shown:
            assert box["token"] == ids[box["pos"]]  # committed: its token id; masked: none
            assert "cursor:pointer" in box["style"] and box["title"].startswith(f"pos {box['pos']} ·")
            assert ("dl-masked" in box["classes"]) == (box["token"] is None)
    assert any(b["chip"] for b in boxes(grid.token_grid_html(trace, len(trace["steps"]) - 1)))  # folded ones too
