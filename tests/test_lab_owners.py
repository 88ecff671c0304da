"""Every request owned (issue 61): on a page with sign-in, no Gradio route answers a signed-out
caller (cancel and heartbeat included), a tab id used by another signed-in user grants nothing
(joining the queue with it, Gradio's cancel, the tab's Stop), the Lab list shows no tab id that
grants anything, and lecturer-only actions are refused where they run."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests
from gradio_client import handle_file
from hypothesis import HealthCheck, given, settings, strategies as st

from test_lab import LONG_PROMPT, PASSWORD, STOPPED_RUN, _client, _free_port, _status, _wait_for_a_request
from dllm_local.serving.cost import answer_positions
from ui.lab.classroom import Lab, LabRefusal, Limits, Who
from ui.lab.guard import OPEN_TO_ALL
from ui.login import SignIn
from ui.signin import add_user, read_users

LIMIT = 64
SMALL_TRACE = Path(__file__).resolve().parent / "data" / "trace_small.json"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    import app
    from ui.page import launch_options

    users = tmp_path_factory.mktemp("owners") / "users.txt"
    add_user(users, "lee", PASSWORD, "lecturer")
    for name in ("ann", "bob"):
        add_user(users, name, PASSWORD)
    sign_in = SignIn(read_users(users))
    args = app.parse_args(["--users", str(users), "--slots", "2", "--max-gen-length", str(LIMIT)])
    page, session = app.create(args, {name: user.role for name, user in sign_in.users.items()})
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **launch_options(sign_in))
    yield page, url, session
    page.close()
    session.close()
    page.exports.cleanup()


def _signed_in(url: str, name: str) -> requests.Session:
    browser = requests.Session()
    assert browser.post(url + "login", data={"username": name, "password": PASSWORD}, timeout=30).ok
    return browser


def _fn_index(browser: requests.Session, url: str, api_name: str) -> int:
    config = browser.get(url + "config", timeout=30).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


API_PATHS = st.sampled_from(["cancel", "reset", "heartbeat/{s}", "queue/join", "queue/data?session_hash={s}",
                             "stream/{s}", "stream/{s}/close", "upload", "info", "run/predict", "call/run"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=API_PATHS, session_hash=st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12),
       payload=st.dictionaries(st.sampled_from(["session_hash", "fn_index", "event_id", "data"]),
                               st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=4))
def test_no_route_of_gradio_answers_a_signed_out_caller(page, route, session_hash, payload):
    _, url, _ = page
    path = url + "gradio_api/" + route.format(s=session_hash)
    answer = requests.request("GET" if "data" in route or "heartbeat" in route else "POST", path, json=payload,
                              timeout=30)
    assert answer.status_code == 401, (route, answer.status_code, answer.text[:200])


def test_every_route_gradio_registers_is_closed_to_the_signed_out_but_the_sign_in_forms(page):
    app, url = page[0].app, page[1]
    closed = []
    for route in app.routes:
        path = getattr(route, "path", "")
        if not path.startswith("/gradio_api/") or path.strip("/").split("/", 1)[1] in OPEN_TO_ALL:
            continue
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            closed.append((method, path, requests.request(method, url.rstrip("/") + concrete, timeout=30).status_code))
    assert closed and all(status == 401 for _, _, status in closed), [c for c in closed if c[2] != 401]


def test_the_lecturers_tab_id_in_a_students_hands_stops_nothing(page):
    _, url, session = page
    lee = _client(url, "lee")  # held by no limit: a run longer than the lab's
    long = lee.submit(LONG_PROMPT, api_name="/run", **STOPPED_RUN)
    _wait_for_a_request(session)
    bob = _signed_in(url, "bob")
    stop = {"data": [], "fn_index": _fn_index(bob, url, "stop"), "session_hash": lee.session_hash,
            "event_data": None, "trigger_id": None}
    assert bob.post(url + "gradio_api/queue/join", json=stop, timeout=30).status_code == 403
    cancel = {"session_hash": lee.session_hash, "fn_index": _fn_index(bob, url, "run"), "event_id": "x"}
    assert bob.post(url + "gradio_api/cancel", json=cancel, timeout=30).status_code == 403
    assert bob.get(url + f"gradio_api/queue/data?session_hash={lee.session_hash}", timeout=30).status_code == 403
    # The lecturer's list names each tab by an id that is not its session's.
    table, _ = lee.predict(api_name="/lab_requests")
    shown = [row[5] for row in table["data"] if row[0] == "lee"]
    assert shown and shown[0].startswith("tab-") and lee.session_hash not in str(table["data"])
    time.sleep(1)  # what bob's requests would have stopped had time to
    assert any(r["owner"] == lee.session_hash and r["steps"] for r in session.requests())
    assert lee.predict(api_name="/stop").startswith("Stopping")  # the tab's own Stop still stops it
    assert _status(long.result(timeout=120)).startswith("Stopped")


def test_a_branch_of_an_imported_trace_is_held_to_the_length_it_will_run_at(page, tmp_path):
    """The trace's settings name no gen_length: its branch runs at the default, 128, past the limit."""
    _, url, _ = page
    trace = json.loads(SMALL_TRACE.read_text())
    del trace["settings"]["gen_length"]
    (path := tmp_path / "no_length.json").write_text(json.dumps(trace))
    bob = _client(url, "bob")
    bob.predict(handle_file(str(path)), api_name="/import_trace")
    outputs = bob.predict(len(trace["steps"]) - 1, 0, None, "confidence", api_name="/branch_remask")
    assert f"128 answer positions, beyond this lab's limit of {LIMIT}" in str(outputs), outputs


def test_lecturer_only_actions_are_refused_where_they_run(page):
    _, url, _ = page
    bob = _client(url, "bob")
    assert "Downloading a model is for the lecturer" in str(bob.predict("tiny", api_name="/download_model"))
    assert "for the lecturer" in bob.predict("tiny", "none", api_name="/load_model")[1]


@pytest.fixture(scope="module")
def canvas_model():
    import dllm_local

    return dllm_local.load("tiny-diffusiongemma")


@pytest.mark.parametrize("canvas_params, gen_length", [({"canvas_length": 48}, 8), ({}, 20), ({}, 16)])
def test_a_canvas_run_is_held_to_the_whole_canvases_it_decodes(canvas_model, canvas_params, gen_length):
    """canvas_length 512 passed a limit of 32: the region is whole canvases, as the run allocates it."""
    import dllm_local
    from dllm_local.settings import Settings

    tiny = canvas_model
    settings = Settings.from_dict({"gen_length": gen_length, "block_size": gen_length, "canvas_params": canvas_params})
    positions = answer_positions(settings, tiny.summary())
    run = dllm_local.generate(tiny, "What is 2 plus 3?", Settings.from_dict(
        {**settings.to_dict(), "canvas_params": {**canvas_params, "max_denoising_steps": 1}}))
    assert positions == run.trace.gen_length and positions % (canvas_params.get("canvas_length") or 16) == 0
    lab, student = Lab(Limits(max_gen_length=gen_length), {"ann": "student"}), Who("t", "ann", False)
    if positions > gen_length:
        with pytest.raises(LabRefusal, match=f"{positions} answer positions, beyond this lab's limit"):
            with lab.admitted(student, positions):
                pass
