"""Following a run live: the Run button's handler streams the engine's steps into the views,
the grid at every redraw and the plots less often, and holds the view where it is while Follow
live is off."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dllm_local.serving.cost import answer_positions
from dllm_local.settings import Settings
from dllm_local.values import FLAG, Text

from .controls import settings_from_controls
from ..engine.handler import engine_handler
from ..engine.queue import client_of, error_text, place_text, throttled
from ..parts.inputs import Choice, ColorBy, FontScale, Fraction, KVView, PageState, Theme, Which, checked
from ..lab.classroom import Who
from .views import draw, grid_at, step_slider
from .status_line import ran_length_notice, run_status

# Mid-run plot redraws at most this often (and none in a shorter run), and further apart as they
# cost more: at most PLOTS_SHARE of the run's time. The three plots of a 512-step run cost the
# server about 0.4 s and the browser more (megabytes of figure JSON), and the grid redraws
# (engine_queue.throttled) wait while they are drawn.
PLOTS_EVERY_S = 1.0
PLOTS_SHARE = 0.1


@dataclass
class LiveView:
    """What one client's view of its run going shows: whether it follows the run live (the Follow
    live box, read at every step), the step and grid options it was last drawn with, and the step
    at which every view, the plots too, was last drawn (None: not yet, for this run)."""
    follow: bool
    step: int | None = None
    full_at: int | None = None
    color_by: str = "step"
    what_if: float = 0.0


def mark_run(grid_html: str, run_no: int, steps: int, done: bool) -> str:
    """The live grid tagged with its run number, steps drawn and whether the run ended, so a
    browser (tests, ``bench/ui_latency.py``) can tell a new run's state from the previous one's."""
    return f'<div class="dl-run" data-run="{run_no}" data-steps="{steps}" data-done="{int(done)}">{grid_html}</div>'


class LiveRun:
    """The Run tab's live run. Mixed into ``RunTab``, whose ``live`` (by client: the runs going,
    and the Follow live box of a client whose run has not started yet), ``last`` (by client: the
    trace its run going has reached, drawn again if it fails), ``run_numbers``, ``engine``,
    ``session``, ``specs``, components, ``shown`` and ``preset_not_landed`` it reads."""

    def viewed(self, request: gr.Request, step: int, color_by: str, what_if: float, full: bool = True) -> None:
        """Note what this client's view shows, for its run going (drawn as it ends while the view
        is held); ``full``: every view was drawn at ``step``, not the grid alone."""
        view = self.live.get(client_of(request))
        if view is not None:
            view.step, view.color_by, view.what_if = int(step), color_by, what_if
            view.full_at = int(step) if full else view.full_at

    @checked
    def set_follow(self, request: gr.Request, following: FLAG, trace: PageState, color_by: ColorBy, layer: Choice,
                   which: Which, kv_view: KVView, what_if: Fraction = 0.0, font_scale: FontScale = "1×",
                   theme: Theme = "light") -> dict:
        """Follow live ticked or unticked: the run going reads it at its next step. Ticked, the
        view catches up with the trace at once; unticked, it stays where it is."""
        client = client_of(request)
        if client in self.live:
            self.live[client].follow = bool(following)
        else:  # a run clicked but not started yet reads it as it starts (its own input is older)
            self.live[client] = LiveView(bool(following))
        if not following or not trace or not trace.get("steps"):
            return {self.grid: gr.update()}
        n = len(trace["steps"])
        return {**self.shown(draw(trace, None, color_by, layer, which, kv_view, what_if, font_scale=font_scale,
                                  theme=theme)),
                self.scrub: step_slider(n, bool(trace.get("stats")), value=n - 1)}  # stats: the run has ended

    @engine_handler
    @checked
    def run(self, request: gr.Request, prompt: Text, trace: PageState, following: FLAG, color_by: ColorBy,
            layer: Choice, which: Which, kv_view: KVView, what_if: Fraction, font_scale: FontScale = "1×",
            theme: Theme = "light", preset: Choice | None = None, applied: Choice | None = None,
            **controls: Any) -> Iterator[dict]:
        client = client_of(request)
        # A preset picked and Run clicked at once: the preset's settings, not the controls its
        # reply had not reached yet (a run of the previous settings under the preset's name).
        landing = self.preset_not_landed(preset, applied)
        prompt, controls = landing.get("prompt", prompt), {**controls, **landing.get("controls", {})}
        layer, which, kv_view = (landing.get("view", {}).get(k, v) for k, v in
                                 (("layer", layer), ("which", which), ("kv_view", kv_view)))
        # The model loaded now says which settings it takes (another tab may have switched it).
        chosen, notice = settings_from_controls(controls, self.specs, self.session.info())
        settings = Settings.from_dict(chosen)  # the one check of every knob
        notice = " ".join(filter(None, [notice, self.length_notice(settings.gen_length)]))
        clicked = time.perf_counter()
        run_no = next(self.run_numbers)
        told = self.live.get(client)  # Follow live changed since the click, before the run started
        view = self.live[client] = LiveView(told.follow if told else bool(following), color_by=color_by,
                                            what_if=what_if)
        who = self.engine.lab.who(request)
        try:
            with self.engine.lab.admitted(who, answer_positions(settings, self.session.info())):
                yield from self._follow(prompt, settings, who, view, clicked, run_no, notice,
                                        layer, which, kv_view, font_scale, theme)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
            yield {self.trace: self.last.get(client) or trace, self.status: f"⚠ {error_text(exc)}"}
        finally:
            self.live.pop(client, None)
            self.last.pop(client, None)

    def _follow(self, prompt: str, settings: Settings, who: Who, view: LiveView, clicked: float, run_no: int,
                notice: str, layer: str, which: str, kv_view: str, font_scale: str, theme: str) -> Iterator[dict]:
        """The run's events drawn as they come (see ``run``); a lecturer's run goes ahead of the waiting ones."""
        first_paint, plots_drawn = None, clicked
        plots_every, with_plots = PLOTS_EVERY_S, False  # the gap between plot redraws; this redraw's kind
        sent, sent_steps = clicked, 0  # the last update: when, and how many steps it showed
        client = who.client
        for live, done in throttled(self.session.run(prompt, settings, run_id=client, first=who.lecturer),
                                    backlog=lambda: self.session.waiting(client), heavy=lambda: with_plots,
                                    crowd=lambda: len(self.live)):
            if "queued" in live:
                yield {self.status: place_text(live["queued"])}
                continue
            self.last[client] = live
            n = len(live["steps"])
            redrawn, with_plots = time.perf_counter(), False
            if first_paint is None and n:
                first_paint = time.perf_counter() - clicked
            update = {self.trace: live}
            if not n:  # the length the engine runs, said (the control keeps the user's: the next run asks it again)
                notice = " ".join(filter(None, [notice, ran_length_notice(live, settings.gen_length)]))
            if view.follow or view.full_at is None:
                # Following, or this run not yet on screen in full (Follow live unticked at or
                # right after the click): the newest step. The grid at every redraw; the plots,
                # far dearer to draw, less often, and always for a view that is about to hold.
                with_plots = done or not view.follow or redrawn - plots_drawn >= plots_every * max(1, len(self.live))
                plots_drawn = redrawn if with_plots else plots_drawn
                update.update(self._drawn(live, None, view, run_no, done, with_plots, layer, which, kv_view,
                                          font_scale, theme))
                update[self.scrub] = step_slider(n, done, value=max(0, n - 1))
                view.step = max(0, n - 1)
                view.full_at = view.step if with_plots and n else view.full_at
                held = None
            else:  # the view holds its step (and its hover, its open chips); the slider reaches further
                update[self.scrub] = step_slider(n, done)
                held = view.step
                if view.full_at != held:  # unticked between two plot redraws: every view at the held step
                    update.update(self._drawn(live, held, view, run_no, done, True, layer, which, kv_view,
                                              font_scale, theme))
                    view.full_at, with_plots = held, True
                elif done:  # the grid at the step it holds, tagged with how the run ended
                    update[self.grid] = mark_run(grid_at(live, held, view.color_by, view.what_if), run_no, n, done)
            # Before the next redraw the engine gets as far ahead as it got since the last one,
            # plus the steps it sent while this one was drawn.
            now = time.perf_counter()
            behind = n - sent_steps + self.session.waiting(client)
            update[self.status] = run_status(live, notice, first_paint, done, behind, now - sent,
                                             None if done else held, self.engine.lab.stoppers.get(client))
            sent, sent_steps = now, n
            if held is None and n > 1:
                # The new maximum alone, before the step: sent together, the browser places the
                # thumb against the old maximum, short of the step the number box shows.
                yield {self.scrub: step_slider(n, done)}
            yield update
            if with_plots:  # what the plots cost, drawn and sent, sets when they are next drawn
                plots_every = max(PLOTS_EVERY_S, (time.perf_counter() - redrawn) * (1 - PLOTS_SHARE) / PLOTS_SHARE)

    def _drawn(self, live: dict, step: int | None, view: LiveView, run_no: int, done: bool, with_plots: bool,
               *panel: str) -> dict:
        """The views of the run going at ``step`` (None: the newest) as updates, the grid tagged
        with the run (``mark_run``); ``panel``: layer, which, kv_view, font_scale, theme."""
        layer, which, kv_view, font_scale, theme = panel
        views = draw(live, step, view.color_by, layer, which, kv_view, view.what_if, with_plots=with_plots,
                     font_scale=font_scale, theme=theme)
        views["grid"] = mark_run(views["grid"], run_no, len(live["steps"]), done)
        return self.shown(views)
