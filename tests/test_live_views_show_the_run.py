"""What the views show is the run they say: Follow live unticked right after Run shows the new run
(held at its first step), never the previous run's numbers; an imported trace draws its KV
verdict for the layer and K/V the KV panel's boxes show, in the same update. The tiny model, a
real Gradio server and a real browser."""
from __future__ import annotations

import json
import re

import dllm_local
from dllm_local.settings import Settings
from ui.parts.presets import load_presets

from test_page import (OUT, _choose, _shown_run, _status, _wait_done, _wait_policy, browser, page,  # noqa: F401
                       server)

PRESETS, _ = load_presets()

# Every animation frame (what a viewer sees), the KV panel's boxes and the KV verdict's own words
# ("K, layer 2, over the run: ..."); a frame where they name different layers or K/V is kept.
WATCH_KV_PANEL = """() => {
  const seen = window.__dlKV = {frames: 0, mismatches: [], last: null};
  const box = (label) => [...document.querySelectorAll('.block')].find(
      b => b.querySelector('[data-testid=block-info]')?.innerText.trim() === label);
  const frame = () => {
    const layer = document.querySelector('#kv-layer input')?.value;
    const which = box('K or V')?.querySelector('input:checked')?.value;
    const said = (document.querySelector('#kv-verdicts')?.innerText || '').match(
        /\\b([KV]), (layer \\d+|all layers \\(mean\\)), over the run/);
    seen.frames += 1;
    if (said) {
      seen.last = `${said[1]} / ${said[2]} (boxes: ${which} / ${layer})`;
      if (said[1] !== (which || '').toUpperCase() || said[2] !== layer) seen.mismatches.push(seen.last);
    }
    if (!seen.stop) requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}"""


def _numbers(pg) -> str:
    return pg.inner_text("#numbers")


def test_follow_live_unticked_right_after_run_shows_the_new_run_never_the_previous_ones_numbers(page):  # noqa: F811
    page.click("#run-btn")  # a short run first: its grid and numbers are what must not stay on screen
    _wait_done(page)
    previous, previous_numbers = _shown_run(page), _numbers(page)
    _choose(page, "#preset", "LLaDA baseline")
    _wait_policy(page, "unmask", "fixed")
    for slider in ("#gen-length", "#steps"):  # 512 forwards, one token each: the run outlasts the test
        page.locator(f"{slider} input[type=range]").fill("512")
        page.wait_for_function(f"() => document.querySelector('{slider} input[type=number]').value === '512'")
    # Unticked before the run draws anything (here at the click; right after it, the run's first
    # redraw comes first or not, by chance): the run draws its first step, then holds it.
    page.locator("#follow input").uncheck()
    page.click("#run-btn")
    # The new run is on screen, held at its first step, while the run goes on.
    page.wait_for_function("(prev) => { const r = document.querySelector('#token-grid .dl-run');"
                           " return r && r.dataset.run !== prev && Number(r.dataset.steps) >= 1; }",
                           arg=previous, timeout=60_000)
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('The view holds step')",
                           timeout=30_000)
    held = page.evaluate("() => document.querySelector('#token-grid .dl-run').innerHTML")
    step = int(re.search(r"The view holds step (\d+)", _status(page)).group(1))
    assert f"after step {step} " in page.inner_text("#token-grid") and _numbers(page) != previous_numbers
    maximum = page.evaluate("() => Number(document.querySelector('#scrubber input[type=range]').max)")
    page.wait_for_function("(m) => Number(document.querySelector('#scrubber input[type=range]').max) >= m + 8",
                           arg=maximum, timeout=90_000)  # the run goes on; the view holds its step
    assert page.evaluate("() => document.querySelector('#token-grid .dl-run').innerHTML") == held
    page.screenshot(path=str(OUT / "follow-unticked-at-run.png"), full_page=True)
    page.click("#stop-btn")
    _wait_done(page, word="Stopped", timeout=60_000)


def test_an_import_draws_the_kv_verdict_for_the_layer_and_k_or_v_the_panel_shows(page, tiny, tmp_path):  # noqa: F811
    name = "Teaching: why caching works"  # its preset opens the KV panel on layer 2, K: not the page's default
    view = PRESETS[name]["view"]
    path = tmp_path / "caching.json"
    result = dllm_local.generate(tiny, PRESETS[name]["prompt"], Settings.from_dict(PRESETS[name]["settings"]))
    path.write_text(json.dumps(result.trace.to_dict()))
    before = page.evaluate("() => document.querySelector('#kv-layer input').value")
    assert before != f"layer {view['layer']}"
    page.evaluate(WATCH_KV_PANEL)
    with page.expect_file_chooser() as chooser:
        page.click("#import-btn")
    chooser.value.set_files(str(path))
    said = f"{view['which'].upper()}, layer {view['layer']}, over the run"
    page.wait_for_function("(s) => document.querySelector('#status').innerText.includes('Replaying')"
                           " && document.querySelector('#kv-verdicts').innerText.includes(s)", arg=said,
                           timeout=30_000)
    page.wait_for_timeout(3_000)  # the preset box names the trace's preset: nothing after may flip the panel
    seen = page.evaluate("() => { window.__dlKV.stop = true; return window.__dlKV; }")
    assert seen["frames"] > 10 and not seen["mismatches"], seen["mismatches"][:5]
    assert page.evaluate("() => document.querySelector('#kv-layer input').value") == f"layer {view['layer']}"
    assert said in page.inner_text("#kv-verdicts")
    title = page.evaluate("() => document.querySelector('#kv-plot .gtitle')?.textContent || ''")
    assert re.search(rf"layer {view['layer']}\b.*· {view['which'].upper()}$", title), title
