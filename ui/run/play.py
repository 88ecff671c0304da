"""Play: the step bar's animation, paced by the browser one step at a time, and the speeds offered
as those this machine was measured to draw.

One step is one request that returns the step and all its views together; the browser asks for
the next only once the last is drawn, so requests never pile up behind a slow redraw (the timer
that ticked regardless delivered 1.09 steps/s at 10 on a 2-core machine), and the playing state
lives in one place, the browser: Pause stops at once and Play always starts again. Each step's
time, request to paint, is measured; the Speed menu offers the speeds whose period that time fits
in, so the speed chosen is the speed delivered."""
from __future__ import annotations

import gradio as gr

from ..parts.inputs import number_box

SPEEDS = {"1 step/s": 1.0, "2 steps/s": 2.0, "5 steps/s": 5.0, "10 steps/s": 10.0}
# Offered before Play has measured anything: the slowest speed alone (a 2-core machine draws 1.6
# steps/s in presenter view, bench/play_rate.py); Play's first steps measure what this one draws.
UNMEASURED = 1.0
PLAY, PAUSE = "Play ▶", "Pause ▮▮"
# Headroom over the measured step time (its 80th percentile): a step a little slower than most
# still fits in the period, so the rate delivered stays at the one chosen.
HEADROOM = 1.15

# Run on page load: ``window.dlPlay``, the one holder of the playing state. ``toggle`` (the Play
# button, or space) returns the button's label; ``drawn`` runs after each step's request has
# landed and returns the label and the fastest speed to offer. A step's time runs from the
# request to the paint after its views landed (a timeout after the next animation frame).
PLAY_JS = """
  const speeds = %s, headroom = %s, labels = {play: %r, pause: %r};
  window.dlPlay = {
    playing: false, pending: false, sentAt: 0, timer: null, times: [], fastest: %s, 
    period() { const box = document.querySelector("#speed input");
      return 1000 / (parseFloat(box && box.value) || 1); },
    last() { const range = document.querySelector("#scrubber input[type=range]"); return range ? Number(range.max) : 0; },
    label() { return this.playing ? labels.pause : labels.play; },
    rate() {  // steps/s this page draws: one over the 80th percentile of the last steps' times
      if (this.times.length < 3) return null;
      const sorted = [...this.times].sort((a, b) => a - b);
      return 1000 / sorted[Math.min(sorted.length - 1, Math.floor(0.8 * sorted.length))]; },
    send(restart) {
      const button = document.querySelector(restart ? "#play-restart" : "#play-tick");
      // A request lost for good (no answer in 15 s) does not hold Play forever.
      if (!this.playing || !button || (this.pending && performance.now() - this.sentAt < 15000)) return;
      this.pending = true; this.sentAt = performance.now();
      button.click(); },
    toggle() {
      clearTimeout(this.timer);
      if (this.playing || this.last() < 1) { this.playing = false; return this.label(); }
      this.playing = true;
      this.send(true);
      return this.label(); },
    drawn(step) {
      const sent = this.sentAt;
      if (Number(step) >= this.last()) this.playing = false;  // the last step: Play ends there
      requestAnimationFrame(() => setTimeout(() => {
        const now = performance.now();
        this.pending = false;
        this.times = [...this.times.slice(-7), now - sent];
        const rate = this.rate();
        if (rate !== null) this.fastest = Math.max(speeds[0], ...speeds.filter((s) => s * headroom <= rate));
        // The next step is due a period after this one was asked for (now, if drawing took longer).
        if (this.playing) this.timer = setTimeout(() => this.send(false), Math.max(0, sent + this.period() - now));
      }, 0));
      return [this.label(), this.fastest]; },
  };
""" % (sorted(SPEEDS.values()), HEADROOM, PLAY, PAUSE, UNMEASURED)
TOGGLE_JS = "() => window.dlPlay.toggle()"
DRAWN_JS = "(step) => window.dlPlay.drawn(step)"


def offered_speeds(fastest: float) -> list[str]:
    """The Speed menu's choices: the speeds up to ``fastest`` (the slowest one always)."""
    return [label for label, rate in SPEEDS.items() if rate <= fastest or rate == min(SPEEDS.values())]


def next_step(step: int, steps: int, restart: bool) -> int:
    """The step a Play tick shows after ``step`` of ``steps``; ``restart`` (Play pressed): from the
    first when the last is shown."""
    last = max(0, steps - 1)
    return 0 if restart and step >= last else min(last, step + 1)


class Play:
    """The step bar's Play button, its Speed menu and the requests of its steps. Mixed into
    ``RunTab`` through ``Presenter``; reads its ``scrub``, ``redraw``, ``show_position`` and
    ``show_branch``."""

    def _play_controls(self) -> None:
        self.play_btn = gr.Button(PLAY, size="sm", scale=0, min_width=86, elem_id="step-play")

    def _speed_menu(self) -> None:
        self.speed = gr.Dropdown(offered_speeds(UNMEASURED), value="1 step/s", label="Speed", scale=0, min_width=140,
                                 elem_id="speed")

    def _play_requests(self) -> None:
        # Clicked by the browser's Play loop (in the page, never seen): one step, with and without a restart.
        self.play_ticks = {restart: gr.Button(visible="hidden", elem_id="play-restart" if restart else "play-tick")
                           for restart in (True, False)}
        self.play_fastest = number_box(UNMEASURED, visible="hidden", elem_id="play-fastest")

    def play_restart(self, request: gr.Request, *inputs) -> dict:
        """Play pressed: the first step of the play (the first of the run, when the last is shown)."""
        return self._play_step(request, True, *inputs)

    def play_tick(self, request: gr.Request, *inputs) -> dict:
        """One step on, with every view of it."""
        return self._play_step(request, False, *inputs)

    def _play_step(self, request: gr.Request, restart: bool, trace: dict, step: int, *views_position_branch) -> dict:
        *views, position, branch = views_position_branch
        steps = len((trace or {}).get("steps") or [])
        if steps < 2:
            return {self.scrub: gr.skip()}
        at = next_step(int(step or 0), steps, restart)
        shown = self.redraw(request, trace, at, *views)
        panel, token = self.show_position(trace, at, position)
        branch_grid, branch_verdicts = self.show_branch(branch, at, views[0])
        return {self.scrub: at, **shown, self.position_panel: panel, self.branch_token: token,
                self.branch_grid: branch_grid, self.branch_verdicts: branch_verdicts}

    def offer_speeds(self, fastest: float | None, speed: str) -> dict:
        """The Speed menu offers what the page measured it draws; a speed no longer offered falls to
        the fastest one that is."""
        choices = offered_speeds(float(fastest or UNMEASURED))
        return gr.update(choices=choices, value=speed if speed in choices else choices[-1])

    def _wire_play(self, views: list, outputs: list) -> None:
        self.play_btn.click(None, None, [self.play_btn], js=TOGGLE_JS, queue=False)
        inputs = [*views, self.position, self.branch_trace]
        played = [self.position_panel, self.branch_token, self.branch_grid, self.branch_verdicts]
        for restart, button in self.play_ticks.items():
            button.click(self.play_restart if restart else self.play_tick, inputs, [self.scrub, *outputs, *played],
                         queue=False, api_visibility="private").then(
                None, [self.scrub], [self.play_btn, self.play_fastest], js=DRAWN_JS, queue=False)
        self.play_fastest.change(self.offer_speeds, [self.play_fastest, self.speed], [self.speed], queue=False,
                                 api_visibility="private")
