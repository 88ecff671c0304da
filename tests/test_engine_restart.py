"""The engine's death under a class (issue 61): killed during a run (as the kernel's OOM killer
would) or while it starts again, every request waiting or arriving meanwhile is answered once the
engine is up, or told the real cause; however many there are, and however often it happens."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from dllm_local.errors import EngineError
from dllm_local.serving.session import Session

PROMPT = "Ben has 9 coins, finds 8 more, then gives away 9. How many now?"
SETTINGS = {"gen_length": 32, "block_size": 32}
CLIENTS = 4
ANSWER_WITHIN_S = 120


@pytest.fixture(scope="module")
def session():
    s = Session("tiny", device="cpu", guider=None, threads=1)
    yield s
    s.close()


def _clients(session: Session, n: int) -> tuple[list[threading.Thread], dict[int, object]]:
    """``n`` tabs' runs sent at once, each answer (its final ids, or the error it was told) kept."""
    answers: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            answers[i] = list(session.run(PROMPT, SETTINGS, run_id=f"tab-{i}"))[-1]["trace"]["final_ids"]
        except EngineError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, answers


def _all_answered(threads: list[threading.Thread]) -> None:
    end = time.monotonic() + ANSWER_WITHIN_S
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a request was never answered"


def _new_process(session: Session, old_pid: int) -> int:
    end = time.monotonic() + ANSWER_WITHIN_S
    while session._process.pid in (None, old_pid) and time.monotonic() < end:
        time.sleep(0.01)
    return session._process.pid


def test_requests_sent_while_the_engine_restarts_are_all_answered_every_time(session):
    alone = list(session.run(PROMPT, SETTINGS))[-1]["trace"]["final_ids"]
    for _ in range(2):  # killed twice: the second time under a process the first restart started
        pid = session._process.pid
        os.kill(pid, signal.SIGKILL)
        session._process.join(10)
        threads, answers = _clients(session, CLIENTS)
        _all_answered(threads)
        assert answers == {i: alone for i in range(CLIENTS)}, answers


def test_a_kill_while_it_starts_tells_every_waiter_the_cause_and_the_next_request_starts_it(session):
    alone = list(session.run(PROMPT, SETTINGS))[-1]["trace"]["final_ids"]
    pid = session._process.pid
    os.kill(pid, signal.SIGKILL)
    session._process.join(10)
    threads, answers = _clients(session, CLIENTS)
    restarted = _new_process(session, pid)
    os.kill(restarted, signal.SIGKILL)  # while it loads its model, with the clients waiting for it
    _all_answered(threads)
    for answer in answers.values():  # the kill reached it loading, or (a fast machine) running them
        assert answer == alone or isinstance(answer, EngineError) and "signal 9" in str(answer), answer
    assert list(session.run(PROMPT, SETTINGS))[-1]["trace"]["final_ids"] == alone
