"""A class on one page: who may run what, and the lecturer's view of the engine.

Every tab's runs decode together in the engine's batch (``dllm_local.serving.scheduler``). The
lab's limits, set by the lecturer when starting the page (``--max-users``, ``--runs-per-user``,
``--requests-per-minute``, ``--max-gen-length``), hold per user; a lecturer (a ``lecturer`` of
the users file, ``ui.signin``) is held by none of them and goes ahead of the waiting runs.
Without sign-in, each tab is a user of its own and nobody is a lecturer; the Lab tab is then
open to this machine's one user.

Torch-free: the page process reads it.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gradio as gr

from dllm_local.errors import DllmError

RATE_WINDOW_S = 60.0
# How long the Lab tab's Stop waits for the tab's requests to end (within one step each, usually)
# before it redraws the list: past it, the list shows them still ending.
STOP_WAIT_S = 15.0
# The engine's batch mode (app.py --batch-mode) as the page says it.
BATCHING = {"packed": "packed (fastest; on a GPU in bf16 a request's tokens may depend on who shares its batch)",
            "invariant": "invariant (each request's tokens as if alone; one forward per request a step, slower)"}


def batching_line(mode: str) -> str:
    """The page header's line on how the engine batches the runs of every tab."""
    return f"**Batching:** {BATCHING[mode]}"


def client_of(request) -> str:
    """Who is asking: the tab's (or gradio_client Client's) session hash; "local" outside Gradio."""
    return getattr(request, "session_hash", None) or "local"


class LabRefusal(DllmError):
    """A request the lab's limits turn away: said in the status line as it reads."""


@dataclass(frozen=True)
class Limits:
    max_users: int | None = None  # users with a request open at once
    runs_per_user: int | None = None  # a user's requests open at once (running or waiting)
    requests_per_minute: int | None = None  # a user's requests started in any 60 s
    max_gen_length: int | None = None  # the longest answer a request may ask for


@dataclass(frozen=True)
class Who:
    """Who is asking: the signed-in user (or, without sign-in, the tab), and whether a lecturer."""
    client: str  # the tab: its runs are its own to stop
    user: str
    lecturer: bool


class Lab:
    """The lab's limits, and who holds which request now (for the lecturer's list)."""

    def __init__(self, limits: Limits | None = None, roles: dict[str, str] | None = None) -> None:
        """``roles``: the users file's role by user name (None: no sign-in)."""
        self.limits, self.roles = limits or Limits(), roles
        self._lock = threading.Lock()
        self._open: dict[str, int] = defaultdict(int)  # user -> requests open
        self._started: dict[str, deque[float]] = defaultdict(deque)  # user -> when its recent requests began
        self.users_of: dict[str, str] = {}  # client -> user, for the lecturer's list
        # The lecturer's list names a tab by an id of its own: a tab's session id, on a projected
        # screen, would be a key to that tab for anyone who read it.
        self._shown_ids: dict[str, str] = {}  # client -> its id in the list
        self._clients: dict[str, str] = {}  # the reverse
        self.stoppers: dict[str, str] = {}  # client -> who stopped its requests from the Lab tab, told as they end

    @property
    def signed_in(self) -> bool:
        return self.roles is not None

    def who(self, request: gr.Request | None) -> Who:
        client = client_of(request)
        user = request.username if self.signed_in and request is not None else None
        return Who(client, user or client, bool(user) and self.roles.get(user) == "lecturer")

    def may_manage(self, who: Who) -> bool:
        """Whether ``who`` may see every request, stop any, switch the model or sweep: a lecturer,
        or anyone on a page without sign-in (this machine's own user)."""
        return who.lecturer or not self.signed_in

    def require_lecturer(self, who: Who, what: str, why: str = "it changes the page for everyone") -> None:
        if not self.may_manage(who):
            raise LabRefusal(f"{what} is for the lecturer in a lab: {why}")

    @contextmanager
    def admitted(self, who: Who, positions: int) -> Iterator[None]:
        """Hold one of ``who``'s requests for as long as it runs, or refuse it with why. ``positions``:
        the answer region it will decode, from its settings as they will run (``serving.cost``)."""
        limits, user = self.limits, who.user
        with self._lock:
            if not who.lecturer:
                longest = limits.max_gen_length
                if longest is not None and positions > longest:
                    raise LabRefusal(f"this request decodes {positions} answer positions, beyond this lab's limit of "
                                     f"{longest}; ask for {longest} or fewer (a canvas model decodes whole canvases)")
                if limits.runs_per_user is not None and self._open[user] >= limits.runs_per_user:
                    n = self._open[user]
                    raise LabRefusal(f"you have {n} request{'s' if n != 1 else ''} going, this lab's limit per "
                                     f"user; wait for {'it' if n == 1 else 'one'} to end or press Stop")
                started, now = self._started[user], time.monotonic()
                while started and now - started[0] > RATE_WINDOW_S:
                    started.popleft()
                if limits.requests_per_minute is not None and len(started) >= limits.requests_per_minute:
                    wait = RATE_WINDOW_S - (now - started[0])
                    raise LabRefusal(f"this lab allows {limits.requests_per_minute} requests a minute per user; "
                                     f"the next in {wait:.0f} s")
                active = {u for u, n in self._open.items() if n}
                if limits.max_users is not None and user not in active and len(active) >= limits.max_users:
                    raise LabRefusal(f"the lab is full: {len(active)} users have requests going (its limit); "
                                     f"try again in a moment")
                started.append(now)
            self._open[user] += 1
            self.users_of[who.client] = user
            if who.client not in self._shown_ids:
                shown = self._shown_ids[who.client] = f"tab-{secrets.token_hex(4)}"
                self._clients[shown] = who.client
        try:
            yield
        finally:
            with self._lock:
                self._open[user] -= 1
                self.stoppers.pop(who.client, None)  # its run has said so; a later run of the tab is not the one stopped

    def owns(self, who: Who) -> bool:
        """Whether ``who``'s tab id is theirs: no other signed-in user's requests ran under it."""
        return self.users_of.get(who.client, who.user) == who.user

    def client_of_tab(self, shown: str) -> str | None:
        """The tab behind an id of the lecturer's list."""
        return self._clients.get(shown)

    def listing(self, requests: list[dict]) -> list[list]:
        """The session's open requests (``Session.requests``) as the lecturer's table rows."""
        now = time.time()
        return [[self.users_of.get(r["owner"] or "", "(a tab)" if r["owner"] else "(the page)"), r["method"], r["what"],
                 f"waiting, {ordinal(r['place'])} in line" if r["place"] else f"step {r['steps']}",
                 round(now - r["started"], 1), self._shown_ids.get(r["owner"] or "", "")] for r in requests]


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


COLUMNS = ["user", "request", "what", "state", "seconds", "tab"]


class LabTab:
    """The lecturer's view: every request open on the engine, by user, and Stop for any of them."""

    def __init__(self, engine) -> None:
        self.engine, self.session, self.lab = engine, engine.session, engine.lab
        gr.Markdown("Every request the engine is answering, whoever's tab it came from. Runs decode together in "
                    "one batch; a waiting run is told its place in line. Stop ends the chosen tab's requests only.\n\n"
                    + batching_line(self.session.batch_mode), elem_id="lab-intro")
        self.table = gr.Dataframe(headers=COLUMNS, interactive=False, elem_id="lab-requests", wrap=True,
                                  column_widths=["14%", "9%", "37%", "15%", "8%", "17%"])
        with gr.Row():
            self.tab_box = gr.Textbox(label="Tab to stop (click its row in the table)", elem_id="lab-tab")
            self.stop_btn = gr.Button("Stop its requests", variant="stop", elem_id="lab-stop")
            self.refresh_btn = gr.Button("Refresh", elem_id="lab-refresh")
        self.note = gr.Markdown()

    def wire(self, tab: gr.Tab) -> None:
        """The list drawn when the tab is opened and on Refresh (no polling: most pages are students')."""
        tab.select(self.show, None, [self.table, self.note], queue=False, api_visibility="private")
        self.refresh_btn.click(self.show, None, [self.table, self.note], queue=False, api_name="lab_requests",
                               show_progress="hidden")
        self.stop_btn.click(self.stop, [self.tab_box], [self.table, self.note], queue=False, api_name="lab_stop")
        self.table.select(self.pick, None, [self.tab_box], queue=False, api_visibility="private")

    def pick(self, evt: gr.SelectData) -> str | dict:
        """A click on a row names its tab for Stop."""
        return str(evt.row_value[COLUMNS.index("tab")]) if evt.row_value else gr.update()

    def tab_shown(self, request: gr.Request) -> gr.Tab:
        return gr.Tab(visible=self.lab.may_manage(self.lab.who(request)))

    def show(self, request: gr.Request) -> tuple:
        who = self.lab.who(request)
        if not self.lab.may_manage(who):
            return [], "The Lab view is for the lecturer."
        return self.lab.listing(self.session.requests()), gr.update()

    def stop(self, tab: str, request: gr.Request) -> tuple:
        """Stop ``tab``'s requests (its page is told who stopped them), wait for them to end, and
        redraw the list: the note says what happened, not what was asked."""
        who = self.lab.who(request)
        if not self.lab.may_manage(who):
            return gr.update(), "⚠ Only the lecturer stops another tab's requests."
        tab = (tab or "").strip()
        if not tab:
            return gr.update(), "Give the id of a tab from the table."
        client = self.lab.client_of_tab(tab) or ""
        self.lab.stoppers[client] = f"the lecturer ({who.user})" if who.lecturer else "the Lab tab"
        if not client or not self.session.stop(client):
            self.lab.stoppers.pop(client, None)
            return self.lab.listing(self.session.requests()), f"Nothing of tab {tab!r} is going."
        end = time.monotonic() + STOP_WAIT_S
        while self.session.owns(client) and time.monotonic() < end:
            time.sleep(0.05)
        user = self.lab.users_of.get(client, tab)
        note = (f"Stopped the requests of tab {tab} (user {user}); its page says who stopped them."
                if not self.session.owns(client) else
                f"The requests of tab {tab} (user {user}) were asked to stop and are still ending: Refresh shows them.")
        return self.lab.listing(self.session.requests()), note
