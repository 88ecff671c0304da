"""A canvas model (DiffusionGemma) on the page, in a real browser over a real Gradio server and
engine: the model box loads tiny-diffusiongemma and the model line says what it is; the masked
models' controls are disabled with the reason and its own knobs shown (and the other way round
once a masked model is back, and in a page opened after the switch); its knobs reach the run (the
exported trace is the library's run with the same settings); the grid shows each step's accepted,
renoised and changed positions as the trace records them, stepping back shows the step before's,
and the verdicts say how each canvas ended."""
from __future__ import annotations

import json

import pytest

import dllm_local
from dllm_local.settings import Settings
from ui import figures

from test_page import OUT, _choose, _load_model, _shown_run, _status, _wait_run_ended, browser, export_trace, server  # noqa: F401

PROMPT = "What is 2 plus 3?"
# Knobs that let the tiny random model's second canvas stop early (its drafts settle), as typed.
KNOBS = {"confidence_threshold": "0.9", "entropy_bound": "2"}
GEN_LENGTH = 32  # two canvases of 16
MASKED_ONLY = ("#block-size input[type=range]", "#cache input", "#unmask input", "#temperature input[type=range]",
               "#exact-drift input", "#what-if input[type=range]", "#force-btn")
CANVAS_BOXES = [f"#canvas-{name.replace('_', '-')}" for name in
                ("max_denoising_steps", "canvas_length", "entropy_bound", "t_max", "t_min", "stability_threshold",
                 "confidence_threshold")]
REASON = "DiffusionGemma refines whole canvases with its own sampler: block size and cache policy do not apply"


@pytest.fixture(scope="module")
def pg(browser, server):  # noqa: F811 - the fixtures imported above
    page = browser.new_page(viewport={"width": 1500, "height": 2000}, accept_downloads=True)
    page.goto(server)
    page.wait_for_selector("#run-btn")
    yield page
    page.close()


def _text_box(pg, selector: str):
    return pg.locator(f"{selector} textarea, {selector} input").first


def _canvas_controls_shown(pg) -> None:
    """The masked models' controls disabled, the reason said, the canvas knobs shown."""
    pg.wait_for_selector("#canvas-reason", state="visible")
    assert REASON in pg.inner_text("#canvas-reason")
    for selector in MASKED_ONLY:
        assert pg.locator(selector).first.is_disabled(), selector
    for selector in CANVAS_BOXES:
        assert _text_box(pg, selector).is_visible() and _text_box(pg, selector).is_enabled(), selector
    _captions_say(pg, figures.CANVAS_CAPTIONS)


def _captions_say(pg, captions: dict[str, str]) -> None:
    pg.wait_for_function("(c) => document.querySelector('#panel-cache').innerText.includes(c)",
                         arg=captions["cache"][:60])
    for panel, caption in captions.items():
        assert caption[:60] in pg.inner_text(f"#panel-{panel}"), panel


def _grid_classes(pg) -> dict[str, list[int]]:
    """The grid's canvas boxes by class: their answer positions (data-pos, as a masked model's boxes)."""
    return pg.evaluate("""() => Object.fromEntries(['accepted', 'renoised', 'changed'].map((c) => [c,
        [...document.querySelectorAll(`#token-grid .dl-canvas-${c}`)].map((b) => Number(b.dataset.pos))]))""")


def _show_step(pg, step: int) -> None:
    pg.locator("#scrubber input[type=range]").fill(str(step))
    pg.wait_for_function("(s) => document.querySelector('#token-grid').innerText.includes(`after step ${s} `)"
                         " || document.querySelector('#scrubber input[type=number]').value === String(s)", arg=step)
    pg.wait_for_timeout(500)  # the grid's redraw lands after the slider's number


def test_a_canvas_model_loads_runs_and_shows_its_steps_on_the_page(pg, browser, server, tmp_path):  # noqa: F811
    _load_model(pg, "tiny-diffusiongemma")
    line = pg.inner_text("#model-line")
    assert "tiny-diffusiongemma" in line and "canvas diffusion, canvas length 16" in line and "experts" in line, line
    _canvas_controls_shown(pg)
    fresh = browser.new_page()  # a page opened after the switch shows the model loaded now
    fresh.goto(server)
    fresh.wait_for_selector("#canvas-reason", state="visible")
    assert "canvas diffusion" in fresh.inner_text("#model-line") and fresh.locator("#cache input").is_disabled()
    fresh.close()

    # A bad knob is one line saying which and why; nothing runs.
    _text_box(pg, "#canvas-confidence-threshold").fill("lots")
    pg.click("#run-btn")
    pg.wait_for_function("() => document.querySelector('#status').innerText.includes('⚠')", timeout=30_000)
    assert "confidence_threshold must be a valid number" in _status(pg)

    _text_box(pg, "#prompt").fill(PROMPT)
    for name, value in KNOBS.items():
        _text_box(pg, f"#canvas-{name.replace('_', '-')}").fill(value)
    pg.locator("#gen-length input[type=range]").fill(str(GEN_LENGTH))
    before = _shown_run(pg)
    pg.click("#run-btn")
    status = _wait_run_ended(pg, before, timeout=300_000)
    assert status.startswith("Done") and "canvas sampler (confidence_threshold 0.9, entropy_bound 2.0)" in status
    trace = json.loads(export_trace(pg, tmp_path / "canvas.json").read_text())
    assert trace["model"]["kind"] == "canvas" and trace["settings"]["canvas_params"] == {
        "confidence_threshold": 0.9, "entropy_bound": 2.0}
    expected = dllm_local.generate(dllm_local.load("tiny-diffusiongemma"), PROMPT, Settings.from_dict(trace["settings"]))
    assert trace["final_ids"] == expected.trace.final_ids and len(trace["steps"]) == len(expected.trace.steps)

    verdicts = pg.inner_text("#grid-verdicts")
    assert "canvas 1 stopped early at step" in verdicts or "canvas 1 ran all" in verdicts, verdicts
    # A step where the sampler renoised some positions and the draft changed, and the step before
    # it kept other positions: the grid shows each step's own.
    answer = len(trace["prompt_ids"])  # the trace's positions are absolute; the grid's, in the answer
    size = trace["model"]["canvas_length"]

    def recorded(step: int, what: str) -> set[int]:
        return {p - answer for p in trace["steps"][step]["canvas"][what]}

    steps = [s["canvas"] for s in trace["steps"]]
    at = next(i for i in range(1, len(steps)) if steps[i]["changed"] and len(steps[i]["accepted"]) < size
              and steps[i]["canvas"] == steps[i - 1]["canvas"] and recorded(i, "accepted") != recorded(i - 1, "accepted"))
    _show_step(pg, at)
    shown = _grid_classes(pg)
    canvas = set(range(steps[at]["start"] - answer, steps[at]["start"] - answer + size))
    assert set(shown["accepted"]) == recorded(at, "accepted")
    assert set(shown["renoised"]) == canvas - recorded(at, "accepted") and shown["renoised"]
    assert set(shown["changed"]) == recorded(at, "changed") and shown["changed"]
    pg.screenshot(path=str(OUT / "diffusion-gemma-step.png"), full_page=True)
    # The cost panel projects the run onto the released checkpoint, experts counted.
    pg.get_by_text("Cost model: this run projected onto a real model").first.click()
    pg.wait_for_function("() => (document.querySelector('#cost-model')?.innerText || '').includes("
                         "'DiffusionGemma-26B-A4B')", timeout=30_000)  # the accordion's content comes once opened
    assert "experts read" in pg.inner_text("#cost-model")
    pg.click("#step-prev")
    pg.wait_for_function("(s) => document.querySelector('#scrubber input[type=number]').value === String(s)",
                         arg=at - 1)
    pg.wait_for_timeout(500)
    back = _grid_classes(pg)
    assert set(back["accepted"]) == recorded(at - 1, "accepted") != set(shown["accepted"])

    # A masked model back: its controls come back, the canvas knobs go.
    _load_model(pg, "tiny")
    pg.wait_for_selector("#canvas-reason", state="hidden")
    assert "masked diffusion" in pg.inner_text("#model-line")
    for selector in MASKED_ONLY:
        assert pg.locator(selector).first.is_enabled(), selector
    for selector in CANVAS_BOXES:
        assert not _text_box(pg, selector).is_visible(), selector
    _captions_say(pg, figures.CAPTIONS)
