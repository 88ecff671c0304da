"""Gradio's sign-in, guarded: back-off per name and per address, the same work for every name, the hash off the loop.

``SignIn(read_users(FILE)).launch_options()`` is what ``launch`` takes: the check (a coroutine
function, so Gradio awaits it on its event loop) and the middleware that tells it the client's
address (Gradio hands the check a name and a password, nothing of the request). What it guarantees:

- **Back-off.** Each name and each client address has its failed tries counted, each from the
  moment it starts (a burst of simultaneous tries counts in full). After ``FREE_PER_NAME`` of them
  for a name, or ``FREE_PER_ADDRESS`` from an address (a class may share one router), the next try
  must wait 1 s, 2 s, 4 s ... at most ``MAX_WAIT`` (60 s) after the last one. A try inside the wait
  is refused at once with HTTP 429 and Retry-After, the right password included, and costs no hash.
  Failures are forgotten after ``FORGET`` of quiet, a name's when it signs in. No one waits longer
  than ``MAX_WAIT`` after the last failed try: to keep a name waiting an attacker has to go on
  guessing it, at most one guess a minute, each from an address under its own back-off.
- **The same work for every name.** An unknown name's password is hashed against a stand-in hash
  with the users' own iteration count: a wrong password costs the same for a real name as for an
  unknown one, so the time of an answer does not tell which names are users. A name that cannot be
  a user's (``ui.signin.NAME``, public) is refused without a hash.
- **The hash off the event loop**, in ``HASHERS`` threads of its own; past ``MAX_WAITING`` tries
  waiting for them, a try is refused at once (429). A flood costs the page those threads' cores,
  never its event loop (signed-in users' requests) nor Gradio's worker threads.

The address is the connection's peer; the server (uvicorn) takes ``X-Forwarded-For`` only from a
peer on this machine, such as the ``--share`` tunnel. ``tests/test_login.py`` checks each guarantee
over real HTTP against a real Gradio server.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from ui.signin import NAME, User, check_password

FREE_PER_NAME = 5
FREE_PER_ADDRESS = 20
MAX_WAIT = 60.0  # s: the longest anyone is turned away after a failed try
FORGET = 15 * 60.0  # s of quiet after which a key's failures are forgotten
MAX_KEYS = 10_000  # names and addresses remembered, each throttle; the least recently failed forgotten first
HASHERS = 2  # threads hashing passwords: what a flood of tries may cost the machine
MAX_WAITING = 64  # tries waiting for a hasher: about 3 s of them at 200,000 iterations

_ADDRESS: ContextVar[str | None] = ContextVar("sign_in_address", default=None)


class ClientAddress:
    """ASGI middleware: each HTTP request's client address, where the sign-in check can read it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _ADDRESS.set(scope["client"][0] if scope.get("client") else None)
        try:
            await self.app(scope, receive, send)
        finally:
            _ADDRESS.reset(token)


class Throttle:
    """Failed tries by key (a name or an address) and the wait they earn."""

    def __init__(self, free: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.free = free
        self.clock = clock
        self._failed: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (failures, last one's time)

    def _count(self, key: str) -> tuple[int, float]:
        failures, last = self._failed.get(key, (0, 0.0))
        return (failures, last) if self.clock() - last < FORGET else (0, last)

    def wait(self, key: str) -> float:
        """Seconds before ``key`` may try again; 0: now."""
        failures, last = self._count(key)
        if failures < self.free:
            return 0.0
        earned = min(MAX_WAIT, 2.0 ** min(failures - self.free, 16))  # the power capped: no overflow
        return max(0.0, last + earned - self.clock())

    def failed(self, key: str) -> None:
        failures, _ = self._count(key)
        self._failed.pop(key, None)
        self._failed[key] = (failures + 1, self.clock())
        if len(self._failed) > MAX_KEYS:
            self._failed.popitem(last=False)

    def undo(self, key: str) -> None:
        """One failure taken back: a try counted as it started that turned out right."""
        failures, last = self._count(key)
        if failures > 1:
            self._failed[key] = (failures - 1, last)
        else:
            self._failed.pop(key, None)

    def forget(self, key: str) -> None:
        self._failed.pop(key, None)


def _refused(seconds: float, why: str) -> HTTPException:
    wait = max(1, math.ceil(seconds))
    return HTTPException(429, f"{why}: try again in {wait} s", headers={"Retry-After": str(wait)})


class SignIn:
    """Gradio's ``auth``: a user of the file with the right password, tried under the guarantees above."""

    def __init__(self, users: dict[str, User], clock: Callable[[], float] = time.monotonic) -> None:
        self.users = users
        self.names = Throttle(FREE_PER_NAME, clock)
        self.addresses = Throttle(FREE_PER_ADDRESS, clock)
        counts = Counter(int(user.digest.split("$")[1]) for user in users.values())
        # the users' usual iteration count: an unknown name's hash takes as long as theirs
        self._stand_in = f"pbkdf2_sha256${max(counts, key=lambda n: (counts[n], n))}${'0' * 32}${'0' * 64}"
        self._hashers = ThreadPoolExecutor(HASHERS, thread_name_prefix="sign-in")
        self._waiting = 0

    def launch_options(self) -> dict[str, Any]:
        """``launch``'s keyword arguments for this sign-in (``page.launch(..., **sign_in.launch_options())``)."""
        return {"auth": self.check, "app_kwargs": {"middleware": [Middleware(ClientAddress)]}}

    def matches(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s: one hash, an unknown name's against the stand-in."""
        user = self.users.get(name)
        right = check_password(password, user.digest if user else self._stand_in)
        return right and user is not None

    async def check(self, name: str, password: str) -> bool:
        """The sign-in: False for a wrong name or password; HTTP 429 inside a back-off or past the waiting bound."""
        address = _ADDRESS.get() or "an address not told"  # without the middleware: one shared back-off
        tries = [(self.addresses, address)] + ([(self.names, name)] if NAME.fullmatch(name) else [])
        if (wait := max(throttle.wait(key) for throttle, key in tries)) > 0:
            raise _refused(wait, "too many failed sign-ins")
        if self._waiting >= MAX_WAITING:
            raise _refused(1, "too many sign-ins at once")
        for throttle, key in tries:
            throttle.failed(key)  # counted as it starts: simultaneous tries all count
        if not NAME.fullmatch(name):
            return False
        self._waiting += 1
        try:
            right = await asyncio.get_running_loop().run_in_executor(self._hashers, self.matches, name, password)
        finally:
            self._waiting -= 1
        if right:
            self.names.forget(name)
            self.addresses.undo(address)
        return right

    def role(self, name: str | None) -> str | None:
        user = self.users.get(name or "")
        return user.role if user else None
