"""Switching models never changes the user's settings behind their back (issue 59, item 3), in a
real browser over a real server: a block model's run that decodes more positions than asked says
so and leaves the length control as the user set it; a block model's block cache gives way to
the user's own cache and block size when a masked model is back; and the preset box says when
the controls no longer match the preset it names."""
from __future__ import annotations

from dllm_local.policies import registry
from ui.parts.presets import load_presets

from test_page import _choose, _load_model, _shown_run, _status, browser, page, server  # noqa: F401 - fixtures

PRESETS, _ = load_presets()
DEFAULT = "Fast-dLLM DualCache (paper default)"  # the page's first preset: dual cache, block 32, length 128


def _shown(pg) -> tuple[str, str, str]:
    """The cache policy's label, the block size and the generation length the controls show."""
    return (pg.input_value("#cache input"), pg.input_value("#block-size input[type=number]"),
            pg.input_value("#gen-length input[type=number]"))


def _no_change_said(pg) -> None:
    """Wait until the note under the preset box is empty: the controls match the preset it names."""
    pg.wait_for_function("() => document.querySelector('#preset-changed [data-testid=markdown]')"
                         ".innerText.trim() === ''", timeout=10_000)


def _changed_note(pg) -> str:
    return pg.inner_text("#preset-changed [data-testid=markdown]")


def test_model_switches_keep_the_users_settings_and_the_preset_box_says_when_they_differ(page):  # noqa: F811
    dual = registry.CACHE["dual"].label
    assert _shown(page) == (dual, "32", "128") and page.input_value("#preset input") == DEFAULT
    _no_change_said(page)
    for _ in range(2):  # the ratchet: each round trip's run grew the length
        _load_model(page, "tiny-llada2")
        page.wait_for_function("() => document.querySelector('#model-line').innerText.includes('block diffusion')")
        assert page.input_value("#cache input") == registry.CACHE["block"].label  # the kind's own, and said:
        # The menu offers the block models' presets: the masked one it named waits for a masked model.
        assert "for block-diffusion models" in page.inner_text("#preset")
        assert page.input_value("#preset input") == ""
        _no_change_said(page)
        before = _shown_run(page)
        page.click("#run-btn")
        page.wait_for_function("(prev) => { const r = document.querySelector('#token-grid .dl-run');"
                               " return r && r.dataset.run !== prev && r.dataset.done === '1'; }", arg=before,
                               timeout=60_000)
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Done:')")
        status = _status(page)  # the notice first, then how the run ended
        length = page.input_value("#gen-length input[type=number]")
        assert length == "128", f"the run wrote its length into the control: {length}"
        assert "decodes 134 positions" in status and "length control is left as it is" in status, status
        _load_model(page, "tiny")
        page.wait_for_function("(d) => document.querySelector('#cache input').value === d", arg=dual)
        assert _shown(page) == (dual, "32", "128")  # as before the block model, not a knob's default
        assert page.input_value("#preset input") == DEFAULT  # and the preset it named
        _no_change_said(page)
    # A knob moved: the box still names the preset, and says what no longer matches it.
    page.locator("#gen-length input[type=range]").fill("64")
    page.wait_for_function("() => document.querySelector('#preset-changed').innerText.includes('Generation length')")
    assert DEFAULT in _changed_note(page)
    _choose(page, "#cache", registry.CACHE["prefix"].label)
    page.wait_for_function("() => /cache/i.test(document.querySelector('#preset-changed').innerText)")
    # The preset picked again: its settings, and nothing to say.
    _choose(page, "#preset", "LLaDA baseline")
    _choose(page, "#preset", DEFAULT)
    # Each pick's reply sets the controls; the second waits for the first (always_last), so on a
    # loaded machine the note can be read empty a moment before the second reply lands.
    page.wait_for_function("(d) => document.querySelector('#cache input').value === d", arg=dual, timeout=20_000)
    _no_change_said(page)
    assert _shown(page) == (dual, "32", "128")
