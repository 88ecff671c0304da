"""A block-diffusion model on the page, in a real browser over a real Gradio server and engine:
the page started on the tiny random SDAR (block 4) says what it is, its controls start at the block
cache and its trained block, a run's KV view draws the stored blocks exact and says why (legend,
caption, verdict), and the status counts the K/V store forwards apart from NFE; a masked model
loaded after it offers its own cache choices. A screenshot of the block run is left in
test-output/block-page.png."""
from __future__ import annotations

import pytest

from dllm_local.policies import registry
from dllm_local.settings import knob
from dllm_local.tiny_checkpoints.random_sdar import build_checkpoint
from ui.block.parts import EXACT_WORDS
from ui.block.lessons import CLAIM
from ui.figures.stored import LEGEND
from ui.parts.presets import load_presets, presets_for

from test_page import OUT, _choose, _free_port, _wait_run_ended, browser  # noqa: F401

PROMPT = "What is 2 plus 3?"


@pytest.fixture(scope="module")
def block_server(tmp_path_factory):
    import app

    from ui.page import LAUNCH_OPTIONS

    folder = build_checkpoint(tmp_path_factory.mktemp("models") / "tiny-sdar")
    page, session = app.create(app.parse_args(["--model", str(folder), "--models-dir", str(folder.parent)]))
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **LAUNCH_OPTIONS)
    yield url
    page.close()
    session.close()


def test_a_block_model_runs_on_the_page_and_its_kv_view_shows_the_stored_blocks_exact(browser, block_server):  # noqa: F811
    pg = browser.new_page(viewport={"width": 1500, "height": 2000})
    pg.goto(block_server)
    pg.wait_for_selector("#run-btn")
    pg.wait_for_function("() => document.querySelector('#model-line').innerText.includes('block diffusion, block 4')")
    assert pg.input_value("#cache input") == registry.CACHE["block"].label
    assert pg.input_value("#block-size input[type=number]") == "4"
    assert "for block-diffusion models" in pg.inner_text("#preset")  # the menu offers the block presets
    pg.click("#preset input")
    offered = [o.replace("✓", "").strip() for o in pg.get_by_role("option").all_inner_texts()]
    assert offered == presets_for(load_presets()[0], {"kind": "block", "family": "sdar"}) and offered
    pg.keyboard.press("Escape")
    pg.fill("#prompt textarea", PROMPT)
    pg.locator("#gen-length input[type=range]").fill("8")
    pg.wait_for_function("() => document.querySelector('#gen-length input[type=number]').value === '8'")
    pg.click("#run-btn")
    status = _wait_run_ended(pg, "")
    assert "K/V store forward" in status
    pg.wait_for_function("(l) => document.querySelector('#kv-plot').textContent.includes(l)", arg=LEGEND)
    assert EXACT_WORDS in pg.inner_text("#panel-kv")  # the caption
    assert CLAIM in pg.inner_text("#kv-verdicts")
    OUT.mkdir(exist_ok=True)
    pg.screenshot(path=str(OUT / "block-page.png"), full_page=True)
    # A masked model back: its cache choices lack the block cache, and the choice is one it takes.
    pg.click("#model-box button")
    _choose(pg, "#model-pick", "tiny")
    pg.click("#load-model-btn")
    pg.wait_for_function("() => document.querySelector('#status').innerText.includes('Loaded tiny.')", timeout=120_000)
    pg.wait_for_function("() => document.querySelector('#model-line').innerText.includes('masked diffusion')")
    # A page started on a block model had no masked cache of the user's to keep (its preset, the
    # block models', set the block cache): the masked model starts at the cache knob's default.
    pg.wait_for_function("(d) => document.querySelector('#cache input').value === d",
                         arg=registry.CACHE[knob("cache").default].label)
    assert "for masked-diffusion models" in pg.inner_text("#preset")
    pg.click("#cache input")
    options = [o.replace("✓", "").strip() for o in pg.get_by_role("option").all_inner_texts()]  # ✓: the chosen one
    assert registry.CACHE["dual"].label in options and registry.CACHE["block"].label not in options
    assert pg.input_value("#preset input") == ""  # no masked preset was named: the controls are the defaults
    pg.close()
