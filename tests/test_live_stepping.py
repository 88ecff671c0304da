"""Live stepping and what the grid tells: Follow live holds the view still while a run goes on
and catches up when ticked again; a prompt the tiny model has no task for is said so in words;
end-of-text markers are drawn as markers; self-verify's sent-back drafts, the guider's accepted
prefix and the what-if frames stay visible; a one-step trace has an honest step slider; an import
leaves no stale preset name. The tiny model, a real Gradio server and a real browser."""
from __future__ import annotations

import json
import re

import dllm_local
from dllm_local.settings import Settings
from dllm_local.tiny.tasks import TASKS
from ui.engine.queue import throttled
from ui.grid.tokens import OFF_TASK, token_grid_html, token_label
from ui.parts.presets import load_presets
from ui.run.status_line import run_status

from test_page import (OUT, _choose, _shown_run, _status, _wait_done, _wait_policy, browser, page, server,  # noqa: F401
                       start_long_run)

PRESETS, _ = load_presets()
OFF_TASK_PROMPT = "What is the capital of France?"
RAW_SPECIAL = re.compile(r"<\|[^|]*\|>")


def _trace(model, prompt: str, settings: dict, **kwargs) -> dict:
    return dllm_local.generate(model, prompt, Settings.from_dict(settings), **kwargs).trace.to_dict()


def _preset_trace(model, name: str, **kwargs) -> dict:
    return _trace(model, PRESETS[name]["prompt"], PRESETS[name]["settings"], **kwargs)


def _text(grid_html: str) -> str:
    """What a reader sees of the grid: its text, tags and hover titles left out."""
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]*>", " ", grid_html))


# ---------------------------------------------------------------- the grid, from real runs

def test_the_off_task_notice_names_the_task_suite_and_end_markers_are_never_raw(tiny):
    assert all(task in OFF_TASK for task in TASKS) and f"knows {['no', 'one', 'two', 'three', 'four'][len(TASKS)]}" \
        in OFF_TASK
    trace = _trace(tiny, OFF_TASK_PROMPT, {"gen_length": 32, "block_size": 32, "cache": "none", "unmask": "threshold",
                                           "unmask_params": {"threshold": 0.1}})
    ends = [p for p, t in enumerate(trace["final_ids"]) if trace["vocab"][str(t)].startswith("<|")]
    assert ends, "the tiny model's answer to an off-task prompt holds end-of-text tokens"
    for step in range(-1, len(trace["steps"])):
        shown = token_grid_html(trace, step)
        assert OFF_TASK in _text(shown)
        assert not RAW_SPECIAL.search(shown) and not RAW_SPECIAL.search(_text(shown)), step
    final = token_grid_html(trace, len(trace["steps"]) - 1)
    assert len(re.findall(r'class="dl-tok[^"]*\bdl-end\b', final)) == len(ends)
    assert {token_label(trace, trace["final_ids"][p]) for p in ends} <= set(_text(final).split())
    # A task prompt: no notice.
    task = _preset_trace(tiny, "Teaching: straight house")
    assert OFF_TASK not in token_grid_html(task, 0)


def test_self_verify_drafts_sent_back_stay_visible_and_theorem_1_is_told_for_the_drafts(tiny):
    trace = _preset_trace(tiny, "Self-verifying parallel decoding")
    P = len(trace["prompt_ids"])
    sent = {(i, pos - P) for i, s in enumerate(trace["steps"]) for pos, _, _ in s["policy"].get("rejected_at") or []}
    assert sent, "the preset's run sends drafts back"
    at = min(i for i, _ in sent)
    line = re.search(r'<div class="dl-theorem"[^>]*>(.*?)</div>', token_grid_html(trace, at))
    assert line and "sent" in line.group(1) and "drafts back" in line.group(1)
    # Theorem 1 on the drafts (the commits and the sent-back drafts at their confidences this step).
    record = trace["steps"][at]
    conf = dict(zip(record["masked_positions"], record["masked_confidence"]))
    drafts = [c for _, _, c in record["committed"]] + [conf[p] for p, _, _ in record["policy"]["rejected_at"]]
    bound = (len(drafts) + 1) * (1 - min(drafts))
    verdict = "guaranteed" if bound <= 1 else "no guarantee"
    assert f'data-drafts-verdict="{verdict}"' in line.group(0) and f"(n+1)ε = {bound:.2f}" in line.group(1)
    final = token_grid_html(trace, len(trace["steps"]) - 1)
    marked = {int(m) for m in re.findall(r'<span class="dl-tok[^"]*" title="pos (\d+)[^"]*sent draft', final)}
    assert marked == {p for _, p in sent}  # the final frame shows every position whose draft was sent back
    assert final.count('class="dl-sent-back"') == len(sent)


def test_the_guider_line_says_what_it_accepted(tiny, tiny_guider):
    trace = _preset_trace(tiny, "FreeCache + guided diffusion (FlashDLM)", guider=tiny_guider)
    for step, record in enumerate(trace["steps"]):
        shown = token_grid_html(trace, step)
        accepted = record["policy"]["guider_accepted"]
        assert f'data-accepted="{accepted}"' in shown
        assert f"{len(record['committed'])} committed" in shown or "committed anyway" in shown


def test_what_if_frames_lie_outside_the_commit_outline(tiny):
    trace = _preset_trace(tiny, "Fast-dLLM DualCache (paper default)")
    shown = token_grid_html(trace, 0, what_if_threshold=0.5)
    both = re.findall(r'class="dl-tok[^"]*dl-new[^"]*dl-whatif-box[^"]*"[^>]*style="([^"]*)"', shown)
    assert both, "some positions are committed this step and framed by τ′"
    for style in both:
        width = int(re.search(r"outline:(\d+)px", style).group(1))
        offset = int(re.search(r"outline-offset:(-?\d+)px", style).group(1))
        assert offset <= -width and "box-shadow:0 0 0 3px" in style  # the outline inside, the frame outside


def test_a_run_of_one_step_has_one_colour_and_no_step_1(tiny):
    trace = _trace(tiny, PRESETS["LLaDA baseline"]["prompt"], {"gen_length": 32, "block_size": 32, "steps": 1,
                                                               "cache": "none", "unmask": "fixed"})
    assert len(trace["steps"]) == 1
    assert "step 1" not in _text(token_grid_html(trace, 0))


def test_a_due_redraw_waits_for_the_newest_step_and_the_status_says_how_far_behind_the_view_is():
    from dllm_local.trace import fold

    steps = 6
    pending = {"n": 0}

    def events():  # every step arrives with the rest already waiting: only the newest is drawn
        stream = [{"start": {"steps": [], "vocab": {}}}, *({"step": {"step": i}, "vocab": {}} for i in range(steps)),
                  {"end": {"vocab": {}, "text": ""}}]
        for i, event in enumerate(fold(stream)):
            pending["n"] = len(stream) - 1 - i
            yield event

    drawn = [len(t["steps"]) for t, _ in throttled(events(), every=0.0, page_share=1.0, backlog=lambda: pending["n"])]
    assert drawn == [0, 1, steps]  # the empty grid and the first step at once, then the end
    trace = {"steps": [{}] * 40, "settings": {}}
    assert "trails the engine by up to 12 steps: it is redrawn every 0.8 s" in run_status(
        trace, "", None, done=False, behind=12, redraw_s=0.8)
    assert "trails" not in run_status(trace, "", None, done=False, behind=2, redraw_s=0.8)
    assert "holds step 7" in run_status(trace, "", None, done=False, behind=30, frozen_at=7)


# ---------------------------------------------------------------- a real browser

def _slider(pg) -> dict:
    return pg.evaluate("() => { const r = document.querySelector('#scrubber input[type=range]');"
                       " return {value: Number(r.value), max: Number(r.max)}; }")


def _grid_run(pg) -> dict:
    return pg.evaluate("() => { const r = document.querySelector('#token-grid .dl-run');"
                       " return r ? {run: r.dataset.run, steps: Number(r.dataset.steps), done: r.dataset.done,"
                       " html: r.innerHTML} : null; }")


def test_follow_live_unticked_holds_the_view_while_the_run_goes_on_and_ticked_catches_up(page):  # noqa: F811
    start_long_run(page)  # 512 forwards, one token each: the run outlasts the test
    page.locator("#follow input").uncheck()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('The view holds step')",
                         timeout=30_000)
    held, slider = _grid_run(page), _slider(page)
    # The run goes on: the slider reaches further while the view holds.
    page.wait_for_function("(m) => Number(document.querySelector('#scrubber input[type=range]').max) >= m + 8",
                         arg=slider["max"], timeout=90_000)
    later = _slider(page)
    assert later["value"] == slider["value"] and _grid_run(page)["html"] == held["html"]
    assert page.locator("#scrubber input[type=range]").is_visible() and not page.locator(".error").count()
    assert f"The view holds step {slider['value']}" in _status(page)
    running = re.search(r"Running… (\d+) steps so far", _status(page))
    assert running and int(running.group(1)) >= later["max"] + 1
    page.screenshot(path=str(OUT / "follow-held.png"), full_page=True)

    page.locator("#follow input").check()  # catches up at once, then follows
    page.wait_for_function("(m) => { const r = document.querySelector('#scrubber input[type=range]');"
                         " return Number(r.value) >= m && Number(r.value) === Number(r.max); }", arg=later["max"],
                         timeout=30_000)
    page.wait_for_function("(s) => { const r = document.querySelector('#token-grid .dl-run');"
                         " return r && Number(r.dataset.steps) > s; }", arg=later["max"] + 1, timeout=30_000)
    assert "The view holds" not in _status(page)
    page.click("#stop-btn")
    _wait_done(page, word="Stopped", timeout=60_000)


def test_an_off_task_prompt_is_told_before_and_after_the_run(page):  # noqa: F811
    box = page.locator("#prompt textarea")
    told = "(t) => document.querySelector('#status').innerText.includes(t)"
    box.fill(OFF_TASK_PROMPT)
    page.wait_for_function(told, arg=OFF_TASK[:40], timeout=15_000)  # before the run
    box.fill(PRESETS["Teaching: straight house"]["prompt"])  # a task prompt again: the word goes
    page.wait_for_function(f"(t) => !({told})(t)", arg=OFF_TASK[:40], timeout=15_000)
    box.fill(OFF_TASK_PROMPT)
    page.wait_for_function(told, arg=OFF_TASK[:40], timeout=15_000)
    before = _shown_run(page)
    page.click("#run-btn")
    page.wait_for_function("(prev) => { const r = document.querySelector('#token-grid .dl-run');"
                         " return r && r.dataset.run !== prev && r.dataset.done === '1'; }", arg=before,
                         timeout=120_000)
    status = _wait_done(page)
    assert OFF_TASK in status and "✓" not in status and "✗" not in status
    assert OFF_TASK in page.inner_text("#token-grid .dl-off-task")
    grid = page.inner_text("#token-grid")
    titles = " ".join(page.eval_on_selector_all("#token-grid [title]", "els => els.map(e => e.title)"))
    assert not RAW_SPECIAL.search(grid) and not RAW_SPECIAL.search(titles)
    page.screenshot(path=str(OUT / "off-task.png"), full_page=True)


def test_an_import_names_the_preset_it_equals_or_none_and_a_one_step_trace_hides_the_slider(page, tiny, tmp_path):  # noqa: F811
    name = "Fast-dLLM DualCache (paper default)"
    same = tmp_path / "preset.json"
    same.write_text(json.dumps(_preset_trace(tiny, name)))
    one = tmp_path / "one-step.json"
    one.write_text(json.dumps(_trace(tiny, PRESETS[name]["prompt"], {"gen_length": 32, "block_size": 32, "steps": 1,
                                                                     "cache": "none", "unmask": "fixed"})))

    def import_(path) -> None:
        with page.expect_file_chooser() as chooser:
            page.click("#import-btn")
        chooser.value.set_files(str(path))
        page.wait_for_function("(s) => document.querySelector('#status').innerText.includes('Replaying')"
                             " && document.querySelector('#token-grid').innerText.includes(`after step ${s - 1} `)",
                             arg=len(json.loads(path.read_text())["steps"]), timeout=30_000)

    def preset_box_reads(name: str) -> None:
        page.wait_for_function("(n) => document.querySelector('#preset input').value === n", arg=name, timeout=15_000)

    _choose(page, "#preset", "LLaDA baseline")
    _wait_policy(page, "unmask", "fixed")
    import_(one)
    preset_box_reads("")  # settings of no preset: the old name goes, and its description
    page.wait_for_function("() => document.querySelector('#preset-info').innerText.trim() === ''")
    assert not page.locator("#scrubber").is_visible()  # one step: nothing to scrub, no fake step 1
    assert "after step 0" in page.inner_text("#token-grid") and "step 1" not in page.inner_text("#token-grid")

    import_(same)
    preset_box_reads(name)
    page.wait_for_selector("#scrubber input[type=range]", state="visible")
    slider = _slider(page)
    assert slider["max"] == len(json.loads(same.read_text())["steps"]) - 1 == slider["value"]
