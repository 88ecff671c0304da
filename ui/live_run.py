"""Following a run live: the Run button's handler streams the engine's steps into the views,
the grid at every redraw and the plots less often, and holds the view where it is while Follow
live is off."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dllm_local.settings import Settings
from dllm_local.values import FLAG, Text

from .controls import settings_from_controls
from .engine_handler import engine_handler
from .engine_queue import client_of, error_text, throttled
from .inputs import Choice, ColorBy, Fraction, KVView, PageState, Which, checked
from .run_views import draw, grid_at, step_slider
from .status_line import run_status

# Mid-run plot redraws at most this often (and none in a shorter run): redrawing the three plots
# costs a browser about half a second of CPU, taken from the engine on a small machine.
PLOTS_EVERY_S = 1.0


@dataclass
class LiveView:
    """What one client's view of its run going shows: whether it follows the run live (the Follow
    live box, read at every step) and the step and grid options it was last drawn with."""
    follow: bool
    step: int | None = None
    color_by: str = "step"
    what_if: float = 0.0


def mark_run(grid_html: str, run_no: int, steps: int, done: bool) -> str:
    """The live grid tagged with its run number, steps drawn and whether the run ended, so a
    browser (tests, ``bench/ui_latency.py``) can tell a new run's state from the previous one's."""
    return f'<div class="dl-run" data-run="{run_no}" data-steps="{steps}" data-done="{int(done)}">{grid_html}</div>'


class LiveRun:
    """The Run tab's live run. Mixed into ``RunTab``, whose ``live`` (the runs going, by client),
    ``run_numbers``, ``session``, ``specs``, components and ``shown`` it reads."""

    def viewed(self, request: gr.Request, step: int, color_by: str, what_if: float) -> None:
        """Note what this client's view shows, for its run going (drawn as it ends while the view is held)."""
        view = self.live.get(client_of(request))
        if view is not None:
            view.step, view.color_by, view.what_if = int(step), color_by, what_if

    @checked
    def set_follow(self, request: gr.Request, following: FLAG, trace: PageState, color_by: ColorBy, layer: Choice,
                   which: Which, kv_view: KVView, what_if: Fraction = 0.0) -> dict:
        """Follow live ticked or unticked: the run going reads it at its next step. Ticked, the
        view catches up with the trace at once; unticked, it stays where it is."""
        view = self.live.get(client_of(request))
        if view is not None:
            view.follow = bool(following)
        if not following or not trace or not trace.get("steps"):
            return {self.grid: gr.update()}
        n = len(trace["steps"])
        return {**self.shown(draw(trace, None, color_by, layer, which, kv_view, what_if)),
                self.scrub: step_slider(n, bool(trace.get("stats")), value=n - 1)}  # stats: the run has ended

    @engine_handler
    @checked
    def run(self, request: gr.Request, prompt: Text, trace: PageState, following: FLAG, color_by: ColorBy,
            layer: Choice, which: Which, kv_view: KVView, what_if: Fraction, **controls: Any) -> Iterator[dict]:
        client = client_of(request)
        chosen, notice = settings_from_controls(controls, self.specs)
        settings = Settings.from_dict(chosen)  # the one check of every knob
        notice = " ".join(filter(None, [notice, self.length_notice(settings.gen_length)]))
        clicked = time.perf_counter()
        run_no = next(self.run_numbers)
        live: dict = {}
        first_paint, plots_drawn = None, clicked
        sent, sent_steps = clicked, 0  # the last update: when, and how many steps it showed
        view = self.live[client] = LiveView(bool(following), color_by=color_by, what_if=what_if)
        try:
            for live, done in throttled(self.session.run(prompt, settings, run_id=client),
                                        backlog=self.session.waiting):
                n = len(live["steps"])
                if first_paint is None and n:
                    first_paint = time.perf_counter() - clicked
                update = {self.trace: live, self.controls["gen_length"]: gr.update(value=settings.gen_length)}
                if view.follow or (done and view.step is None):
                    # The grid at every redraw; the plots, far dearer to draw, less often.
                    with_plots = done or time.perf_counter() - plots_drawn >= PLOTS_EVERY_S
                    plots_drawn = time.perf_counter() if with_plots else plots_drawn
                    views = draw(live, None, view.color_by, layer, which, kv_view, view.what_if, with_plots=with_plots)
                    views["grid"] = mark_run(views["grid"], run_no, n, done)
                    update.update(self.shown(views))
                    update[self.scrub] = step_slider(n, done, value=max(0, n - 1))
                    view.step = max(0, n - 1)
                    held = None
                else:  # the view holds its step (and its hover, its open chips); the slider reaches further
                    update[self.scrub] = step_slider(n, done)
                    held = view.step
                    if done:  # the grid at the step it holds, tagged with how the run ended
                        update[self.grid] = mark_run(grid_at(live, held, view.color_by, view.what_if), run_no, n, done)
                # Before the next redraw the engine gets as far ahead as it got since the last one,
                # plus the steps it sent while this one was drawn.
                now = time.perf_counter()
                behind = n - sent_steps + self.session.waiting()
                update[self.status] = run_status(live, notice, first_paint, done, behind, now - sent,
                                                 None if done else held)
                sent, sent_steps = now, n
                if held is None and n > 1:
                    # The new maximum alone, before the step: sent together, the browser places the
                    # thumb against the old maximum, short of the step the number box shows.
                    yield {self.scrub: step_slider(n, done)}
                yield update
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
            yield {self.trace: live or trace, self.status: f"⚠ {error_text(exc)}"}
        finally:
            self.live.pop(client, None)
