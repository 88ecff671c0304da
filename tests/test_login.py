"""The guarded sign-in over real HTTP against a real Gradio server: back-off per name and per
address (the right password refused inside it, the wait bounded), the same hash for unknown names
as for real ones, the hash off the event loop, a signed-in user answered fast under a flood."""
from __future__ import annotations

import asyncio
import hashlib
import socket
import statistics
import threading
import time

import httpx
import pytest

from ui.login import FREE_PER_ADDRESS, FREE_PER_NAME, MAX_WAIT, SignIn, Throttle
from ui.signin import ITERATIONS, MIN_ITERATIONS, User, hash_password


PASSWORD = "the-password"


def _serve(names: list[str], iterations: int):
    """A real Gradio page behind ``SignIn`` on a free port, each user's password PASSWORD (one hash
    made, not one a user): (its url, the page, the sign-in)."""
    import gradio as gr

    digest = hash_password(PASSWORD, iterations=iterations)
    sign_in = SignIn({name: User(name, "student", digest) for name in names})
    with gr.Blocks() as page:
        gr.Textbox("behind the sign-in")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                            **sign_in.launch_options())
    return url, page, sign_in


@pytest.fixture(scope="module")
def server():
    url, page, sign_in = _serve(["ann", "ben"], MIN_ITERATIONS)
    yield url, sign_in
    page.close()


def _from(address: str) -> httpx.Client:
    """A client whose requests come from ``address`` (any 127.x.y.z reaches the server on this machine)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


def _try(client: httpx.Client, url: str, name: str, password: str) -> httpx.Response:
    return client.post(f"{url}login", data={"username": name, "password": password})


def test_a_name_waits_after_its_failures_from_every_address_the_right_password_included(server):
    url, _ = server
    with _from("127.0.1.1") as guesser, _from("127.0.1.2") as other:
        assert [_try(guesser, url, "ann", "guess").status_code for _ in range(FREE_PER_NAME)] == [400] * FREE_PER_NAME
        refused = _try(guesser, url, "ann", PASSWORD)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert "too many failed sign-ins: try again in 1 s" in refused.text
        assert _try(other, url, "ann", PASSWORD).status_code == 429  # the name waits, wherever from
        assert _try(other, url, "ben", PASSWORD).status_code == 200  # another name does not
        time.sleep(1.1)  # the wait over, the right password signs in (and clears the name's count)
        assert _try(other, url, "ann", PASSWORD).status_code == 200
        assert _try(other, url, "ann", "guess").status_code == 400


def test_an_address_waits_after_its_failures_whatever_names_it_tries(server):
    url, _ = server
    with _from("127.0.2.1") as guesser, _from("127.0.2.2") as other:
        answers = [_try(guesser, url, f"ghost{k}", "guess").status_code for k in range(FREE_PER_ADDRESS)]
        assert answers == [400] * FREE_PER_ADDRESS  # a new name each time: no name's back-off
        assert _try(guesser, url, "ben", PASSWORD).status_code == 429
        assert _try(other, url, "ben", PASSWORD).status_code == 200


def test_a_wait_doubles_up_to_a_bound_and_ends_however_many_the_failures():
    now = [1000.0]
    throttle = Throttle(free=3, clock=lambda: now[0])
    waits = []
    for _ in range(3 + 10):
        waits.append(throttle.wait("ann"))
        throttle.failed("ann")
    assert waits == [0, 0, 0, 1, 2, 4, 8, 16, 32, MAX_WAIT, MAX_WAIT, MAX_WAIT, MAX_WAIT]
    for _ in range(5000):  # a flood's count: the wait stays bounded (and 2 ** 4997 does not overflow)
        throttle.failed("ann")
    assert throttle.wait("ann") == MAX_WAIT
    now[0] += MAX_WAIT
    assert throttle.wait("ann") == 0  # never locked out for longer than MAX_WAIT after the last try


def test_an_unknown_name_costs_the_same_hash_as_a_real_one_off_the_event_loop(server, monkeypatch):
    url, _ = server
    real = hashlib.pbkdf2_hmac
    hashes: list[tuple[int, bool]] = []

    def counted(name, password, salt, iterations, *rest):
        try:
            asyncio.get_running_loop()
            on_a_loop = True
        except RuntimeError:
            on_a_loop = False
        hashes.append((iterations, on_a_loop))
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    with _from("127.0.3.1") as guesser:
        assert _try(guesser, url, "ben", "wrong-password").status_code == 400
        for_a_user, hashes[:] = list(hashes), []
        assert _try(guesser, url, "nobody", "wrong-password").status_code == 400
    assert for_a_user == hashes == [(MIN_ITERATIONS, False)]


def test_a_flood_of_wrong_passwords_leaves_a_signed_in_user_answered_fast():
    guessed = [[f"user{k}{x}" for x in "abc"] for k in range(8)]  # three real names a guesser
    url, page, _ = _serve(["lee", *(name for names in guessed for name in names)], ITERATIONS)
    started = time.perf_counter()
    hash_password("one hash", iterations=ITERATIONS)
    one_hash = time.perf_counter() - started  # on this machine, as loaded as it is now
    stop, wrong = threading.Event(), []

    def guesser(k: int) -> None:  # from its own address, within both back-offs' free tries
        with _from(f"127.0.4.{k + 1}") as client:
            for name in guessed[k] * (FREE_PER_NAME - 1):
                if not stop.is_set():
                    wrong.append(_try(client, url, name, "guess").status_code)

    try:
        with _from("127.0.4.100") as lee:
            assert _try(lee, url, "lee", PASSWORD).status_code == 200
            flood = [threading.Thread(target=guesser, args=(k,)) for k in range(len(guessed))]
            for thread in flood:
                thread.start()
            while not wrong:  # the first wrong password answered: hashes are under way
                time.sleep(0.01)
            times = []
            for _ in range(8):
                time.sleep(0.02)
                started = time.perf_counter()
                assert lee.get(f"{url}gradio_api/login_check").status_code == 200
                times.append(time.perf_counter() - started)
            flooding = sum(thread.is_alive() for thread in flood)
            stop.set()
            for thread in flood:
                thread.join()
    finally:
        page.close()
    assert flooding >= 4 and set(wrong) == {400}  # the flood was hashing all along
    # On the event loop, a request waits for the hashes queued before it (eight clients: up to 8 hashes)
    assert statistics.median(times) < max(0.1, 2 * one_hash), (times, one_hash)
