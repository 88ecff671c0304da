"""Every preset in a real browser: each view draws something or says in words why it cannot, the KV
panel opens on a middle layer with the fixed colour scale, masked positions show their top
candidates, the what-if slider reframes the grid without a model run, the straight-house step reads
"no guarantee", and every verdict line states the figures of the run's exported trace.
``DLLM_SCREENSHOTS=docs/presets`` also saves a screenshot of each preset there (the pictures of
the README and docs/page.md), and two of it in presenter view at 1.5×, light and dark."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import trace_facts
from ui.parts.presets import load_presets, presets_for

from test_page import OUT, _choose, _shown_run, _wait_run_ended, browser, export_trace, server  # noqa: F401 - fixtures

PRESETS, _ = load_presets()
PLOTS = ("#conf-plot", "#kv-plot", "#cache-plot")
SHOTS = os.environ.get("DLLM_SCREENSHOTS")


def _plot(pg, selector: str) -> dict:
    """What plotly holds for a figure: its traces (name, type, scale, finite cells or points) and its
    words. Grids sent as typed arrays ({dtype, bdata, shape}) are decoded here."""
    return pg.evaluate(
        """(sel) => { const gd = document.querySelector(`${sel} .js-plotly-plot`);
             if (!gd || !gd.data) return null;
             const values = (z) => {
               if (!z) return [];
               if (Array.isArray(z)) return z.flat();
               if (ArrayBuffer.isView(z)) return Array.from(z);
               if (z.bdata) {
                 const bytes = Uint8Array.from(atob(z.bdata), (c) => c.charCodeAt(0));
                 const kind = {f4: Float32Array, f8: Float64Array, i1: Int8Array, u1: Uint8Array, i2: Int16Array,
                               i4: Int32Array}[z.dtype] || Float64Array;
                 return Array.from(new kind(bytes.buffer));
               }
               return [];
             };
             const cells = (t) => t.type === 'heatmap' ? values(t.z).filter((v) => v !== null && !Number.isNaN(v)).length
                                                         : values(t.x).length;
             return {traces: gd.data.map((t) => ({name: t.name, type: t.type, zmin: t.zmin, zmax: t.zmax, cells: cells(t)})),
                     words: (gd.layout.annotations || []).map((a) => a.text)}; }""",
        selector,
    )


@pytest.fixture(scope="module")
def pg(browser, server):  # noqa: F811 - the fixtures imported above
    page = browser.new_page(viewport={"width": 1280, "height": 720})  # a projector's size
    page.goto(server)
    page.wait_for_selector("#run-btn")
    yield page
    page.close()


def _run_preset(pg, name: str) -> str:
    """Choose the preset ``name``, run it, and return the status line once the run has ended."""
    _choose(pg, "#preset", name)
    pg.wait_for_function("(d) => document.querySelector('#preset-info').innerText.includes(d)",
                         arg=PRESETS[name]["description"][:40])
    before = _shown_run(pg)
    pg.click("#run-btn")
    return _wait_run_ended(pg, before)


@pytest.mark.parametrize("name", presets_for(PRESETS, {"kind": "masked"}))  # the page's tiny model (the others: test_family_presets)
def test_every_preset_draws_its_lesson(pg, name, tmp_path):
    preset = PRESETS[name]
    status = _run_preset(pg, name)
    assert status.startswith("Done"), status
    for selector in PLOTS:
        pg.wait_for_function("(s) => { const gd = document.querySelector(`${s} .js-plotly-plot`);"
                             " return gd && gd.data; }", arg=selector, timeout=30_000)
    pg.wait_for_timeout(300)  # the last redraw of the plots lands after the status
    for selector in PLOTS:
        shown = _plot(pg, selector)
        drawn = sum(t["cells"] for t in shown["traces"])
        assert drawn > 0 or shown["words"], f"{name}: {selector} is empty axes"
    _check_verdicts(pg, preset, tmp_path)

    # The KV panel: a middle layer (or the preset's), one fixed scale for every cosine view.
    view = preset.get("view", {})
    layer = pg.input_value("#kv-layer input")
    assert layer == (f"layer {view['layer']}" if "layer" in view else "layer 3"), layer
    kv = _plot(pg, "#kv-plot")
    heat = [t for t in kv["traces"] if t["type"] == "heatmap" and t["name"] != "cached"]
    assert all((t["zmin"], t["zmax"]) == (0, 1) for t in heat) and (heat or kv["words"])

    steps = int(pg.locator("#token-grid .dl-run").get_attribute("data-steps"))
    if steps > 1:
        # An early step where the current block still has masked positions: they show the model's
        # top candidates on hover (a policy that fills a block at once leaves none at step 0).
        pg.locator("#follow input").uncheck()
        masked = pg.locator("#token-grid .dl-masked[title*='top candidates']")
        for step in range(min(steps - 1, 6)):
            _set_slider(pg, "#scrubber", step)
            pg.wait_for_function("(s) => document.querySelector('#token-grid').innerText.includes(`after step ${s} `)",
                                 arg=step)
            if masked.count():
                break
        if masked.count():
            assert re.search(r"top candidates: '.+' 0\.\d\d", masked.first.get_attribute("title"))
        else:  # only a run that commits each block whole in one forward leaves nothing masked to hover
            block = PRESETS[name]["settings"]["block_size"]
            assert set(_trace_steps(pg)) == {block}, f"{name}: no top-3 hover on masked positions"
    # What-if: a threshold moves the green frames on the grid, and no run starts.
    status = pg.inner_text("#status [data-testid=markdown]")
    _set_slider(pg, "#what-if", 0.5)
    pg.wait_for_selector("#token-grid .dl-whatif-line", timeout=10_000)
    framed = pg.locator("#token-grid .dl-whatif-box").count()
    line = pg.inner_text("#token-grid .dl-whatif-line")
    assert framed > 0 or "greedy" in line, line
    assert pg.inner_text("#status [data-testid=markdown]") == status  # the grid redrawn, no model run
    _set_slider(pg, "#what-if", 0)
    pg.wait_for_function("() => !document.querySelector('#token-grid .dl-whatif-line')")
    if steps > 1:
        _set_slider(pg, "#scrubber", steps - 1)
        pg.locator("#follow input").check()  # the next preset's run is followed live again
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        _settled(pg)
        pg.screenshot(path=str(Path(SHOTS) / f"{_slug(name)}.png"), full_page=True)
        _presenter_shots(pg, Path(SHOTS) / _slug(name))


def _plots_font_at_least(pg, size: float) -> None:
    pg.wait_for_function("(n) => ['#conf-plot', '#kv-plot', '#cache-plot'].every((s) => {"
                         " const gd = document.querySelector(`${s} .js-plotly-plot`);"
                         " return gd && gd.layout && gd.layout.font.size >= n; })", arg=size, timeout=30_000)


def _settled(pg) -> None:
    """At the top of the page, once no update is pending (Gradio fades a view while one is)."""
    pg.evaluate("window.scrollTo(0, 0)")
    pg.wait_for_function("() => !document.querySelector('.pending')", timeout=30_000)
    pg.wait_for_timeout(500)


def _presenter_shots(pg, stem: Path) -> None:
    """The preset as a projector shows it: presenter view at 1.5×, light and dark, one screen each
    (``<stem>-present.png``, ``<stem>-present-dark.png``); the page left as it was."""
    pg.locator("#present input").check()
    _choose(pg, "#font-scale", "1.5×")
    _plots_font_at_least(pg, 20)
    _settled(pg)
    assert pg.locator("#run-btn").bounding_box()["y"] < 720
    pg.screenshot(path=f"{stem}-present.png")
    _choose(pg, "#theme", "dark")
    pg.wait_for_function("() => document.querySelector('#conf-plot .js-plotly-plot').layout.paper_bgcolor !== 'white'")
    _settled(pg)
    pg.screenshot(path=f"{stem}-present-dark.png")
    _choose(pg, "#theme", "light")
    _choose(pg, "#font-scale", "1×")
    pg.locator("#present input").uncheck()
    pg.wait_for_function("() => !document.body.classList.contains('dl-present')")


def test_straight_house_reads_no_guarantee_and_invalid(pg):
    name = next(n for n in PRESETS if "straight house" in n)
    _choose(pg, "#preset", name)
    pg.wait_for_function("(d) => document.querySelector('#preset-info').innerText.includes(d)",
                         arg=PRESETS[name]["description"][:40])
    before = _shown_run(pg)
    pg.click("#run-btn")
    status = _wait_run_ended(pg, before)
    assert "straight house" in status and "— ✗ invalid" in status, status  # greedy: both argmaxes, two hands
    first = next(i for i, s in enumerate(_trace_steps(pg)) if s > 1)  # the step that wrote both words
    if int(pg.locator("#token-grid .dl-run").get_attribute("data-steps")) > 1:
        pg.locator("#follow input").uncheck()
        _set_slider(pg, "#scrubber", first)
    theorem = pg.locator("#token-grid .dl-theorem")
    assert theorem.count() and "no guarantee" in theorem.inner_text()
    assert theorem.get_attribute("data-verdict") == "no guarantee"


def _check_verdicts(pg, preset: dict, tmp_path: Path) -> None:
    """Each verdict line beside a view states the figures of the run's own exported trace, worked
    out again here from the file (``trace_facts``), at the run's last step."""
    trace = json.loads(export_trace(pg, tmp_path / "trace.json").read_text())
    layer = pg.input_value("#kv-layer input").removeprefix("layer ")
    which = preset.get("view", {}).get("which", "v")
    expected = {"#grid-verdicts": [*trace_facts.theorem1_lines(trace), *trace_facts.answer_lines(trace, preset["prompt"]),
                                   *trace_facts.verification_lines(trace), *trace_facts.acceptance_lines(trace)],
                "#kv-verdicts": trace_facts.kv_lines(trace, "mean" if layer.startswith("all") else layer, which),
                "#cache-verdicts": trace_facts.cache_lines(trace)}
    for box, lines in expected.items():
        shown = pg.inner_text(box)
        for line in lines:
            assert line in shown, f"{preset['name']}: {box} lacks {line!r}; it reads {shown!r}"


def _trace_steps(pg) -> list[int]:
    """Commits per step of the run shown, read from the confidence heatmap's commit marks."""
    return pg.evaluate("""() => { const gd = document.querySelector('#conf-plot .js-plotly-plot');
        const commits = gd.data.find((t) => t.name === 'commit'); const per = [];
        for (const y of commits.y) per[y] = (per[y] || 0) + 1; return Array.from(per, (v) => v || 0); }""")


def _set_slider(pg, selector: str, value: float) -> None:
    """Type a value into a Gradio slider's number box (what a person does for an exact value)."""
    box = pg.locator(f"{selector} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


OUT.mkdir(exist_ok=True)


# ---------------------------------------------------------------- Flash-dLLM as released

FLASH = "Flash-dLLM as released"


def _flash_maps(pg) -> dict:
    """The cache panel's position map as plotly holds it: per kind (a heatmap named after it), the
    answer positions (x) of its cells in each step's row."""
    return pg.evaluate(
        """() => { const gd = document.querySelector('#cache-plot .js-plotly-plot');
             const flat = (a) => {
               if (Array.isArray(a)) return {v: a.flat(), shape: Array.isArray(a[0]) ? [a.length, a[0].length] : [a.length]};
               const bytes = Uint8Array.from(atob(a.bdata), (c) => c.charCodeAt(0));
               const kind = {f4: Float32Array, f8: Float64Array, i1: Int8Array, u1: Uint8Array, i2: Int16Array,
                             i4: Int32Array, u2: Uint16Array, u4: Uint32Array}[a.dtype];
               const v = Array.from(new kind(bytes.buffer));
               const shape = typeof a.shape === 'string' ? a.shape.split(',').map(Number) : (a.shape || [v.length]);
               return {v, shape}; };
             const maps = {};
             for (const t of gd.data.filter((t) => t.type === 'heatmap')) {
               const z = flat(t.z), x = flat(t.x).v, cols = z.shape[1], rows = [];
               for (let r = 0; r < z.shape[0]; r++) {
                 rows.push(x.filter((_, c) => z.v[r * cols + c] === 1)); }
               maps[t.name] = rows; }
             return maps; }""")


def _grid_positions(pg, css: str) -> list[int]:
    """Answer positions of the grid's boxes with the class ``css`` (inside collapsed chips too)."""
    return pg.evaluate("""(css) => Array.from(document.querySelectorAll(`#token-grid .dl-tok.${css}`),
                              (b) => Number(b.title.match(/^pos (\\d+) /)[1]))""", css)


def test_flash_dllm_as_released_shows_its_window_tracked_positions_and_accepted_drafts(pg, tmp_path):
    """The released pair's preset, run in the browser: at every step the grid bars exactly the
    positions the trace's window scored and ticks the drafts its verify forward accepted, the cache
    panel's map holds the window and the tracked positions of every step up to the one shown, and
    the verdict under the grid counts the accepted drafts and verify forwards of the exported trace."""
    assert _run_preset(pg, FLASH).startswith("Done")
    trace = json.loads(export_trace(pg, tmp_path / "flash.json").read_text())
    steps, P = trace["steps"], len(trace["prompt_ids"])
    assert trace["settings"]["cache"] == "flash" and trace["settings"]["unmask"] == "flash_verify"
    accepted = {i: len(s["policy"]["accepted_at"]) for i, s in enumerate(steps) if s["policy"]["accepted_at"]}
    assert accepted, "the preset's prompt must have drafts accepted by the verify forward"

    verdict = pg.locator("#grid-verdicts .dl-verdict[data-lesson='acceptance']")
    total, forwards = sum(accepted.values()), sum(s["forwards"] - 1 for s in steps)
    assert verdict.get_attribute("data-status") == "holds"
    assert f"{total} draft{'s' if total > 1 else ''} accepted over {forwards} verify forward" in verdict.inner_text()
    for i, n in accepted.items():
        assert f"{n} at step {i}" in verdict.inner_text()

    if len(steps) > 1:
        pg.locator("#follow input").uncheck()
    for shown, record in enumerate(steps):
        if len(steps) > 1:
            _set_slider(pg, "#scrubber", shown)
        pg.wait_for_function("(s) => document.querySelector('#token-grid').innerText.includes(`after step ${s} `)",
                             arg=shown)
        window = sorted(p - P for p in record["policy"]["window"])
        assert sorted(_grid_positions(pg, "dl-window")) == window, f"step {shown}"
        assert f"the {len(window)} positions Flash-Cache scored this step" in pg.inner_text("#token-grid .dl-legend")
        assert sorted(_grid_positions(pg, "dl-accepted")) == sorted(p - P for p, _, _ in record["policy"]["accepted_at"])
        pg.wait_for_function("(n) => document.querySelector('#cache-plot .js-plotly-plot').data"
                             ".some((t) => t.name === 'window' && (t.z.shape ? String(t.z.shape).split(',')[0] == n"
                             " : t.z.length == n))", arg=shown + 1)
        maps = _flash_maps(pg)
        assert len(maps["window"]) == shown + 1
        for row, earlier in enumerate(steps[: shown + 1]):
            assert maps["window"][row] == sorted(p - P for p in earlier["policy"]["window"])
            assert maps.get("tracked", [[]] * (shown + 1))[row] == sorted(p - P for p in earlier["policy"]["tracked"])
    assert maps["tracked"][-1], "a step after the first recomputes tracked positions"
    # The bar under a window box is the window's purple, outside the box (no other mark uses it).
    shadow = pg.evaluate("() => getComputedStyle(document.querySelector('#token-grid .dl-tok.dl-window')).boxShadow")
    assert "rgb(106, 61, 154)" in shadow, shadow
    pg.locator("#follow input").check()
    pg.screenshot(path=str(OUT / "flash-dllm-as-released.png"), full_page=True)
