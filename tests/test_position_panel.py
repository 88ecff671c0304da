"""The side panel for one position says, for real runs of the tiny model, what the trace holds about
that position at that step: its token and since when, its candidates, its history, its cache state
and the guider's and verifier's word; everything the grid's hover titles say is in it; a bad
position or an empty trace gives a message, never an exception."""
from __future__ import annotations

import html
import re
from statistics import fmean

import pytest

import dllm_local
from dllm_local.settings import Settings
from ui.grid.tokens import token_grid_html, token_label
from ui.run.position_panel import NO_STEPS, position_panel_html
from ui.parts.presets import load_presets

PRESETS, _ = load_presets()
RUNS = {"self-verify": "Self-verifying parallel decoding", "guided": "FreeCache + guided diffusion (FlashDLM)",
        "revise": "Revise: draft wide, verify narrow (WINO)", "dual": "Fast-dLLM DualCache (paper default)",
        "flash": "Flash-dLLM as released"}


@pytest.fixture(scope="module")
def traces(tiny, tiny_guider) -> dict[str, dict]:
    found = {}
    for key, name in RUNS.items():
        preset = PRESETS[name]
        guider = {"guider": tiny_guider} if preset["settings"]["unmask"] == "guided" else {}
        found[key] = dllm_local.generate(tiny, preset["prompt"], Settings.from_dict(preset["settings"]),
                                         **guider).trace.to_dict()
    return found


def _lines(panel: str) -> list[str]:
    """The panel as a reader sees it, one line per block."""
    text = re.sub(r"<[^>]*>", "", re.sub(r"</div>", "\n", panel))
    return [line.strip() for line in html.unescape(text).splitlines() if line.strip()]


def _section(lines: list[str], head: str) -> list[str]:
    """The lines under a heading, up to the next heading."""
    heads = ("Top candidates", "Step ", "History", "Cache", "Verdicts")
    start = lines.index(head) + 1
    stop = next((i for i in range(start, len(lines)) if lines[i].startswith(heads)), len(lines))
    return lines[start:stop]


def _replay(trace: dict, step: int, position: int) -> tuple[int | None, int | None, float | None, list[tuple]]:
    """The position's token, commit step and confidence after ``step``, and its events, read afresh."""
    where, token, at, conf, events = len(trace["prompt_ids"]) + position, None, None, None, []
    for i, record in enumerate(trace["steps"][: step + 1]):
        events += [("sent back", i, s) for p, _, s in record["policy"].get("rejected_at") or [] if p == where]
        for p, t, c in record["committed"]:
            if p == where:
                token, at, conf = t, i, c
                events.append(("commit", i, c))
        for p, _, then, now in record["revoked"]:
            if p == where:
                token = at = conf = None
                events.append(("taken back", i, then, now))
    return token, at, conf, events


@pytest.mark.parametrize("run", ["self-verify", "guided", "revise", "dual"])
def test_the_panel_tells_each_positions_token_history_and_cache_as_the_trace_holds_them(traces, run):
    trace = traces[run]
    P, steps = len(trace["prompt_ids"]), trace["steps"]
    for step, record in enumerate(steps):
        for position in range(trace["gen_length"]):
            lines = _lines(position_panel_html(trace, step, position))
            token, at, conf, events = _replay(trace, step, position)
            assert lines[0] == f"Position {position} · after step {step}"
            if token is None:
                assert "masked" in lines[1]
            else:
                assert lines[1].startswith(token_label(trace, token))
                assert lines[1].endswith(f"since step {at}, committed with confidence {conf:.2f}")
            history = _section(lines, "History")
            assert len(history) == max(1, len(events)) and (events or history == ["nothing yet"])
            for line, (kind, when, *numbers) in zip(history, events):
                assert line.startswith(f"step {when}: ") and kind.split()[0] in line
                assert all(f"{n:.3f}" in line if kind == "sent back" else f"{n:.2f}" in line for n in numbers)
            cache = _section(lines, "Cache")
            where = P + position
            if where in record["recomputed"]:
                assert cache[0].startswith(f"recomputed at step {step}")
                j = record["recomputed"].index(where)
                for which in ("k", "v"):
                    values = [layer[which][j] for layer in record["kv"].values() if layer[which][j] is not None]
                    if values:
                        assert f"{which.upper()} {fmean(values):.3f}" in cache[1]
            else:
                assert cache[0].startswith(f"reused from the cache at step {step}")


def test_the_candidates_are_the_steps_top_k_in_order_or_those_that_committed_the_token(traces):
    trace = traces["dual"]
    P = len(trace["prompt_ids"])
    for step, record in enumerate(trace["steps"]):
        top = {p - P: pairs for p, pairs in record["top_candidates"]}
        for position in range(trace["gen_length"]):
            lines = _lines(position_panel_html(trace, step, position))
            token, at, _, _ = _replay(trace, step, position)
            head = (f"Top candidates at step {step}" if position in top
                    else f"Top candidates when committed (step {at})" if token is not None else None)
            if head is None:
                assert not any(line.startswith("Top candidates") for line in lines)
                continue
            pairs = top.get(position) or dict((p - P, c) for p, c in trace["steps"][at]["top_candidates"])[position]
            shown = _section(lines, head)
            assert len(shown) == len(pairs)
            for line, (t, q) in zip(shown, pairs):
                assert line.startswith(token_label(trace, t)) and line.endswith(f"{q:.2f}")


def test_distinct_tokens_get_distinct_names_even_where_their_text_is_the_same(traces):
    trace = dict(traces["self-verify"])
    P = len(trace["prompt_ids"])
    step, (position, pairs) = next((i, (p - P, pairs)) for i, r in enumerate(trace["steps"])
                                   for p, pairs in r["top_candidates"] if len({t for t, _ in pairs}) == 3)
    first, second = pairs[0][0], pairs[1][0]
    # two different tokens that read the same: the panel must still tell them apart
    trace["vocab"] = {**trace["vocab"], str(second): trace["vocab"][str(first)]}
    assert token_label(trace, first) == token_label(trace, second)
    shown = _section(_lines(position_panel_html(trace, step, position)), f"Top candidates at step {step}")
    names = [line.rsplit(" ", 1)[0].strip() for line in shown]
    assert len(set(names)) == len(names) == 3


def test_sent_back_revised_and_guided_positions_carry_the_policys_verdict(traces):
    sv = traces["self-verify"]
    P = len(sv["prompt_ids"])
    sent = [(i, p - P, s) for i, r in enumerate(sv["steps"]) for p, _, s in r["policy"].get("rejected_at") or []]
    assert sent, "the preset's run sends drafts back"
    for step, position, score in sent:
        lines = _lines(position_panel_html(sv, step, position))
        assert any(line.startswith(f"self-verify, step {step}: sent this draft back") for line in lines)
        assert f"masked again since step {step} (sent back)" in lines[1]
        assert f"conflict score {score:.3f}" in " ".join(lines)
    revise = traces["revise"]
    P = len(revise["prompt_ids"])
    revoked = [(i, p - P) for i, r in enumerate(revise["steps"]) for p, *_ in r["revoked"]]
    assert revoked, "the preset's run takes commits back"
    for step, position in revoked:
        assert f"masked again since step {step} (taken back)" in _lines(position_panel_html(revise, step, position))[1]
    guided = traces["guided"]
    P = len(guided["prompt_ids"])
    for step, record in enumerate(guided["steps"]):
        agreed = record["policy"]["guider_accepted"]
        for position in (p - P for p, _, _ in record["committed"]):
            verdict = next(line for line in _lines(position_panel_html(guided, step, position))
                           if line.startswith(f"guider, step {step}: "))
            assert (f"the first {agreed} drafted" in verdict) if agreed else ("rejected" in verdict)


@pytest.mark.parametrize("run", list(RUNS))
def test_every_token_and_number_a_grid_hover_states_is_in_the_panel(traces, run):
    trace = traces[run]
    words = {"accepted by the guider": "accepted by the guider", "sent draft": "sent draft",
             "taken back": "taken back to mask", "verify forward": "accepted by the verify forward",
             "committed after the end of text": "not part of the answer", "end of text": "end of text"}
    for step in range(len(trace["steps"])):
        for title in re.findall(r'<span class="dl-tok[^"]*" title="([^"]*)"', token_grid_html(trace, step)):
            title = html.unescape(title)
            position = int(re.match(r"pos (\d+)", title).group(1))
            panel = " ".join(_lines(position_panel_html(trace, step, position)))
            quoted = re.sub(r"(\d)'s\b", r"\1", title)  # "step 0's top candidates": not a quote
            for said in re.findall(r"'([^']+)'", quoted) + re.findall(r"\d+\.\d+", title):
                assert said in panel, (step, position, said, title)
            for grid_words, panel_words in words.items():
                assert grid_words not in title or panel_words in panel, (step, position, grid_words)


def test_a_bad_position_or_an_empty_trace_gives_a_message_and_sizes_scale_with_the_page(traces):
    trace = traces["dual"]
    for position in (-1, trace["gen_length"], 10**6, "3", None, 2.0):
        shown = position_panel_html(trace, 0, position)
        assert "No answer position" in shown and f"0–{trace['gen_length'] - 1}" in shown
    for empty in ({}, {"steps": []}, {**trace, "steps": []}):
        assert html.escape(NO_STEPS) in position_panel_html(empty, 0, 0)
    assert _lines(position_panel_html(trace, 10**6, 0))[0] == f"Position 0 · after step {len(trace['steps']) - 1}"
    assert _lines(position_panel_html(trace, -1, 0))[:2] == ["Position 0 · before any step", "▢ masked since the start"]
    panels = [position_panel_html(traces[run], step, position) for run in RUNS for step in (0, 1) for position in (0, 5)]
    assert not any(re.search(r"\d\s*px", panel) for panel in panels)  # em/rem: a page-wide font scale applies
