"""A class on one page: eight signed-in students over a real server decode together in the
engine's batch, each its own solo answer; Stop ends only its owner's run; the lab's limits hold
per user and a lecturer is held by none; the lecturer's view lists and stops anyone's requests."""
from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import dllm_local
from dllm_local.settings import Settings
from dllm_local.tiny.tasks import make_problems
from test_page import browser  # noqa: F401 - the real browser's fixture
from ui.lab.classroom import Lab, LabRefusal, Limits, Who
from ui.parts.presets import load_presets
from ui.login import SignIn
from ui.signin import add_user, read_users

PRESET = "Fast-dLLM DualCache (paper default)"  # what Run decodes when only a prompt is given
PASSWORD = "correct horse"
STUDENTS = [f"student{k}" for k in range(1, 9)]
ANSWER = re.compile(r"\*\*Answer:\*\* (.*?)(?: — [✓✗] \*\*|$)", re.S)
VIEWS = 8  # the Run tab's outputs begin with its views, then the step slider and the status line
LONG_PROMPT = "Ben has 9 coins, finds 8 more, then gives away 9. How many now?"
SLOW = {"cache": "none", "unmask": "fixed", "gen_length": 128, "steps": 128, "block_size": 32}
# A student's run that is stopped while it goes: long enough (seconds) for the clicks and calls
# before its Stop on a loaded machine; the lab's limit is its length.
STOPPED_RUN = {**SLOW, "gen_length": 256, "steps": 256}


def _status(outputs) -> str:
    return outputs[VIEWS + 1]


def _answer(outputs) -> str | None:
    return next((m.group(1).strip() for o in outputs if isinstance(o, str) for m in [ANSWER.search(o)] if m), None)


# ---------------------------------------------------------------- the limits, on their own
def test_the_limits_hold_per_user_and_a_lecturer_is_held_by_none():
    lab = Lab(Limits(max_users=2, runs_per_user=1, requests_per_minute=2, max_gen_length=64),
              {"ann": "student", "bob": "student", "cat": "student", "lee": "lecturer"})
    ann, bob, cat = (Who(f"tab-{n}", n, False) for n in ("ann", "bob", "cat"))
    lee = Who("tab-lee", "lee", True)
    with pytest.raises(LabRefusal, match="beyond this lab's limit of 64"):
        with lab.admitted(ann, 128):
            pass
    with lab.admitted(ann, 64):
        with pytest.raises(LabRefusal, match="1 request going"):
            with lab.admitted(ann, 64):
                pass
        with lab.admitted(bob, 64):
            with pytest.raises(LabRefusal, match="the lab is full: 2 users"):
                with lab.admitted(cat, 64):
                    pass
            with lab.admitted(lee, 1024), lab.admitted(lee, 1024), lab.admitted(lee, 1024):  # none holds a lecturer
                pass
    with lab.admitted(ann, 64):  # its first ended: a second may start, the minute's second
        pass
    with pytest.raises(LabRefusal, match="2 requests a minute per user; the next in"):
        with lab.admitted(ann, 64):
            pass
    with lab.admitted(cat, 64):  # the full lab emptied: cat may start now
        pass
    assert lab.may_manage(lee) and not lab.may_manage(ann) and Lab().may_manage(ann)  # no sign-in: this machine's user


# ---------------------------------------------------------------- the engine's line
def test_a_lecturers_run_goes_ahead_of_the_students_waiting(tmp_path):
    """The engine's real loop over a pipe, one slot: while a long run holds it, two students' runs
    wait and are told their places; a lecturer's run, sent last, is told it is first, and takes
    the slot before them."""
    import multiprocessing

    from dllm_local.serving.engine import serve

    page, engine_end = multiprocessing.Pipe()
    loop = threading.Thread(target=serve, args=(engine_end, threading.Event(), {"model": "tiny", "threads": 1,
                                                                                "slots": 1}), daemon=True)
    loop.start()
    assert page.recv()[1] == "ready"
    short = {"gen_length": 32, "block_size": 32}
    page.send(("long", "run", {"prompt": LONG_PROMPT, "settings": SLOW}, {}))
    while page.recv()[2].get("step") is None:  # the long run has the slot
        pass
    for request_id, options in (("ann", {}), ("bob", {}), ("lee", {"first": True})):
        page.send((request_id, "run", {"prompt": f"{request_id} has 2 pens. How many now?", "settings": short},
                   options))
    places: dict[str, list[int]] = {"ann": [], "bob": [], "lee": []}
    first_steps: list[str] = []
    ended = set()
    while len(ended) < 4:
        request_id, kind, payload = page.recv()
        if kind == "end":
            ended.add(request_id)
        elif "queued" in payload:
            places[request_id].append(payload["queued"])
        elif "step" in payload and request_id not in first_steps:
            first_steps.append(request_id)
    page.send((None, "close", {}, {}))
    loop.join(10)
    print(f"\nplaces told: {places}; first steps in order: {first_steps}")
    assert first_steps == ["long", "lee", "ann", "bob"]
    assert places["lee"] == [1]  # told once: first in line, however the three arrived
    # Each told again whenever its place changed, down to first. The engine reads the three as they
    # come: a student told "1st" before the lecturer's run arrived is told "2nd" once it has.
    for told, last_place in ((places["ann"], 2), (places["bob"], 3)):
        assert told[-1] == 1 and all(a != b for a, b in zip(told, told[1:])) and max(told) <= last_place, told
    assert places["bob"][0] > places["ann"][0]


# ---------------------------------------------------------------- a class over a real server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab_page(tmp_path_factory):
    import app
    from ui.page import launch_options

    users = tmp_path_factory.mktemp("lab") / "users.txt"
    add_user(users, "lee", PASSWORD, "lecturer")
    for name in STUDENTS:
        add_user(users, name, PASSWORD)
    sign_in = SignIn(read_users(users))
    args = app.parse_args(["--users", str(users), "--slots", "4", "--runs-per-user", "1", "--max-gen-length", "256"])
    page, session = app.create(args, {name: user.role for name, user in sign_in.users.items()})
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **launch_options(sign_in))
    yield url, session
    page.close()
    session.close()
    page.exports.cleanup()


def _wait_for_a_request(session, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not session.requests():
        assert time.monotonic() < end, "no request reached the engine"
        time.sleep(0.05)


def _client(url: str, name: str):
    from gradio_client import Client

    return Client(url, auth=(name, PASSWORD), verbose=False)


def test_eight_students_decode_together_each_their_solo_answer_and_stop_ends_only_its_owners(lab_page):
    url, session = lab_page
    prompts = [make_problems("arithmetic", 1, 3000 + k)[0].prompt for k in range(7)]
    settings = Settings.from_dict(load_presets()[0][PRESET]["settings"])
    tiny = dllm_local.load("tiny")
    solo = [dllm_local.generate(tiny, p, settings) for p in prompts]
    clients = [_client(url, name) for name in STUDENTS]
    start = threading.Barrier(len(clients))
    jobs: dict[int, object] = {}

    def student(k: int) -> None:
        start.wait()
        if k == 7:  # the one who will press Stop: a long run
            jobs[k] = clients[k].submit(LONG_PROMPT, api_name="/run", **STOPPED_RUN)
        else:
            jobs[k] = clients[k].submit(prompts[k], api_name="/run")

    threads = [threading.Thread(target=student, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Eight runs on four slots: some wait in line, and are told so.
    end = time.monotonic() + 120
    while not any(r["steps"] > 3 for r in session.requests() if r["what"] == LONG_PROMPT):
        assert time.monotonic() < end, "the long run did not start"
        time.sleep(0.05)
    assert clients[7].predict(api_name="/stop").startswith("Stopping")
    finals = {k: jobs[k].result(timeout=300) for k in range(8)}
    statuses = {k: _status(finals[k]) for k in range(8)}
    print("\n" + "\n".join(f"{STUDENTS[k]}: {statuses[k][:70]!r} {_answer(finals[k])!r}" for k in range(8)))
    assert statuses[7].startswith("Stopped")
    for k in range(7):
        assert statuses[k].startswith(f"Done: {solo[k].trace.stats.nfe} steps"), statuses[k]
        assert _answer(finals[k]) == solo[k].text.strip()  # each its own answer, as alone
    waited = [k for k in range(8) if any("in line" in _status(o) for o in jobs[k].outputs() if len(o) > VIEWS + 1)]
    print(f"told their place in line: {[STUDENTS[k] for k in waited]}")
    assert waited  # eight runs, four slots


def test_the_labs_limits_refuse_with_why_and_a_lecturer_goes_past_them(lab_page):
    url, session = lab_page
    student, lecturer = _client(url, "student1"), _client(url, "lee")
    long = student.submit(LONG_PROMPT, api_name="/run", **STOPPED_RUN)
    _wait_for_a_request(session)
    second = _status(student.predict("Ann has 2 pens. How many now?", api_name="/run"))
    assert second.startswith("⚠ you have 1 request going, this lab's limit per user; wait for it to end"), second
    other = _client(url, "student2")
    too_long = _status(other.predict("Ann has 2 pens.", api_name="/run", gen_length=512, block_size=32))
    assert too_long.startswith("⚠ this request decodes 512 answer positions, beyond this lab's limit of 256"), too_long
    assert "for the lecturer" in other.predict("tiny", "none", api_name="/load_model")[1]  # the model line, the status
    assert "would hold every student's run" in other.predict("LLaDA baseline", "LLaDA baseline", "", LONG_PROMPT,
                                                             api_name="/compare")[-1]
    # The lecturer sees who runs what, and stops a student's run; a student can do neither.
    table, note = lecturer.predict(api_name="/lab_requests")
    rows = table["data"]
    assert [row[0] for row in rows] == ["student1"] and rows[0][2] == LONG_PROMPT
    assert other.predict(api_name="/lab_requests")[1] == "The Lab view is for the lecturer."
    assert other.predict(rows[0][5], api_name="/lab_stop")[1].startswith("⚠ Only the lecturer")
    table, note = lecturer.predict(rows[0][5], api_name="/lab_stop")
    assert note.startswith(f"Stopped the requests of tab {rows[0][5]} (user student1)"), note
    assert LONG_PROMPT not in str(table["data"])  # the list redrawn once the run ended
    stopped = _status(long.result(timeout=120))
    assert stopped.startswith("Stopped by the lecturer (lee): "), stopped  # the student is told who stopped it
    # The lecturer is held by no limit: a run longer than the lab's slots (256 + 512) runs alone.
    done = _status(lecturer.predict(LONG_PROMPT, api_name="/run", gen_length=768, block_size=32))
    assert "Done: " in done and "length 768" in done, done  # (after a notice: past the tiny model's training length)


def test_in_a_browser_the_lab_tab_is_the_lecturers_only_and_a_row_clicked_is_stopped(lab_page, browser):  # noqa: F811
    url, session = lab_page
    contexts = {name: browser.new_context() for name in ("student1", "lee")}  # each its own sign-in cookie
    try:
        shown, pages = {}, {}
        for name, context in contexts.items():
            page = pages[name] = context.new_page()
            page.goto(url)
            page.fill("input[type=text]", name)
            page.fill("input[type=password]", PASSWORD)
            page.keyboard.press("Enter")
            page.wait_for_selector("#run-btn")
            page.wait_for_timeout(1500)  # the page's load events have answered
            shown[name] = [t.inner_text() for t in page.locator("button[role=tab]").all() if t.is_visible()]
            assert page.inner_text("#batch-mode") == ("Batching: packed (fastest; on a GPU in bf16 a request's tokens "
                                                      "may depend on who shares its batch)")
        assert shown == {"student1": ["Run", "Compare", "Tune"], "lee": ["Run", "Compare", "Tune", "Lab"]}
        # The lecturer clicks a student's row and stops it.
        long = _client(url, "student2").submit(LONG_PROMPT, api_name="/run", **STOPPED_RUN)
        _wait_for_a_request(session)
        lee = pages["lee"]
        lee.get_by_role("tab", name="Lab").click()
        assert "Batching: packed (fastest" in lee.inner_text("#lab-intro")  # the lecturer's view says it too
        lee.click("#lab-refresh")
        user_cell = lee.locator("#lab-requests").get_by_test_id("cell-0-0")
        assert user_cell.inner_text() == "student2"
        user_cell.click()
        tab_id = lee.locator("#lab-requests").get_by_test_id("cell-0-5").inner_text()
        lee.wait_for_function("document.querySelector('#lab-tab textarea, #lab-tab input').value.length > 8")
        assert lee.locator("#lab-tab textarea, #lab-tab input").first.input_value() == tab_id
        lee.click("#lab-stop")
        lee.wait_for_function("document.body.innerText.includes('Stopped the requests of tab')")
        assert "Stopping" not in lee.inner_text("body")
        assert "student2" not in lee.inner_text("#lab-requests")  # the list redrawn after the stop
    finally:
        for context in contexts.values():
            context.close()
    assert _status(long.result(timeout=120)).startswith("Stopped by the lecturer (lee)")
