"""The page under more than one client: runs belong to their client, every engine request waits in
one queue, imported traces are bounded, export files are bounded, the model box is restricted."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from dllm_local.errors import ModelLoadError
from dllm_local.hub import HUB_MODELS
from dllm_local.serving.session import MODEL_CHOICES
from ui.engine.queue import CANCELLED

ARITHMETIC = "Ben has 9 coins, finds 8 more, then gives away 9. How many now?"
SLOW = {"cache": "none", "unmask": "fixed", "gen_length": 256, "steps": 256, "block_size": 32}  # 256 forwards


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import app
    from ui.page import LAUNCH_OPTIONS

    models_dir = tmp_path_factory.mktemp("models")
    (models_dir / "empty-model").mkdir()
    # One slot: a second client's run waits in the engine's line (tests/test_lab.py: many slots).
    page, session = app.create(app.parse_args(["--models-dir", str(models_dir), "--slots", "1"]))
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **LAUNCH_OPTIONS)
    yield url, page, session, models_dir
    page.close()
    session.close()
    page.exports.cleanup()


def _client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


VIEWS = 8  # the Run tab's outputs begin with its views: grid, numbers, three plots, three verdict boxes


def _status(outputs) -> str:
    return outputs[VIEWS + 1]  # the views, the step slider, then the status line


def _final(job, timeout: float = 180) -> str:
    job.result(timeout=timeout)
    return _status(job.outputs()[-1])


def _wait_running(job, session, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not session.requests() or len(job.outputs()) < 3:
        assert time.monotonic() < end, "the run did not start"
        time.sleep(0.05)


# ---------------------------------------------------------------- 1. runs belong to their client

def test_session_stop_ends_only_the_run_of_the_same_id(served):
    _, _, session, _ = served
    events = session.run(ARITHMETIC, SLOW, run_id="a")
    next(events)
    assert [r["owner"] for r in session.requests()] == ["a"]
    assert not session.stop("b")  # someone else's Stop: a no-op
    assert session.stop("a")
    last = list(events)[-1]["trace"]
    assert last["stats"]["stopped"] and not session.requests()


def test_another_clients_stop_leaves_a_run_going_to_its_end(served):
    url, _, session, _ = served
    a, b = _client(url), _client(url)
    job = a.submit(ARITHMETIC, api_name="/run", **SLOW)  # the controls by name
    _wait_running(job, session)
    said = b.predict(api_name="/stop")
    print(f"\nclient B's Stop while A runs: {said!r}")
    assert "another tab" in said
    final = _final(job)
    print(f"client A's run: {final[:80]!r}")
    assert final.startswith("Done: 256 steps (")  # not "Stopped"

    # The same client's Stop does stop its own run.
    job = a.submit(ARITHMETIC, api_name="/run", **SLOW)  # the controls by name
    _wait_running(job, session)
    assert a.predict(api_name="/stop").startswith("Stopping")
    final = _final(job)
    print(f"client A's own Stop: {final[:60]!r}")
    assert final.startswith("Stopped")


# ---------------------------------------------------------------- 2. one queue for every engine request

def test_a_run_waits_for_a_sweep_instead_of_failing(served):
    url, _, session, _ = served
    a, b = _client(url), _client(url)
    sweep = a.submit("Fast-dLLM DualCache (paper default)", "arithmetic", 4, "unmask.threshold", "0.5,0.9", "8,16", 32,
                     api_name="/sweep")
    end = time.monotonic() + 60
    while not session.requests():  # the sweep holds the engine
        assert time.monotonic() < end
        time.sleep(0.02)
    run = b.submit(ARITHMETIC, api_name="/run")
    sweep_status = sweep.result(timeout=180)[-1]
    final = _final(run)
    print(f"\nsweep: {sweep_status!r}; run started meanwhile: {final[:60]!r}")
    assert sweep_status.startswith("Done") and final.startswith("Done")
    assert "already going" not in final


def test_the_tune_tab_sweeps_any_numeric_knob_of_the_base_policies(served):
    url, _, _, _ = served
    client = _client(url)
    # An integer knob of the self-verifying policy: not a knob of the page's default preset.
    _, _, table, status = client.predict("Self-verifying parallel decoding", "arithmetic", 2, "unmask.window", "1, 4",
                                      "32", 32, api_name="/sweep")
    assert status.startswith("Done: 2 points. AUP (") and "self_verify" in status
    assert [row[1] for row in table["data"]] == ["window 1 · B 32", "window 4 · B 32"]
    # A cache policy's knob, and a knob that is not the base policies' is a message naming the box.
    _, _, table, status = client.predict("Fast-dLLM DualCache (paper default)", "arithmetic", 2, "cache.refresh_every",
                                      "0, 2", "32", 32, api_name="/sweep")
    assert status.startswith("Done: 2 points.") and [row[1] for row in table["data"]] == ["refresh_every 0 · B 32",
                                                                                "refresh_every 2 · B 32"]
    *_, status = client.predict("Fast-dLLM DualCache (paper default)", "arithmetic", 2, "unmask.rho", "0.5", "32",
                                  32, api_name="/sweep")
    assert status.startswith("⚠ Knob: 'unmask.rho' is not a numeric parameter of dual + threshold")
    *_, status = client.predict("Fast-dLLM DualCache (paper default)", "arithmetic", 2, "unmask.threshold", "1.5",
                                  "32", 32, api_name="/sweep")
    assert status.startswith("⚠") and "threshold must be less than or equal to 1 (not 1.5)" in status


# ---------------------------------------------------------------- 3. bounded trace import

def _trace(session, prompt: str, settings: dict) -> dict:
    return list(session.run(prompt, settings))[-1]["trace"]


def test_an_oversized_trace_is_refused_at_once_and_the_page_still_runs(served, tmp_path):
    from gradio_client import handle_file

    url, _, session, _ = served
    trace = _trace(session, ARITHMETIC, {"gen_length": 32, "block_size": 32})
    trace["gen_length"] = 300000
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(trace))
    client = _client(url)
    started = time.perf_counter()
    outputs = client.predict(handle_file(str(path)), api_name="/import_trace")
    took = time.perf_counter() - started
    status = _status(outputs)
    print(f"\noversized import ({path.stat().st_size / 1024:.0f} KB, gen_length 300000): {took:.2f} s, "
          f"{status!r}; page process RSS after it: {_rss_mb():.0f} MB")
    assert took < 5 and status.startswith("⚠ could not import that file") and "gen_length" in status
    final = _final(client.submit(ARITHMETIC, api_name="/run"))
    assert final.startswith("Done")

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in _status(client.predict(handle_file(str(bad)), api_name="/import_trace"))


def test_importing_a_trace_sets_its_prompt_and_settings(served, tmp_path):
    from gradio_client import handle_file

    url, page, session, _ = served
    prompt = "Give two numbers whose sum is 9."
    settings = {"gen_length": 64, "block_size": 16, "cache": "prefix", "unmask": "threshold",
                "unmask_params": {"threshold": 0.7}, "seed": 3}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace(session, prompt, settings)))
    outputs = _client(url).predict(handle_file(str(path)), api_name="/import_trace")
    assert _status(outputs).startswith("Replaying an imported trace")
    assert outputs[VIEWS + 3] == prompt  # after the status: the export file, then the prompt and the controls
    controls = dict(zip(page.control_names, outputs[VIEWS + 4:]))
    assert (controls["gen_length"], controls["block_size"], controls["cache"], controls["unmask"]) == (64, 16, "prefix",
                                                                                                      "threshold")
    assert controls["unmask.threshold"] == 0.7 and controls["seed"] == 3


# ---------------------------------------------------------------- 4. files

def test_exports_stay_in_one_folder_and_only_the_last_twenty_are_kept(served):
    from ui.parts.exports import ExportFolder
    from ui.page import DELETE_CACHE

    _, page, _, _ = served
    folder = ExportFolder()
    trace = {"steps": [{"step": 0}], "settings": {}}
    written = [Path(folder.write(trace)) for _ in range(25)]
    assert {p.parent for p in written} == {folder.path}
    left = sorted(folder.path.iterdir())
    assert len(left) == 20 and left == written[-20:]
    folder.cleanup()
    assert not folder.path.exists()
    assert page.delete_cache == DELETE_CACHE  # Gradio's own file cache is swept too
    assert page.exports.path.is_dir() and page.exports.path.name.startswith("dllm-local-")


# ---------------------------------------------------------------- 5. the model box

def test_the_model_box_loads_only_what_the_page_was_started_to_allow(served, tmp_path):
    url, _, session, _ = served
    client = _client(url)
    for name, words in (("/etc", "does not load"), ("someone/some-model", "--allow-downloads"),
                        ("llada-8b-instruct", "is not on this machine, and the page downloads a model only when"),
                        (str(tmp_path), "does not load"), ("../../etc", "does not load")):
        _, status, *_ = client.predict(name, "none", api_name="/load_model")
        print(f"\nmodel box {name!r}: {status!r}")
        assert status.startswith("⚠") and words in status
    assert session.info()["name"] == "tiny"
    # A folder under --models-dir is handed to the loader (which says what is wrong with it).
    _, status, *_ = client.predict("empty-model", "none", api_name="/load_model")
    assert status.startswith("⚠") and "does not load" not in status
    assert session.info()["name"] == "tiny"


def test_model_access_rules(tmp_path):
    from ui.model.access import DownloadNeeded, ModelAccess

    (tmp_path / "m").mkdir()
    closed = ModelAccess()
    assert closed.check("tiny") == "tiny"
    # A listed hub model not on this machine is a download of many GB: only with --allow-downloads.
    for name, (_, gigabytes) in HUB_MODELS.items():
        with pytest.raises(ModelLoadError, match=rf"{name} \(.+\) is not on this machine.*--allow-downloads "
                                                 rf"\(it is about {gigabytes:g} GB\); or download it first: hf download"):
            closed.check(name)
    assert ModelAccess(allow_downloads=True).check("tiny") == "tiny"  # with it, hub models: see test_downloads.py
    for name in (str(tmp_path / "m"), "org/model", "", "m"):
        with pytest.raises(ModelLoadError):
            closed.check(name)
    opened = ModelAccess(tmp_path, allow_downloads=True)
    assert opened.check("m") == str((tmp_path / "m").resolve()) == opened.check(str(tmp_path / "m"))
    with pytest.raises(DownloadNeeded, match="org/model is not on this machine yet: download it first"):
        opened.check("org/model")
    with pytest.raises(ModelLoadError, match="no model folder"):
        opened.check("missing")
    with pytest.raises(ModelLoadError):
        opened.check(str(tmp_path.parent))


# ---------------------------------------------------------------- a browser: Stop of a queued Run

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


def test_browser_stop_cancels_a_queued_run_of_its_own_tab_only(served, browser):
    url, page, session, _ = served
    a, b = _client(url), browser.new_page(viewport={"width": 1500, "height": 2000})
    b.goto(url)
    b.wait_for_selector("#run-btn")
    job = a.submit(ARITHMETIC, api_name="/run", **SLOW)  # the controls by name
    _wait_running(job, session)
    b.click("#run-btn")
    b.wait_for_function("() => document.querySelector('#status').innerText.includes('1st in line')", timeout=20_000)
    b.click("#stop-btn")  # Stop answers beside the button; the status line is the request's own
    # The note says so until the cancelled request has ended (then the status line does): under load
    # both can land in one frame, so either one saying "cancelled" is the answer.
    b.wait_for_function("() => ['#stop-note', '#status'].some(s => document.querySelector(s).innerText.includes("
                        "'cancelled'))", timeout=20_000)
    final = _final(job)
    assert final.startswith("Done: 256 steps (")  # A's run went on to its end
    time.sleep(1.0)
    assert b.locator("#token-grid .dl-run").count() == 0  # B's queued run never ran
    assert "cancelled" in b.inner_text("#status")
    b.click("#run-btn")  # and B's page still runs
    b.wait_for_function("() => /^Done/.test(document.querySelector('#status [data-testid=markdown]').innerText.trim())",
                        timeout=120_000)
    b.close()


def test_added_results_join_the_sweep_chart_and_a_bad_file_is_a_message(served, tmp_path):
    from gradio_client import handle_file

    url, _, session, _ = served
    # Another sweep's JSON report (as `sweep --out` writes it), made by the engine itself.
    events = list(session.sweep("arithmetic", 3, {"cache": "dual", "unmask": "threshold", "gen_length": 32,
                                                  "block_size": 32, "trace": "off"}, {"threshold": [0.3]}))
    path = tmp_path / "other_sweep.json"
    path.write_text(json.dumps(events[-1]["report"]))
    client = _client(url)
    swept = client.predict("Fast-dLLM DualCache (paper default)", "arithmetic", 3, "unmask.threshold", "0.9", "32", 32,
                           api_name="/sweep")
    assert swept[-1].startswith("Done")
    plot, aup_plot, table, status = client.predict(handle_file(str(path)), api_name="/add_results")
    assert status == "Added 1 point from other_sweep.json."
    sources = [row[0] for row in table["data"]]
    assert sources == ["sweep", "other_sweep.json"]
    figure = json.loads(plot["plot"])
    symbols = [symbol for trace in figure["data"] if isinstance((trace.get("marker") or {}).get("symbol"), list)
               for symbol in trace["marker"]["symbol"]]
    assert sorted(symbols) == ["circle", "diamond"]  # the sweep's point, and the added one a diamond
    # Each source is a curve of its own on the AUP chart, named with its AUP.
    names = [trace.get("name") or "" for trace in json.loads(aup_plot["plot"])["data"]]
    curves = [name for name in names if ": AUP " in name and not name.endswith("AUP area")]
    assert any(name.startswith("dual + threshold: AUP ") for name in curves), names
    assert any(name.startswith("dual + threshold (other_sweep.json): AUP ") for name in curves), names

    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"hello": 1}))
    *_, status = client.predict(handle_file(str(bad)), api_name="/add_results")
    assert status.startswith("⚠ could not add that file") and "no \"rows\"" in status
    # Through the schema on the real server: a field named with its rule, nesting without end refused.
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps({"rows": [{"point": {}, "accuracy": -1, "model_tok_s": 1, "nfe": 1}]}))
    *_, status = client.predict(handle_file(str(negative)), api_name="/add_results")
    assert "negative.json: rows[0].accuracy must be greater than or equal to 0 (not -1)" in status
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    *_, status = client.predict(handle_file(str(deep)), api_name="/add_results")
    assert status.startswith("⚠ could not add that file: it nests deeper than 64 levels")


def test_an_upload_over_the_largest_file_the_page_takes_is_refused_and_not_kept(served, tmp_path):
    """The trace import's 64 MB is the page's upload limit: Gradio refuses a larger file itself,
    and nothing of it stays in its temporary folder."""
    import httpx

    from dllm_local.trace import MAX_TRACE_BYTES

    url, page, _, _ = served
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_TRACE_BYTES + 2**20)
    with big.open("rb") as f:
        answer = httpx.post(f"{url.rstrip('/')}/gradio_api/upload", files={"files": ("big.json", f)}, timeout=120)
    assert answer.status_code == 413, answer.text[:300]
    from gradio.utils import get_upload_folder

    assert not list(Path(get_upload_folder()).rglob("big.json"))


def test_a_stop_between_two_runs_of_a_compare_ends_it_and_is_not_kept_for_the_next_request(served):
    """Compare runs the engine ten times: a Stop pressed between two runs reached no run, and the
    comparison went on to "Done" over the partial table. Now it is kept for the request, and only
    for it."""
    from types import SimpleNamespace

    from ui.engine.queue import EngineQueue

    _, page, session, _ = served
    queue, tab = EngineQueue(session, page), SimpleNamespace(session_hash="tab-between-runs")
    with queue.several_runs(tab.session_hash) as stop_asked:
        assert not stop_asked() and not session.requests()  # between two runs: none is going
        assert queue.stop(tab).startswith("Stopping")
        assert stop_asked()
    assert queue.stop(tab) == "Nothing is running."
    with queue.several_runs(tab.session_hash) as stop_asked:
        assert not stop_asked()  # the next comparison starts without the last one's Stop


def test_stop_on_a_queued_model_load_cancels_it_and_the_next_run_runs(served):
    """Stop said "cancelled" to a model load waiting in the queue, yet the load ran when its turn
    came, and the tab's next Run was the one cancelled, without a word."""
    url, _, session, _ = served
    a, b = _client(url), _client(url)
    job = a.submit(ARITHMETIC, api_name="/run", **SLOW)
    _wait_running(job, session)
    load = b.submit("tiny", "none", api_name="/load_model")
    end = time.monotonic() + 30
    while not b.predict(api_name="/stop").startswith(CANCELLED[:20]):  # once the load waits in the queue
        assert time.monotonic() < end
        time.sleep(0.2)
    assert CANCELLED in load.result(timeout=300)[1]  # model line, status, layer menu, download box
    _final(job)
    assert _final(b.submit(ARITHMETIC, api_name="/run")).startswith("Done")


def test_endpoints_called_directly_with_odd_values_answer_with_a_message(served):
    """An API client is not held to the sliders: out-of-range and mistyped values end in a message
    that names the box or the rule, on the real server, and the page stays up."""
    from gradio_client.exceptions import AppError

    url, _, _, _ = served
    client = _client(url)
    *_, status = client.predict("Fast-dLLM DualCache (paper default)", "arithmetic", None, "unmask.threshold", "0.9",
                                "32", 32, api_name="/sweep")
    assert status == "⚠ the number of problems n must be a valid integer (not null)"
    plot, line = client.predict("H100", "LLaDA-8B-Instruct", 1e308, 4.0, api_name="/concurrency")
    assert line.startswith("⚠ G (positions recomputed per forward) must be from 1 to 1,000,000")
    with pytest.raises(AppError, match="Value 1e\\+308 is greater than maximum value"):
        client.predict(1e308, api_name="/length_notice")
    with pytest.raises(AppError, match='Generation length: must be a finite number, not "many"'):
        client.predict("many", api_name="/length_notice")
    assert "/load_point" not in client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    # What the components let through (NaN in a slider, null in a menu) meets each endpoint's schema.
    for api_name, args, message in ENDPOINT_INPUTS:
        assert message in _refusal(url, api_name, args), api_name
    assert client.predict(ARITHMETIC, api_name="/run")  # and the page still runs


def _refusal(url: str, api_name: str, args: tuple) -> str:
    """An endpoint called over plain HTTP, as any program may (gradio_client will not send NaN):
    the error it answers with."""
    import httpx

    posted = httpx.post(f"{url}gradio_api/call{api_name}", content=json.dumps({"data": list(args)}),
                        headers={"Content-Type": "application/json"}, timeout=30)
    answer = httpx.get(f"{url}gradio_api/call{api_name}/{posted.json()['event_id']}", timeout=60).text
    assert "event: error" in answer, answer[:300]
    return json.loads(answer.split("event: error\ndata: ", 1)[1].splitlines()[0])["error"]


NAN = float("nan")
ENDPOINT_INPUTS = [  # (endpoint, arguments, the message), from a probe of every endpoint
    # a number box's or slider's payload is checked as sent, before Gradio rounds it (true would be 1)
    ("/length_notice", (NAN,), "Generation length: must be a finite number, not NaN"),
    ("/redraw", (NAN, "step", "mean", "v", "drift", 0.0, "1×", "light"), "Step: must be a finite number, not NaN"),
    ("/redraw_grid", (1, None, 0.0), "color_by must be 'step' or 'confidence' (not null)"),
    ("/set_follow", (True, "step", "mean", None, "drift", 0.0, "1×", "light"), "which must be 'k' or 'v' (not null)"),
    ("/set_follow", (True, "step", "mean", "v", None, 0.0, "1×", "light"),
     "kv_view must be 'drift', 'true_drift' or 'cache_error' (not null)"),
    ("/set_follow", (True, "step", "mean", "v", "drift", NAN, "1×", "light"),
     "without running the model: must be a finite number, not NaN"),
    ("/redraw", (1, "step", "mean", "v", "drift", 0.0, "3×", "light"), "3× is not in the list of choices"),
    ("/show_cost_2", (None, "H100"), "model must be 'LLaDA-8B-Instruct'"),
    ("/show_knobs", (None, None), "preset_name must be a valid string (not null)"),
    ("/partial", (None,), "name must be a valid string (not null)"),
    # with the cache, block size and preset shown
    ("/load_model", (7, "none", "dual", 32, None), "name must be a valid string (not 7)"),
    ("/download_model", (None,), "name must be a valid string (not null)"),
]


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# Boundaries, round 2 (issue 45), on the real server: each file answers with one bounded line in
# its tab's status, and the page keeps serving.
ROUND_2_FILES = {
    "import_trace": [
        (lambda t: {**t, "settings": {f"k{i}": 1 for i in range(10_000)}}, "10,000 unknown settings, first: k0, k1"),
        (lambda t: {**t, "vocab": {"1\ud800": "x"}}, "holds text that is not valid Unicode (a lone surrogate"),
        (lambda t: {**t, "stats": _nested(70)}, "nests deeper than 64 levels"),
    ],
    "add_results": [
        (lambda _: {"rows": [{"point": {"a\udc00": 1}, "accuracy": 0.5, "model_tok_s": 1, "nfe": 1}]},
         "holds text that is not valid Unicode"),
        (lambda _: {"rows": [{"point": {}, "accuracy": 0.5, "model_tok_s": 1, "nfe": 1,
                              "settings": {f"k{i}": 1 for i in range(10_000)}}]}, "10,000 unknown settings, first: k0"),
    ],
}


@pytest.mark.parametrize("endpoint, case", [(e, i) for e, cases in ROUND_2_FILES.items() for i in range(len(cases))])
def test_round_2_files_are_one_bounded_line_and_the_page_keeps_serving(served, tmp_path, endpoint, case):
    from gradio_client import handle_file

    url, _, session, _ = served
    change, message = ROUND_2_FILES[endpoint][case]
    path = tmp_path / "input.json"
    path.write_text(json.dumps(change(_trace(session, ARITHMETIC, {"gen_length": 32, "block_size": 32}))))
    client = _client(url)
    outputs = client.predict(handle_file(str(path)), api_name=f"/{endpoint}")
    status = _status(outputs) if endpoint == "import_trace" else outputs[-1]
    assert status.startswith("⚠ could not") and message in status and len(status) < 2100, status[:300]
    assert _final(client.submit(ARITHMETIC, api_name="/run")).startswith("Done")
