"""Every count on a run's page agrees with the others and says what it counts: real runs of the tiny
model with the presets' settings (self-verify's verifying forwards, FreeCache + guided's guider
forwards), a stopped run (not graded), and a trace older than the per-step guider count."""
from __future__ import annotations

import html
import re

import pytest

import dllm_local
from dllm_local import Settings
from dllm_local.tiny.tasks import verdict
from dllm_local.trace import parse_trace
from ui.grid import tokens as grid
from ui.lessons import verdicts
from ui.parts import replay
from ui.run import status_line
from ui.parts import tables
from ui.parts.presets import load_presets

from test_on_screen import contrast

PRESETS, _ = load_presets()
RED = "#d73027"


def _preset(word: str) -> tuple[str, Settings]:
    preset = next(p for name, p in PRESETS.items() if word in name.lower())
    return preset["prompt"], Settings.from_dict(preset["settings"])


@pytest.fixture(scope="module")
def self_verify(tiny) -> dict:
    return dllm_local.generate(tiny, *_preset("self-verify")).trace.to_dict()


@pytest.fixture(scope="module")
def guided(tiny, tiny_guider) -> dict:
    return dllm_local.generate(tiny, *_preset("guided"), tiny_guider).trace.to_dict()


def _text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: its text, tags dropped."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _page(trace: dict) -> str:
    """The status line, the numbers cards and the cache verdict of a finished run, as one text."""
    return " ".join([status_line.run_status(trace, "", None, True), _text(tables.numbers_html(replay.numbers(trace))),
                     verdicts.cache_saves_verdict(trace).text])


def test_self_verify_counts_its_forwards_alike_everywhere(self_verify):
    steps, stats = self_verify["steps"], self_verify["stats"]
    main, nfe, g = len(steps), stats["nfe"], sum(s["g"] for s in steps)
    verifying = nfe - main
    assert nfe == sum(s["forwards"] for s in steps) and verifying > 0, "the preset verifies drafts in forwards of their own"
    page = _page(self_verify)
    # Each "N forwards" is the run's NFE, unless it is named as the steps' main forwards or the others.
    said = re.findall(r"(\bother )?(\d+) (main )?forwards?\b", page)
    assert said
    for other, n, qualifier in said:
        assert int(n) == (verifying if other else main if qualifier else nfe), f"{n} forwards in: {page}"
    assert f"{main} main + {verifying} verifying" in page
    # Each mean G divides by the forwards it names: per main forward (one per step), or per forward (all NFE).
    means = re.findall(r"mean G ([\d.]+) per (main forward|forward)\b", page)
    means += re.findall(r"mean G ([\d.]+) positions / (step's main forward|forward)\b", page)
    assert len(means) == 2, f"the verdict and the card each state mean G with what it is per: {page}"
    for value, per in means:
        assert float(value) == pytest.approx(g / (nfe if per == "forward" else main), abs=0.05), (value, per)


def test_self_verify_theorem1_is_told_for_the_commits_it_kept(self_verify):
    steps = self_verify["steps"]
    sent_back = [i for i, s in enumerate(steps) if s["policy"].get("rejected_at")]
    assert sent_back, "the preset's drafts 'straight house' must be sent back"

    def unguaranteed(record: dict) -> bool:  # worked out here: the kept commits' (n+1)ε > 1
        kept = [c for _, _, c in record["committed"]]
        return len(kept) > 1 and (len(kept) + 1) * (1 - min(kept)) > 1

    for i in sent_back:
        verdict_at = verdicts.theorem1_verdict(self_verify, i)
        # n counts what the text says it counts: the positions the step committed.
        for step, n in re.findall(r"step (\d+): (?:guaranteed|no guarantee), n = (\d+)", verdict_at.text):
            assert int(n) == len(steps[int(step)]["committed"]), verdict_at.text
        assert "n counts every position the step committed" in verdict_at.text
        failing = any(unguaranteed(record) for record in steps[: i + 1])
        assert (verdict_at.status == verdicts.FAILS) == failing
        assert ("✗" in verdicts.verdicts_html([verdict_at])) == failing, verdict_at.text
        # The line under the grid is red only where the commits kept at that step have no guarantee.
        line = re.search(r'class="dl-theorem"[^>]*color:(#\w+)', grid.token_grid_html(self_verify, i)).group(1)
        assert (line == RED) == unguaranteed(steps[i]), (i, line)
    # What the drafts sent back would have risked is still said, apart.
    told = verdicts.theorem1_verdict(self_verify, len(steps) - 1)
    assert told.numbers["drafts_without_guarantee"] and "self-verify sent" in told.text


def test_the_theorem_line_under_the_grid_reads_at_4_5_to_1(self_verify):
    """WCAG 1.4.3: the line is 16 px bold, not large text, so its green and its red need 4.5:1 on
    the light theme's white (the plots' green mark, #1a9850, is 3.7:1)."""
    lines = [re.search(r'class="dl-theorem"[^>]*color:(#\w+)', grid.token_grid_html(self_verify, i))
             for i in range(len(self_verify["steps"]))]
    colours = {line.group(1) for line in lines if line}
    assert colours - {RED}, colours  # a guaranteed line, green
    for colour in colours:
        assert contrast(colour, "#ffffff") >= 4.5, colour


def test_a_stopped_run_is_said_stopped_and_not_graded(tiny, tiny_guider):
    prompt, preset_settings = _preset("guided")
    for settings, guider, steps in ((Settings(gen_length=64, block_size=32), None, 5), (preset_settings, tiny_guider, 1)):
        run = dllm_local.stream(tiny, prompt, settings, guider)
        for seen, _ in enumerate(run, 1):
            if seen == steps:
                run.stop()
        trace = run.result.trace.to_dict()
        assert trace["stats"]["stopped"] and len(trace["steps"]) == steps
        assert verdict(prompt, trace["text"]) is not None, "the prompt is a task: a finished answer would be graded"
        status = status_line.run_status(trace, "", None, True)
        assert status.startswith("Stopped: ") and "not graded" in status, status
        assert not re.search(r"[✓✗]|\b(right|wrong|valid|invalid)\b", status.split("**Answer:**")[1]), status
        answer = verdicts.answer_verdict(trace)
        assert answer.status == verdicts.UNMEASURABLE and "stopped" in answer.detail and "not graded" in answer.detail


def test_guided_counts_the_guiders_forwards_apart_from_the_models(guided):
    steps, stats = guided["steps"], guided["stats"]
    nfe, guider = stats["nfe"], stats["guider_forwards"]
    assert guider > 0 and guider == sum(s["guider_forwards"] for s in steps) and nfe == len(steps)
    cards = _text(tables.numbers_html(replay.numbers(guided)))
    assert f"NFE {nfe} forwards " in cards and f"guider {guider} forwards of the guider, not in NFE" in cards, cards
    status = status_line.run_status(guided, "", None, True)
    assert f"{nfe} forwards + {guider} guider forwards" in status, status
    # Part way through, the guider's forwards so far.
    assert replay.numbers(guided, 1)["guider_forwards"] == steps[0]["guider_forwards"] + steps[1]["guider_forwards"]
    cost = tables.cost_table_html([{"strategy": "x", "g": 1, "tau": 1, "floor_ms": 1, "bound": "read", "tokens_per_s": 1,
                                    "speedup_vs_ar": 1, "read_ms": 1, "compute_ms": 1}], "m", "d", guided)
    assert f"its {nfe} forwards and the guider's {guider} together" in cost


def test_a_trace_without_per_step_guider_counts_still_loads_and_says_what_it_knows(guided):
    older = {**guided, "steps": [{k: v for k, v in s.items() if k != "guider_forwards"} for s in guided["steps"]]}
    loaded = parse_trace(older)
    assert all(s.guider_forwards == 0 for s in loaded.steps) and loaded.stats.guider_forwards == guided["stats"]["guider_forwards"]
    assert replay.numbers(older)["guider_forwards"] == guided["stats"]["guider_forwards"]
    assert replay.numbers(older, 1)["guider_forwards"] is None  # not recorded per step: unknown, not 0
    assert "guider — forwards of the guider" in _text(tables.numbers_html(replay.numbers(older, 1)))


def test_the_confidence_plots_theorem_marks_say_what_the_verdicts_say(self_verify):
    from ui import figures

    fig = figures.confidence_heatmap(self_verify)
    marked = {verdict: set(trace.y) for trace in fig.data if (trace.name or "").startswith("Theorem 1: ")
              for verdict in [trace.name.removeprefix("Theorem 1: ")]}
    kept = {i: replay.theorem1(record)["verdict"] for i, record in enumerate(self_verify["steps"])}
    assert any(replay.drafts(r) != r["committed"] for r in self_verify["steps"])  # drafts were sent back
    for verdict in ("guaranteed", "no guarantee"):
        assert marked.get(verdict, set()) == {i for i, v in kept.items() if v == verdict}
