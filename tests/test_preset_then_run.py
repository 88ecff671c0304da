"""A preset chosen and Run clicked in the same moment runs the preset: the browser sends Run the
controls it shows at the click, so a click that lands before the preset's reply has reached them
(a busy machine, a slow network) must still decode the preset's settings, not the previous ones."""
from __future__ import annotations

import json

from ui.parts.presets import load_presets
from ui.parts.replay import prompt_of

from test_page import _choose, _shown_run, _wait_run_ended, browser, export_trace, page, server  # noqa: F401 - fixtures

PRESETS, _ = load_presets()
FLASH = "Flash-dLLM as released"


def test_a_preset_then_run_at_once_runs_the_preset_even_before_its_reply_lands(page, tmp_path):  # noqa: F811
    # The preset's reply is held until Run has been clicked: the loaded machine of the CI failure,
    # made certain rather than likely (the click reads the controls the page showed before the preset).
    held, released = [], []
    page.route("**/gradio_api/run/predict", lambda route: route.continue_() if released else held.append(route))
    before = _shown_run(page)
    _choose(page, "#preset", FLASH)
    for _ in range(50):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the preset's change never reached the server"
    assert PRESETS[FLASH]["description"][:40] not in page.inner_text("#preset-info")  # not landed yet
    page.click("#run-btn")
    page.wait_for_function("() => document.querySelector('#status').innerText.length > 0", timeout=30_000)
    released.append(True)
    for route in held:
        route.continue_()
    assert _wait_run_ended(page, before).startswith("Done")
    trace = json.loads(export_trace(page, tmp_path / "flash.json").read_text())
    wanted = PRESETS[FLASH]["settings"]
    assert (trace["settings"]["cache"], trace["settings"]["unmask"]) == (wanted["cache"], wanted["unmask"])
    assert prompt_of(trace) == PRESETS[FLASH]["prompt"]
    # Once the reply lands the page shows the preset too: what ran is what the controls show.
    page.wait_for_function("(d) => document.querySelector('#preset-info').innerText.includes(d)",
                           arg=PRESETS[FLASH]["description"][:40])
