"""Gradio's own routes on a page with sign-in: none answers a signed-out caller, and a tab's
session is its signed-in user's alone.

Gradio checks sign-in on the page's config, its API calls and its queue, but not on every route:
its ``cancel`` (which ends a tab's running event), ``reset``, ``heartbeat`` and ``stream``
routes answer anyone, and every route takes the tab's ``session_hash`` from the request as
given. A tab id is no secret (it travels in every request, and a lecturer's screen may show one),
so it must grant nothing by itself. This middleware, in front of every route:

1. refuses (401) every API route to a signed-out caller but the few the sign-in form itself asks;
2. binds each ``session_hash`` to the first signed-in user who uses it, and refuses (403) it to
   any other user: in the query (queue data), the path (heartbeat) or a JSON body (queue join,
   cancel, run), whichever route carries it.

A lecturer stops another user's runs from the Lab tab, which checks the role where it runs.
Torch-free: the page process runs it.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from gradio.routes import App
from starlette.requests import HTTPConnection

API = "/gradio_api/"
# Asked by the sign-in form before anyone has signed in (and by launch itself); none acts on a session.
OPEN_TO_ALL = {"login_check", "user", "app_id", "theme.css", "startup-events"}  # the last: launch asks it
MAX_SESSIONS = 100_000  # tabs remembered; the oldest forgotten first (a long lab's closed tabs)

Scope, Message = dict[str, Any], dict[str, Any]
Receive, Send = Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]


class SessionOwners:
    """Which signed-in user each tab id belongs to: the first to use it."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit, self._owner = limit, OrderedDict()

    def claim(self, session_hash: str, user: str) -> bool:
        """Whether ``user`` may use ``session_hash``: theirs already, or no one's until now."""
        owner = self._owner.setdefault(session_hash, user)
        self._owner.move_to_end(session_hash)
        while len(self._owner) > self.limit:
            self._owner.popitem(last=False)
        return owner == user


def signed_in_user(scope: Scope) -> str | None:
    """The user Gradio signed in for this request's cookie, or None."""
    app = scope.get("app")
    if not isinstance(app, App):
        return None
    cookies = HTTPConnection(scope).cookies
    token = cookies.get(f"access-token-{app.cookie_id}") or cookies.get(f"access-token-unsecure-{app.cookie_id}")
    return app.tokens.get(token) if token else None


def session_in_path_or_query(scope: Scope) -> str | None:
    path = scope["path"]
    if path.startswith(API + "heartbeat/"):
        return path[len(API + "heartbeat/"):].strip("/") or None
    return HTTPConnection(scope).query_params.get("session_hash")


def session_in_body(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None  # Gradio refuses it itself
    value = payload.get("session_hash") if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class SignedInRoutes:
    """The ASGI middleware of the module's docstring (installed only on a page with sign-in)."""

    def __init__(self, app: Callable, owners: SessionOwners | None = None) -> None:
        self.app, self.owners = app, owners or SessionOwners()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API):
            return await self.app(scope, receive, send)
        user = signed_in_user(scope)
        if user is None:
            if scope["path"][len(API):].strip("/") in OPEN_TO_ALL:
                return await self.app(scope, receive, send)
            return await _answer(send, 401, "Not authenticated: sign in first")
        session = session_in_path_or_query(scope)
        content_type = HTTPConnection(scope).headers.get("content-type", "")
        if scope["method"] == "POST" and "json" in content_type:
            chunks, more = [], True
            while more:  # a signed-in user's body, read whole as Gradio itself would
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            session = session or session_in_body(body)
            receive = _replay(body, receive)
        if session is not None and not self.owners.claim(session, user):
            return await _answer(send, 403, "this tab id belongs to another signed-in user")
        return await self.app(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app behind: the body already read, then whatever comes (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed
