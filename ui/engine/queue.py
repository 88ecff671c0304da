"""Every request that uses the engine waits in one queue. Here: who is asking, Stop for one tab,
the pace at which a streamed run is redrawn, and errors told in words."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import gradio as gr

from dllm_local.errors import NEVER_RAN, DllmError

from ..lab.classroom import Lab, client_of, ordinal

# Every event that talks to the engine (runs, compare, sweep, model switch) waits in one queue
# group: one at a time, in order, so none meets a busy engine.
ENGINE = {"concurrency_limit": 1, "concurrency_id": "engine", "queue": True}
# Runs go to the engine at once: it decodes them together in one batch, and tells a run that waits
# for a slot its place in line (a lecturer's ahead of the others).
RUNS = {"concurrency_limit": None, "concurrency_id": "runs", "queue": True}
CANCELLED = NEVER_RAN
REDRAW_EVERY_S = 0.2  # throttle: the browser keeps up; the first step and the final state are always drawn
PAGE_SHARE = 0.2  # at most this share of a run's time goes to drawing it


class EngineQueue:
    """The session as the tabs share it: each client's run is its own to stop, and a request
    still waiting in the page's queue can be cancelled before it starts."""

    def __init__(self, session, page: gr.Blocks, lab: Lab | None = None) -> None:
        self.session, self.page, self.lab = session, page, lab or Lab()
        self.cancelled: set[str] = set()  # clients whose queued request was cancelled by Stop
        # Clients whose request runs the engine several times (Compare), and those of them that
        # pressed Stop: a Stop between two runs reaches no run, and must still end the request.
        self.multi_run: set[str] = set()
        self.stop_asked: set[str] = set()

    @contextmanager
    def several_runs(self, client: str) -> Iterator[Callable[[], bool]]:
        """For a request that runs the engine several times: yields "has Stop been pressed?"."""
        self.multi_run.add(client)
        self.stop_asked.discard(client)
        try:
            yield lambda: client in self.stop_asked
        finally:
            self.multi_run.discard(client)
            self.stop_asked.discard(client)

    def take_cancel(self, client: str) -> bool:
        """Whether this client's request, just started, was cancelled by Stop while it waited."""
        if client in self.cancelled:
            self.cancelled.discard(client)
            return True
        return False

    def _queued(self, client: str) -> bool:
        """Whether ``client`` has an engine request waiting in the page's queue (best effort:
        read from Gradio's queue)."""
        try:
            waiting = self.page._queue.event_queue_per_concurrency_id.get(ENGINE["concurrency_id"])
            return waiting is not None and any(event.session_hash == client for event in waiting.queue)
        except AttributeError:
            return False

    def stop(self, request: gr.Request) -> str:
        """Stop this client's own run or sweep; never another's (a tab id used by another signed-in
        user than the one whose requests ran under it stops nothing)."""
        client = client_of(request)
        if not self.lab.owns(self.lab.who(request)):
            return "⚠ This tab's requests are another user's: only they, or the lecturer, can stop them."
        if client in self.multi_run:
            self.stop_asked.add(client)
        mine = [r for r in self.session.requests() if r["owner"] == client]
        if self.session.stop(client) or client in self.multi_run:
            if mine and all(r["place"] != 0 for r in mine):  # waiting in the engine's line: it never runs
                return CANCELLED
            return "Stopping after the current step…"
        if self._queued(client):  # it ends unrun when its turn comes (see take_cancel)
            self.cancelled.add(client)
            return CANCELLED
        if self.session.requests():
            return "Nothing of this tab is running (another tab's run can only be stopped from that tab)."
        return "Nothing is running."

    def wire_stop(self, button: gr.Button, note: gr.Markdown, events: list, api_name: str) -> None:
        """Stop for one tab: its own run stops within a step (and is drawn as it ended); its own
        request still waiting in the queue is taken out of it; another tab's run is left alone.

        Gradio's ``cancels`` would also end this tab's running event without its last update, so a
        queued request is cancelled on the server instead: it ends with a message, unrun, when its
        turn comes (``stop`` / ``take_cancel``). Stop's reply goes to its own ``note``, never to the
        run's status line: under load it can arrive after the run's final update, and would then
        hide how the run ended. The note is cleared once the run (``events``) has ended: the status
        line then says how."""
        button.click(self.stop, None, [note], queue=False, api_name=api_name, show_progress="hidden")
        for event in events:
            event.then(lambda: "", None, [note], queue=False, api_visibility="private", show_progress="hidden")


def place_text(place: int) -> str:
    """The status line of a run waiting for the engine."""
    return f"Waiting for the engine: {ordinal(place)} in line (the runs before it decode together)…"


def throttled(events: Iterable[dict], every: float = REDRAW_EVERY_S, page_share: float = PAGE_SHARE,
              backlog: Callable[[], int] = lambda: 0, heavy: Callable[[], bool] = lambda: False,
              crowd: Callable[[], int] = lambda: 1) -> Iterator[tuple[dict, bool]]:
    """The growing trace of a session's run events (``Session.run``); yield ``(trace, done)`` at
    most every ``every`` seconds (``({"queued": n}, False)`` while the run waits, n-th in line),
    and always the start (the empty grid), the first step (it sets
    the click-to-paint latency) and the final state.

    The gap between redraws also grows with what a redraw costs (the time the consumer takes
    before asking for more), so drawing takes at most ``page_share`` of the run: the engine has
    a process of its own, but on a small machine the page and the browser share its cores.
    ``heavy``: whether the redraw just taken was one of the consumer's rare dear ones (the live
    run's plots, paced by the live run itself): its cost leaves the gap as it was, or one plot
    redraw would hold back the grid redraws after it.
    ``backlog``: how many events have arrived unread (``Session.waiting``); a redraw that is due
    waits for the last of them, so what is drawn is the newest step the engine has sent.
    ``crowd``: how many runs the page is drawing at once (a class's tabs): each redraws that
    many times less often, so drawing them all still takes at most ``page_share`` of the time.
    """
    last, gap = -math.inf, every
    for event in events:
        if "queued" in event:  # waiting for the engine: its place in line, no trace yet
            yield {"queued": event["queued"]}, False
            continue
        live, done = event["trace"], "end" in event
        opening = "start" in event or ("step" in event and len(live["steps"]) == 1)  # the empty grid, the first step
        if done or opening or (time.perf_counter() - last >= gap * max(1, crowd()) and not backlog()):
            yielded = time.perf_counter()
            yield live, done
            last = time.perf_counter()
            if not heavy():
                gap = max(every, (last - yielded) * (1 - page_share) / page_share)


def error_text(exc: Exception) -> str:
    """An error as the status line says it: the project's own errors by their message alone."""
    name = type(exc).__name__
    text = str(exc) or name
    return text if isinstance(exc, DllmError) else f"{name}: {text}"
