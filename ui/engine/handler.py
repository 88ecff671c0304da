"""The opening every handler of a request to the engine shares (a run, a comparison, a sweep, a
model load): a request cancelled while it waited ends unrun, and settings it refuses end it with
one line in its tab's status."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr

from dllm_local.errors import DllmError, bounded

from .queue import CANCELLED, client_of

# What reading a request's settings raises when it refuses them: the settings' own checks, a bad
# "key=value", a count out of range. Said in the status line as they read.
REFUSED = (ValueError, TypeError, DllmError)


def engine_handler(handler: Callable) -> Callable:
    """``handler`` (a method of a tab with ``engine`` and ``status``, taking a ``request``) opened
    the one way. If the tab's Stop was pressed while the request waited in the queue it ends
    unrun, saying so, before its inputs are even read. Else it runs; a refusal (``REFUSED``) it
    raises, typically while it reads its settings before any work, ends it with "⚠ <why>" in the
    status line. Put it over ``inputs.checked``: the inputs' own schema errors (``gr.Error``) still
    reach the browser as errors. A generator handler stays a generator, a plain one plain."""
    find_request = inspect.signature(handler)

    def cancelled(tab: Any, args: tuple, kwargs: dict) -> bool:
        request = find_request.bind_partial(tab, *args, **kwargs).arguments["request"]
        return tab.engine.take_cancel(client_of(request))

    def refused(tab: Any, exc: Exception) -> dict:
        if isinstance(exc, gr.Error):  # the inputs' schema, not the settings: Gradio's to show
            raise exc
        return {tab.status: f"⚠ {bounded(str(exc))}"}

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def each(tab: Any, *args: Any, **kwargs: Any):
            if cancelled(tab, args, kwargs):
                yield {tab.status: CANCELLED}
                return
            try:
                yield from handler(tab, *args, **kwargs)
            except REFUSED as exc:
                yield refused(tab, exc)
        return each

    @functools.wraps(handler)
    def once(tab: Any, *args: Any, **kwargs: Any):
        if cancelled(tab, args, kwargs):
            return {tab.status: CANCELLED}
        try:
            return handler(tab, *args, **kwargs)
        except REFUSED as exc:
            return refused(tab, exc)
    return once
