"""The presenter view on one 1280×720 projector screen (issue 59): at every font scale and with
every panel, for the default preset, the Flash-dLLM preset, a block model, the canvas model and
with a branch shown, the page never scrolls (each column scrolls in itself), Force and Re-mask
stay on the first screen, and a plot is never wider than its panel (also right after its panel is
shown); a click on a token opens the Token panel there; a run shifts no layout."""
from __future__ import annotations

import pytest

from test_diffusion_gemma_page import GEN_LENGTH, KNOBS, PROMPT, _text_box
from test_lecture_hall import SCREEN, on_first_screen, press_to, run_preset, server  # noqa: F401 - a fixture
from test_page import _choose, _load_model, _shown_run, _wait_run_ended, browser  # noqa: F401 - a fixture

SCALES = ("1×", "1.5×", "2×")
PANELS = ("Confidence", "KV", "Cache", "Token")
# Each shown plot's drawing against its panel's width (px): plotly keeps a width it was drawn with.
PLOT_WIDTHS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter((g) => g.offsetParent)
  .map((g) => [g.closest('[id$=plot]').id, g.querySelector('.main-svg').getBoundingClientRect().width,
               g.closest('.column').getBoundingClientRect().width])"""

CHIPS_INSIDE = """() => { const grid = document.querySelector('#token-grid').getBoundingClientRect();
  return Array.from(document.querySelectorAll('#token-grid .dl-pad-chip, #token-grid .dl-tok'))
    .every((e) => e.getBoundingClientRect().right <= grid.right + 1); }"""

# A shown plot's words: its title, axis titles, legend and colour bar, each inside the figure and
# none over another (the x title ran over the legend, the y title over the plot title, titles cut).
TEXT_ON_TEXT = """() => { const out = [];
  for (const gd of Array.from(document.querySelectorAll('.js-plotly-plot')).filter((g) => g.offsetParent)) {
    const svg = gd.querySelector('.main-svg').getBoundingClientRect();
    const parts = [['title', '.gtitle'], ['legend', '.legend'], ['colour bar', '.colorbar'],
                   ...Array.from(gd.querySelectorAll('g')).filter((e) => /^g-[xy]\\d*title$/.test(e.getAttribute('class')))
                     .map((e) => [e.getAttribute('class').slice(2), e])]
      .map(([name, s]) => [name, typeof s === 'string' ? gd.querySelector(s) : s])
      .filter(([, e]) => e && e.getBoundingClientRect().width > 0).map(([name, e]) => [name, e.getBoundingClientRect()]);
    for (const [name, r] of parts)
      if (r.left < svg.left - 1 || r.right > svg.right + 1 || r.top < svg.top - 1 || r.bottom > svg.bottom + 1)
        out.push(`${gd.closest('[id$=plot]').id}: ${name} outside the figure`);
    for (let i = 0; i < parts.length; i++) for (let j = i + 1; j < parts.length; j++) {
      const [a, r] = parts[i], [b, q] = parts[j];
      if (Math.min(r.right, q.right) - Math.max(r.left, q.left) > 2 && Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top) > 2)
        out.push(`${gd.closest('[id$=plot]').id}: ${a} over ${b}`);
    }
  }
  return out; }"""


@pytest.fixture(scope="module")
def pg(browser, server):  # noqa: F811 - the fixture imported above
    page = browser.new_page(viewport=SCREEN)
    page.goto(server)
    page.wait_for_selector("#run-btn")
    page.wait_for_function("() => document.body.classList.contains('dl-present')")
    yield page
    page.close()


def show_panel(pg, panel: str) -> None:
    pg.click(f"#panel-choice label:has-text('{panel}')")
    pg.wait_for_function("(p) => document.body.dataset.dlPanel === p", arg=panel.lower())
    pg.wait_for_timeout(400)  # the resize a shown panel's plots are laid out again by


def fits_every_scale_and_panel(pg, scenario: str) -> None:
    """The one-screen conditions at each font scale × panel; the screen set back to 1× after."""
    for scale in SCALES:
        _choose(pg, "#font-scale", scale)
        pg.wait_for_function("(s) => getComputedStyle(document.body).getPropertyValue('--dl-scale').trim() === s",
                             arg=scale.rstrip("×"))
        for panel in PANELS:
            show_panel(pg, panel)
            where = f"{scenario}, {scale}, {panel}"
            assert pg.evaluate("document.documentElement.scrollHeight") <= SCREEN["height"], where
            for selector in ("#run-btn", "#preset", "#step-play", "#scrubber input[type=range]", "#token-grid"):
                assert on_first_screen(pg, selector), f"{where}: {selector}"
            verdict = pg.locator("#grid-verdicts .dl-verdict").first.bounding_box()  # its first lines, at least
            assert verdict and verdict["y"] + 60 <= SCREEN["height"], where
            # Nothing of the grid runs out of its box sideways (the Flash end chip was cut at the column's edge).
            assert pg.evaluate(CHIPS_INSIDE), where
            for plot, drawn, box in pg.evaluate(PLOT_WIDTHS):
                assert drawn <= box + 1, f"{where}: {plot} drawn {drawn:.0f} px in a {box:.0f} px panel"
            assert not pg.evaluate(TEXT_ON_TEXT), f"{where}: {pg.evaluate(TEXT_ON_TEXT)}"
            if panel == "Token":
                for button in ("#force-btn", "#remask-btn"):
                    assert on_first_screen(pg, button), f"{where}: {button}"
    _choose(pg, "#font-scale", "1×")
    show_panel(pg, "Confidence")


def test_the_default_and_the_flash_presets_fit_one_screen_at_every_scale_and_panel(pg):
    for preset in ("Fast-dLLM DualCache (paper default)", "Flash-dLLM as released"):
        assert run_preset(pg, preset).startswith("Done")
        fits_every_scale_and_panel(pg, preset)


def test_a_token_click_opens_the_token_panel_and_a_branch_fits_with_its_controls(pg):
    if not pg.locator("#token-grid .dl-run[data-done='1']").count():
        run_preset(pg, "DualCache, blocks of several steps")
    show_panel(pg, "Confidence")
    pg.click("#grid-verdicts")
    press_to(pg, "Home", 0)  # step 0: most of the answer masked, the branch long
    press_to(pg, "ArrowRight", 1)
    committed = pg.locator("#token-grid [data-token]").first
    position = committed.get_attribute("data-pos")
    committed.click()
    pg.wait_for_function("() => document.body.dataset.dlPanel === 'token'")
    pg.wait_for_function("(p) => document.querySelector('#position-panel').innerText.includes(`Position ${p}`)",
                         arg=position)
    assert on_first_screen(pg, "#remask-btn")
    pg.click("#remask-btn")
    pg.wait_for_function("() => document.querySelector('#branch-status').innerText.includes('Branch done')",
                         timeout=240_000)
    assert on_first_screen(pg, "#branch-grid")
    fits_every_scale_and_panel(pg, "with a branch")
    # A second intervention from the view the first one left: another token, forced.
    show_panel(pg, "Token")
    other = pg.locator("#token-grid [data-token]").nth(1)
    other.click()
    pg.wait_for_function("(p) => document.querySelector('#position-panel').innerText.includes(`Position ${p}`)",
                         arg=other.get_attribute("data-pos"))
    pg.locator("#force-btn").click()
    pg.wait_for_function("(p) => ((document.querySelector('#branch-grid .dl-branch-title') || {}).innerText || '')"
                         ".includes(`position ${p} forced`)", arg=other.get_attribute("data-pos"), timeout=240_000)


@pytest.mark.parametrize("model", ["tiny-sdar", "tiny-diffusiongemma"])
def test_a_block_model_and_the_canvas_model_fit_one_screen(pg, model):
    pg.click("#present input")
    pg.wait_for_function("() => !document.body.classList.contains('dl-present')")
    prompt = _text_box(pg, "#prompt").input_value()
    _load_model(pg, model)
    if model == "tiny-diffusiongemma":  # knobs under which the random model's canvases settle soon
        _text_box(pg, "#prompt").fill(PROMPT)
        for name, value in KNOBS.items():
            _text_box(pg, f"#canvas-{name.replace('_', '-')}").fill(value)
        pg.locator("#gen-length input[type=range]").fill(str(GEN_LENGTH))
    pg.click("#present input")
    pg.wait_for_function("() => document.body.classList.contains('dl-present')")
    before = _shown_run(pg)
    pg.click("#run-btn")
    assert "Done" in _wait_run_ended(pg, before, timeout=240_000)  # after a block model's note on its length
    fits_every_scale_and_panel(pg, model)
    # The tiny model and its prompt back, in presenter view: the menu offers the masked presets the
    # tests after run, and their runs start with no off-task notice.
    pg.click("#present input")
    pg.wait_for_function("() => !document.body.classList.contains('dl-present')")
    _load_model(pg, "tiny")
    _text_box(pg, "#prompt").fill(prompt)
    pg.click("#present input")
    pg.wait_for_function("() => document.body.classList.contains('dl-present')")


def test_a_presenter_run_shifts_no_layout(pg):
    """Cumulative layout shift over a run at 1.5×, as the browser measures it: the status line grew
    during a run and moved what was under it (0.071 here before; 0.276 over a longer run)."""
    run_preset(pg, "DualCache, blocks of several steps")
    _choose(pg, "#font-scale", "1.5×")
    pg.wait_for_function("() => { const gd = document.querySelector('#conf-plot .js-plotly-plot');"
                         " return gd && gd.layout.font.size >= 20; }", timeout=20_000)
    pg.wait_for_timeout(1000)  # the redraw at the new scale settled: only the run's shifts count
    pg.evaluate("""() => { window.dlShift = 0; new PerformanceObserver((list) => {
      for (const e of list.getEntries()) if (!e.hadRecentInput) window.dlShift += e.value; })
      .observe({type: 'layout-shift', buffered: false}); }""")
    before = _shown_run(pg)
    pg.click("#run-btn")
    assert _wait_run_ended(pg, before, timeout=240_000).startswith("Done")
    pg.wait_for_timeout(1000)  # the last step's layout settled
    shift = pg.evaluate("window.dlShift")
    _choose(pg, "#font-scale", "1×")
    assert shift < 0.05, shift


# The shown choice's text, measured in the input's own font, against where the menu's arrow starts.
TEXT_BEFORE_ARROW = """(sel) => { const box = document.querySelector(sel); const input = box.querySelector('input[role=combobox]');
  const arrow = box.querySelector('.icon-wrap').getBoundingClientRect(), style = getComputedStyle(input);
  const ctx = document.createElement('canvas').getContext('2d'); ctx.font = style.font;
  const end = input.getBoundingClientRect().left + parseFloat(style.paddingLeft) + ctx.measureText(input.value).width;
  return [input.value, end, arrow.left + parseFloat(getComputedStyle(box.querySelector('.icon-wrap')).paddingLeft)]; }"""


def test_a_menu_s_choice_ends_before_its_arrow(pg):
    """The step bar's Speed (it read "2 steps/s" under the arrow) and Tune's Knob ("Confidence
    threshold (tau) (unmasking)" under it), at the page's 1280×720."""
    for selector in ("#speed", "#font-scale", "#preset"):
        text, end, arrow = pg.evaluate(TEXT_BEFORE_ARROW, selector)
        assert text and end <= arrow, (selector, text, end, arrow)
    pg.click("button[role=tab]:has-text('Tune')")
    pg.wait_for_selector("#tune-knob input", state="visible")
    text, end, arrow = pg.evaluate(TEXT_BEFORE_ARROW, "#tune-knob")
    pg.click("button[role=tab]:has-text('Run')")
    assert text and end <= arrow, ("#tune-knob", text, end, arrow)
