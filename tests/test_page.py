"""The page: controls logic, the session, an in-process server with gradio_client, a real browser."""
from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

import dllm_local
from dllm_local.errors import EngineError, ModelLoadError, SequenceTooLongError, SettingsError
from dllm_local.policies import registry
from dllm_local.serving.session import Session
from dllm_local.settings import Settings
from dllm_local.tiny.tasks import verdict
from ui.run.controls import controls_from_settings, fit_block, settings_from_controls, visible_knobs
from ui.parts.presets import load_presets

OUT = Path(__file__).resolve().parents[1] / "test-output"
ARITHMETIC = "Ben has 9 coins, finds 8 more, then gives away 9. How many now?"


def test_every_shipped_preset_is_valid_and_round_trips_through_the_controls():
    presets, problems = load_presets()
    assert problems == [] and len(presets) >= 8
    for p in presets.values():
        settings, notice = settings_from_controls(controls_from_settings(p["settings"]))
        assert notice == ""
        want = Settings.from_dict(p["settings"])
        got = Settings.from_dict(settings)
        for knob in ("gen_length", "block_size", "cache", "unmask", "exact_drift"):
            assert getattr(got, knob) == getattr(want, knob)
        for key, value in want.unmask_params.items():
            assert got.unmask_params[key] == value


def test_a_broken_preset_gives_a_message_and_the_rest_still_load(tmp_path):
    good = {"name": "ok", "description": "", "settings": {"cache": "dual"}}
    (tmp_path / "a.json").write_text(json.dumps(good))
    (tmp_path / "b.json").write_text("{not json")
    (tmp_path / "c.json").write_text(json.dumps({"name": "bad", "settings": {"block_size": 24, "gen_length": 64}}))
    presets, problems = load_presets(tmp_path)
    assert list(presets) == ["ok"]
    assert len(problems) == 2 and "b.json" in problems[0] and "block_size" in problems[1]


def test_controls_show_only_the_chosen_policies_knobs_and_fit_the_block():
    shown = visible_knobs("dual", "threshold")
    assert {name for name, visible in shown.items() if visible} == {"unmask.threshold", "cache.refresh_every"}
    assert {"steps", "unmask.factor", "cache.floor", "cache.budget", "unmask.rho", "unmask.window",
            "unmask.rule"} <= set(shown)
    assert visible_knobs("none", "self_verify")["unmask.rho"] and not visible_knobs("none", "fixed")["unmask.threshold"]
    assert fit_block(128, 32) == (128, 32, "")
    length, block, notice = fit_block(100, 32)
    assert (length, block) == (128, 32) and "adjusted from 100 to 128" in notice


def test_a_sliding_cache_with_a_block_by_block_policy_runs_by_threshold_and_says_so():
    from dllm_local import Settings

    values = controls_from_settings({"cache": "flash", "unmask": "fixed"})
    settings, notice = settings_from_controls(values)
    assert settings["unmask"] == "threshold" and "commits by threshold instead" in notice
    Settings.from_dict(settings)  # a pair that decodes together
    assert settings_from_controls(controls_from_settings({"cache": "flash", "unmask": "flash_verify"}))[1] == ""


def test_throttled_redraws_keep_the_first_step_and_the_final_state():
    from dllm_local.trace import fold
    from ui.engine.queue import throttled

    def events():  # as Session.run streams them
        steps = [{"step": i} for i in range(5)]
        yield from fold([{"start": {"steps": [], "vocab": {}}},
                         *({"step": step, "vocab": {str(i): "x"}} for i, step in enumerate(steps)),
                         {"end": {"vocab": {}, "text": "x"}}])

    drawn = [(len(trace["steps"]), done) for trace, done in throttled(events(), every=3600.0)]
    # Within one throttle interval only the empty grid, the first step and the end are drawn.
    assert drawn == [(0, False), (1, False), (5, True)]
    # With no minimum gap and free redraws, every step is drawn.
    assert [len(trace["steps"]) for trace, _ in throttled(events(), every=0.0, page_share=1.0)] == [0, 1, 2, 3, 4, 5, 5]

    # A redraw that takes the consumer a while pushes the next one back: at most a 50% share here.
    import time

    drawn = []
    for trace, _ in throttled(events(), every=0.0, page_share=0.5):
        drawn.append(len(trace["steps"]))
        time.sleep(0.05)  # the page drawing
    assert drawn == [0, 1, 5]  # the steps arrive at once, so after a 50 ms draw only the end is due


@pytest.fixture(scope="module")
def session():
    s = Session("tiny")
    yield s
    s.close()


def test_a_second_run_decodes_beside_the_first_and_stop_ends_only_its_owners(session, tiny):
    """Two pages' runs share the engine's batch: the short one ends with its solo answer while the
    long one goes on, and a Stop by the long one's id ends it alone."""
    first = session.run(ARITHMETIC, {"gen_length": 256, "block_size": 32}, run_id="a")  # 256 steps
    next(first)
    short = {"gen_length": 32, "block_size": 32, "seed": 5}
    second = list(session.run("Alice has 3 apples and buys 4 more. How many now?", short, run_id="b"))[-1]["trace"]
    solo = dllm_local.generate(tiny, "Alice has 3 apples and buys 4 more. How many now?", Settings.from_dict(short))
    assert second["final_ids"] == solo.trace.final_ids and not second["stats"]["stopped"]
    assert session.owns("a") and not session.owns("b")
    assert not session.stop("b")  # nothing of b's is open
    assert session.stop("a")
    events = list(first)
    assert events[-1]["trace"]["stats"]["stopped"] and len(events[-1]["trace"]["steps"]) < 256
    assert "trace" in list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]  # usable again


def test_session_streams_the_engine_trace_from_its_own_process(session, tiny):
    """The trace assembled in the page process from the streamed steps is the engine's trace."""
    settings = {"gen_length": 64, "block_size": 32, "cache": "dual", "unmask": "threshold",
                "unmask_params": {"threshold": 0.9}, "trace": "full"}
    events = list(session.run(ARITHMETIC, settings))
    streamed = events[-1]["trace"]
    assert [e["step"] for e in events[1:-1]] == streamed["steps"]  # every step was streamed before the end
    direct = dllm_local.generate(tiny, ARITHMETIC, Settings.from_dict(settings)).trace.to_dict()
    assert session.info()["name"] == direct["model"]["name"] and streamed["prompt_ids"] == direct["prompt_ids"]
    assert (streamed["final_ids"], streamed["text"]) == (direct["final_ids"], direct["text"])
    assert [s["committed"] for s in streamed["steps"]] == [s["committed"] for s in direct["steps"]]
    assert streamed["stats"]["nfe"] == direct["stats"]["nfe"] and not streamed["stats"]["stopped"]
    json.dumps(streamed)  # exportable as it is


def test_a_consumer_that_leaves_early_stops_the_run_and_frees_the_session(session):
    events = session.run(ARITHMETIC, {"gen_length": 256, "block_size": 32})
    next(events), next(events)
    events.close()  # e.g. the browser tab went away
    assert not session.stop()  # nothing is running any more
    assert "trace" in list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]


def test_engine_process_death_is_reported_and_the_next_run_starts_a_new_one(session):
    before = list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]["trace"]
    events = session.run(ARITHMETIC, {"gen_length": 256, "block_size": 32})
    next(events)
    os.kill(session._process.pid, signal.SIGKILL)  # e.g. the OS ended it for memory
    with pytest.raises(EngineError, match="ended unexpectedly"):
        list(events)
    after = list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]["trace"]
    assert after["final_ids"] == before["final_ids"]


def test_bad_settings_raise_in_the_caller_and_leave_the_session_free(session):
    with pytest.raises(SettingsError, match="does not divide"):
        session.run(ARITHMETIC, {"gen_length": 33, "block_size": 32})
    with pytest.raises(SequenceTooLongError):  # checked by the engine, raised here
        session.run("word " * 2000, {"gen_length": 32, "block_size": 32})
    assert "trace" in list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]


def test_a_failed_model_switch_keeps_the_loaded_model(session):
    with pytest.raises(ModelLoadError, match="does not exist"):
        session.switch_model("no-such-model")
    assert session.info()["name"] == "tiny"
    assert list(session.run(ARITHMETIC, {"gen_length": 32, "block_size": 32}))[-1]["trace"]["text"]
    assert session.switch_model("tiny", "none", on_wait=lambda seconds: None)["name"] == "tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    import app

    page, session = app.create(app.parse_args([]))
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **__import__("ui.page", fromlist=["LAUNCH_OPTIONS"]).LAUNCH_OPTIONS)
    yield url
    page.close()
    session.close()


def test_gradio_client_run_streams_updates_and_ends_with_the_answer(server, tiny):
    from gradio_client import Client

    import dllm_local

    job = Client(server, verbose=False).submit(ARITHMETIC, api_name="/run")
    outputs = [o for o in job]
    assert len(outputs) > 1
    final_status = next(o for o in outputs[-1] if isinstance(o, str) and o.startswith(("Done", "Stopped", "⚠")))
    presets, _ = load_presets()
    settings = Settings.from_dict(presets["Fast-dLLM DualCache (paper default)"]["settings"])
    expected = dllm_local.generate(tiny, ARITHMETIC, settings).text
    judged = verdict(ARITHMETIC, expected)  # an arithmetic prompt of the task suite: the answer is judged
    mark = "✓" if judged == "right" else "✗"
    assert final_status.startswith("Done") and f"**Answer:** {expected} — {mark} **{judged}** (" in final_status


# ---------------------------------------------------------------- a real browser

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture()
def page(browser, server):
    pg = browser.new_page(viewport={"width": 1500, "height": 2000}, accept_downloads=True)
    pg.goto(server)
    pg.wait_for_selector("#run-btn")
    yield pg
    pg.close()


def _status(pg, selector="#status") -> str:
    """The status text itself, without Gradio's progress tracker ("processing | 0.3s")."""
    return pg.inner_text(f"{selector} [data-testid=markdown]")


def _wait_done(pg, selector="#status", word="Done", timeout=90_000):
    pg.wait_for_function(f"(() => {{ const s = document.querySelector('{selector}').innerText;"
                         f" return s.includes('{word}') && !s.includes('processing'); }})()", timeout=timeout)
    return _status(pg, selector)


def _shown_run(pg) -> str:
    """The run number the live grid was last drawn for ('' before any run in this tab)."""
    marker = pg.locator("#token-grid .dl-run")
    return marker.get_attribute("data-run") if marker.count() else ""


def _wait_run_ended(pg, previous_run: str, timeout=120_000) -> str:
    """Wait until the grid shows the final state of a run newer than ``previous_run`` and the
    status says how it ended; return the status."""
    pg.wait_for_function("(prev) => { const r = document.querySelector('#token-grid .dl-run');"
                         " return r && r.dataset.run !== prev && r.dataset.done === '1'; }",
                         arg=previous_run, timeout=timeout)
    # After the notices, if any (a block model's longer run, a length past training): how it ended.
    pg.wait_for_function("() => /(^|[.)] )(Done|Stopped)/.test(document.querySelector("
                         "'#status [data-testid=markdown]').innerText.trim())", timeout=timeout)
    return _status(pg)


def export_trace(pg, path: Path) -> Path:
    """Click Export until the browser downloads the trace: the file is written after the run's
    final state is drawn, and a click before that has nothing to download (the button looks the same)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(12):
        try:
            with pg.expect_download(timeout=5_000) as download:
                pg.click("#export-btn")
        except PlaywrightTimeout:
            continue
        download.value.save_as(path)
        return path
    raise AssertionError("the Export button never gave a download")


def _choose(pg, dropdown: str, option: str) -> None:
    pg.click(f"{dropdown} input")
    pg.get_by_role("option", name=option, exact=True).click()


def _load_model(pg, name: str) -> None:
    """Load ``name`` from the model box and wait for the page to say it is loaded."""
    if not pg.locator("#model-pick").is_visible():
        pg.click("#model-box button")  # the accordion opens
    _choose(pg, "#model-pick", name)
    pg.click("#load-model-btn")
    pg.wait_for_function("(n) => document.querySelector('#status').innerText.includes(`Loaded ${n}.`)", arg=name,
                         timeout=120_000)


def _wait_policy(pg, kind: str, name: str) -> None:
    """Wait until the policy dropdown of ``kind`` shows the policy ``name`` (by its label)."""
    label = registry.get(kind, name).label
    pg.wait_for_function("([kind, label]) => document.querySelector(`#${kind} input`).value === label",
                         arg=[kind, label])


def test_browser_runs_the_default_preset_and_draws_every_view(page):
    page.click("#run-btn")
    status = _wait_done(page)
    assert "The answer is" in status
    boxes = page.locator("#token-grid [title]")
    assert boxes.count() >= 128
    assert page.locator("#token-grid .dl-masked").count() == 0
    for plot in ("#conf-plot", "#kv-plot", "#cache-plot"):  # plotly draws after the update lands
        page.wait_for_selector(f"{plot} .js-plotly-plot .main-svg", state="attached", timeout=30_000)
    assert "NFE" in page.inner_text("#numbers")
    page.screenshot(path=str(OUT / "run-default.png"), full_page=True)


def test_browser_threshold_slider_then_run_again(page, tiny):
    import dllm_local

    before = _shown_run(page)
    page.click("#run-btn")
    assert "threshold 0.9" in _wait_run_ended(page, before)
    page.locator("#threshold input[type=range]").fill("0.3")
    page.wait_for_function("() => document.querySelector('#threshold input[type=number]').value === '0.3'")
    run = _shown_run(page)
    page.click("#run-btn")
    second = _wait_run_ended(page, run)
    assert second.startswith("Done") and "threshold 0.3" in second  # the server ran what the slider says

    presets, _ = load_presets()
    preset = presets["Fast-dLLM DualCache (paper default)"]
    settings = Settings.from_dict(dict(preset["settings"], unmask_params={"threshold": 0.3}))
    expected = dllm_local.generate(tiny, preset["prompt"], settings)
    assert f"Done: {expected.stats.nfe} steps (" in second
    assert f"Answer: {expected.text}" in second
    page.screenshot(path=str(OUT / "threshold-0.3.png"), full_page=True)


def start_long_run(page) -> str:
    """Start the LLaDA baseline at gen 512, one token per step (512 full forwards: seconds even on
    a fast machine), wait until it has drawn 3 steps, and return the run shown before it."""
    _choose(page, "#preset", "LLaDA baseline")
    _wait_policy(page, "unmask", "fixed")
    for slider in ("#gen-length", "#steps"):
        page.locator(f"{slider} input[type=range]").fill("512")
        page.wait_for_function(f"() => document.querySelector('{slider} input[type=number]').value === '512'")
    run = _shown_run(page)
    page.click("#run-btn")
    page.wait_for_function("(prev) => { const r = document.querySelector('#token-grid .dl-run');"
                           " return r && r.dataset.run !== prev && Number(r.dataset.steps) >= 3; }", arg=run,
                           timeout=60_000)
    return run


def test_browser_stop_mid_run_leaves_the_page_usable_and_a_second_tab_decodes_beside_it(page, browser, server):
    run = start_long_run(page)
    # Another tab's Run while this run goes: it joins the engine's batch and ends first, its own
    # run; this one goes on, never mixed with it.
    other = browser.new_page(viewport={"width": 1500, "height": 2000})
    other.goto(server)
    other.wait_for_selector("#run-btn")
    other_run = _shown_run(other)
    other.click("#run-btn")
    other_status = _wait_run_ended(other, other_run)
    assert other_status.startswith("Done") and "dual + threshold" in other_status and "length 128" in other_status
    assert int(page.get_attribute("#token-grid .dl-run", "data-done")) == 0  # the first run is still going
    page.click("#stop-btn")
    page.wait_for_function("() => document.querySelector('#stop-note').innerText.includes('Stopping')")
    status = _wait_run_ended(page, run)
    assert status.startswith("Stopped")
    page.wait_for_function("() => document.querySelector('#stop-note').innerText.trim() === ''")  # the status says it now
    other.close()
    steps = int(page.get_attribute("#token-grid .dl-run", "data-steps"))
    assert 3 <= steps < 512 and "length 512" in status
    assert page.locator("#token-grid .dl-masked").count() > 0  # the answer was left unfinished
    page.screenshot(path=str(OUT / "stopped.png"), full_page=True)

    _choose(page, "#preset", "Fast-dLLM DualCache (paper default)")
    _wait_policy(page, "unmask", "threshold")
    stopped_run = _shown_run(page)
    page.click("#run-btn")
    again = _wait_run_ended(page, stopped_run)
    assert again.startswith("Done") and "dual + threshold" in again
    assert page.locator("#token-grid .dl-masked").count() == 0


def test_browser_compare_mode(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#cmp-repeats input[type=range]").fill("2")
    page.wait_for_function("() => document.querySelector('#cmp-repeats input[type=number]').value === '2'")
    page.click("#cmp-btn")
    _wait_done(page, "#cmp-status", "Done.", timeout=600_000)
    # B (the LLaDA baseline preset, 64 positions) runs at A's length: like with like.
    assert "B runs at A's generation length 128" in page.inner_text("#cmp-status")
    table = page.inner_text("#cmp-table")
    assert "speedup" in table and "token agreement" in table and "answer" in table and "model time" in table
    # A is the Run tab's current settings, B the chosen preset; each grid says which.
    assert page.inner_text("#grid-a").startswith("A: ") and page.inner_text("#grid-b").startswith("B: ")
    assert page.locator("#grid-a [title]").count() >= 128 and page.locator("#grid-b [title]").count() >= 128
    page.screenshot(path=str(OUT / "compare.png"), full_page=True)


def test_browser_export_then_replay_without_running(page, browser, server, tmp_path):
    page.click("#run-btn")
    _wait_done(page)
    path = export_trace(page, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    assert trace["steps"] and trace["schema_version"] == 1

    fresh = browser.new_page(viewport={"width": 1500, "height": 2000})
    fresh.goto(server)
    fresh.wait_for_selector("#import-btn")
    with fresh.expect_file_chooser() as chooser:
        fresh.click("#import-btn")
    chooser.value.set_files(str(path))
    _wait_done(fresh, word="Replaying")
    last = fresh.inner_html("#token-grid")
    box = fresh.locator("#scrubber input[type=number]")
    box.fill("0")
    box.press("Enter")
    fresh.wait_for_function("() => document.querySelector('#token-grid').innerText.includes('after step 0 ')",
                            timeout=30_000)
    assert fresh.inner_html("#token-grid") != last
    fresh.screenshot(path=str(OUT / "replay-step-0.png"), full_page=True)
    fresh.close()


def test_tune_values_typed_stay_when_the_knob_menu_is_left_unchanged_and_follow_a_new_knob(page):
    page.get_by_role("tab", name="Tune").click()
    values = page.locator("#tune-values textarea")
    values.fill("0.5, 0.9")
    values.press("Tab")
    page.click("#tune-knob input")  # into the knob menu and out again, choosing nothing
    page.keyboard.press("Escape")
    page.click("#tune-blocks textarea")
    page.wait_for_timeout(1500)  # a stray suggestion would have landed by now
    assert values.input_value() == "0.5, 0.9"
    knob = page.input_value("#tune-knob input")
    page.click("#tune-knob input")
    options = page.get_by_role("option")
    labels = [options.nth(i).inner_text().strip() for i in range(options.count())]
    other = next(label for label in labels if label != knob)
    page.get_by_role("option", name=other, exact=True).click()
    page.wait_for_function("() => document.querySelector('#tune-values textarea').value !== '0.5, 0.9'")


@pytest.mark.parametrize("content, message", [
    ({"name": "x", "settings": {}}, "description is missing"),
    ({"name": "x", "description": "d", "settings": {"gen_length": 0}},
     "settings gen_length must be greater than or equal to 1 (not 0)"),
    ({"name": "x", "description": "d", "settings": {}, "colour": "red"}, "colour is not a known field"),
    ({"name": "x", "description": "d", "settings": {}, "view": {"layer": 3}}, "view.layer must be a valid string (not 3)"),
    ({"name": "x", "description": "d", "settings": {}, "view": {"kv_view": "x"}},
     "view.kv_view must be one of"),
    ({"name": "", "description": "d", "settings": {}}, "name must have at least 1 character (not '')"),
    ([[[[]]]], "the preset must be a valid dictionary"),
])
def test_a_preset_is_read_through_its_schema_and_a_failure_names_the_field(tmp_path, content, message):
    (tmp_path / "p.json").write_text(json.dumps(content))
    presets, problems = load_presets(tmp_path)
    assert presets == {} and len(problems) == 1 and message in problems[0], problems


def test_presets_that_are_not_files_or_are_nested_without_end_are_skipped(tmp_path):
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "deep.json").write_text("[" * 20_000 + "]" * 20_000)
    (tmp_path / "big.json").write_text(json.dumps({"name": "big", "description": "x" * 100_000, "settings": {}}))
    (tmp_path / "ok.json").write_text(json.dumps({"name": "ok", "description": "fine", "settings": {"cache": "dual"}}))
    presets, problems = load_presets(tmp_path)
    assert list(presets) == ["ok"]
    assert [p.split(":")[0] for p in problems] == ["preset big.json was skipped", "preset deep.json was skipped",
                                                   "preset folder.json was skipped"]
    assert "it is a folder, not a file" in problems[2] and "the limit is 64.0 kB" in problems[0]
    assert "it nests deeper than 64 levels" in problems[1]
