"""The lecture hall: a presenter view that fits one 1280×720 projector screen, a font scale, a dark
projector theme, Play and keys that move the step, one chosen panel. What the browser alone does
(the page's classes, the keys, a click on a token) is the JS here; what needs the trace (the step
shown, the plots' fonts and colours) goes through the Run tab's callbacks."""
from __future__ import annotations

import gradio as gr

from ..parts.inputs import ColorBy, PageState, StepIndex, checked, number_slider
from .play import Play
from .slides import SLIDES_JS, grid_svg
from .slides_zip import slides_zip

FONT_SCALES = {"1×": 1.0, "1.5×": 1.5, "2×": 2.0}
THEMES = ("light", "dark")
PANELS = {"confidence": "Confidence", "kv": "KV", "cache": "Cache", "token": "Token"}
STEP_MOVES = ("first", "prev", "next", "last")

# Presenter view: the page's header, the run's knobs, captions and the panels not chosen step
# aside; the grid and the chosen panel share the screen side by side. ``--dl-scale`` is the font
# scale: the grid, verdicts and side panel are zoomed by it (their sizes are inline), plots are
# redrawn with larger type. Rules for the plain view say ``body:not(.dl-present)``: Gradio repeats
# each rule under its container's classes, which would outrank the presenter's.
CSS = """
body {--dl-scale: 1}
#token-grid, #grid-verdicts, #branch-grid, #branch-verdicts, #position-panel, #kv-verdicts, #cache-verdicts,
#numbers, #status {zoom: var(--dl-scale)}
body:not(.dl-present) #stage {flex-wrap: wrap}
body:not(.dl-present) #stage > .column {min-width: 100% !important}
body.dl-present #page-head, body.dl-present #model-line, body.dl-present #batch-mode, body.dl-present #preset-problems,
body.dl-present .dl-knobs, body.dl-present .caption, body.dl-present #what-if, body.dl-present #numbers,
body.dl-present #cost-accordion, body.dl-present #examples, body.dl-present #preset-info,
body.dl-present #stop-note, body.dl-present footer {display: none !important}
body.dl-present .gradio-container {padding-top: 4px !important; padding-bottom: 0 !important}
body.dl-present .gradio-container .main .wrap, body.dl-present .gradio-container .main .contain {padding-bottom: 0 !important}
/* One screen: the row below the tabs is the screen's height; each column scrolls in itself, so the
   page never does. The views' column: the step bar, then the stage taking what is left. */
body.dl-present #controls-col, body.dl-present #views-col {height: calc(100vh - 84px); flex-wrap: nowrap !important}
body.dl-present #controls-col {overflow-y: auto; flex: 0 0 300px !important; min-width: 0 !important}
body.dl-present #controls-col > *, body.dl-present #stage > .column > * {flex-shrink: 0}
body.dl-present #step-bar {flex: none; flex-wrap: nowrap; gap: 6px}
body.dl-present #step-bar > button, body.dl-present #scrubber, body.dl-present #prompt {zoom: var(--dl-scale)}
body.dl-present #step-bar > button {min-width: 34px !important; padding: 2px 6px}
body.dl-present #step-bar #step-play {min-width: 64px !important}
body.dl-present #scrubber {min-width: 150px !important}
body.dl-present #scrubber button.reset-button {display: none}
body.dl-present #stage {flex: 1 1 0 !important; min-height: 0; flex-wrap: nowrap}
body.dl-present #stage > .column {min-width: 0 !important; max-height: 100%; overflow-y: auto; flex-wrap: nowrap}
body.dl-present #stage-grid {flex: 1 1 0 !important}
body.dl-present #stage-panels {flex: 1 1 0 !important}
/* The grid and a branch scroll in their boxes: a verdict stays on the screen below them. */
body.dl-present #token-grid, body.dl-present #branch-grid {max-height: calc(45vh / var(--dl-scale));
  overflow-y: auto !important}
/* The status line's box takes the column's height left (none shifts as it grows in a run); a long one scrolls. */
body.dl-present #controls-col > #status {flex: 1 1 0; min-height: 3.2em; overflow-y: auto}
body.dl-present #controls-col .row:has(#run-btn) {flex-wrap: nowrap}
body.dl-present #run-btn, body.dl-present #stop-btn {min-width: 0 !important}
body:not(.dl-present) #panel-choice {display: none !important}
#preset-changed:has(.md:empty) {display: none}
body.dl-present #prompt [data-testid="block-info"] {display: none}
body.dl-present #panel-choice {position: sticky; top: 0; z-index: 5}
/* The panel's own choices without their labels (their values say what they are): its plot on the screen. */
body.dl-present :is(#panel-choice, #kv-layer, #kv-which, #kv-view) [data-testid="block-info"] {display: none}
/* A branch beside the original, each half the grid's column. */
body.dl-present #stage-grid .row:has(> #branch-col) {flex-wrap: nowrap}
body.dl-present #stage-grid .row:has(> #branch-col) > .column {min-width: 0 !important}
#step-bar button {align-self: center}
body.dl-present:not([data-dl-panel="confidence"]) #panel-confidence,
body.dl-present:not([data-dl-panel="kv"]) #panel-kv,
body.dl-present:not([data-dl-panel="cache"]) #panel-cache,
body.dl-present:not([data-dl-panel="token"]) #panel-token {display: none !important}
.dark .dl-verdict {color: #f2f2f2}
.dark .dl-verdict[data-status="holds"] {background: #10321c; border-color: #3fb950}
.dark .dl-verdict[data-status="does not hold"] {background: #3d1214; border-color: #ff6b6b}
.dark .dl-verdict:not([data-status]) {background: #202632}
.dark .caption, .dark .caption p, .dark .policy-info, .dark .policy-info p, .dark .dl-legend {color: #d0d0d0 !important}
.dark #numbers div, .dark #numbers span, .dark #numbers td, .dark #numbers th {background-color: #1b1f27 !important;
  color: #f2f2f2 !important; border-color: #555 !important}
.dark #position-panel, .dark #position-panel * {color: #f2f2f2}
.dark .dl-theorem {filter: brightness(1.8)}
"""

# Run on page load (with the page's other JS): keys anywhere on the page move the step (never
# while typing in a box); a click on a token of the grid picks its position for the side panel.
KEYS_JS = """
  const keys = {ArrowLeft: "step-prev", ArrowRight: "step-next", " ": "step-play", Home: "step-first", End: "step-last"};
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || !(e.key in keys)) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const button = document.querySelector(`#${keys[e.key]}`);
    if (!button) return;
    e.preventDefault();  // space on a focused button (Run, say) plays; it does not press that button
    if (t && t.tagName === "BUTTON") t.blur();
    button.click();
  });
  document.addEventListener("click", (e) => {
    const chip = e.target.closest && e.target.closest("#token-grid [data-pos]");
    const box = document.querySelector("#position input");
    if (!chip || !box) return;
    const token = document.querySelector("#panel-choice input[value='token']");
    if (document.body.classList.contains("dl-present") && token && !token.checked) token.click();
    box.value = chip.dataset.pos;
    box.dispatchEvent(new Event("input", {bubbles: true}));
    box.dispatchEvent(new KeyboardEvent("keypress", {key: "Enter", bubbles: true}));
    box.dispatchEvent(new Event("blur", {bubbles: true}));
  });
"""

# The screen's controls on the page: the body's classes follow them at once, in the browser.
SCREEN_JS = """
(present, scale, theme, panel) => {
  const body = document.body;
  body.classList.toggle("dl-present", !!present);
  body.style.setProperty("--dl-scale", String(parseFloat(scale) || 1));
  body.classList.toggle("dark", theme === "dark");
  body.dataset.dlPanel = panel;
  // A plot drawn while its panel was hidden kept plotly's default width: a resize lays every
  // shown plot out in its box again, once the browser has laid out the change.
  requestAnimationFrame(() => window.dispatchEvent(new Event("resize")));
}
"""
# The slides' zip, once written, downloaded at once: one click gives the file.
DOWNLOAD_JS = """
(file) => {
  if (!file || !file.url) return;
  const a = document.createElement("a");
  a.href = file.url;
  a.download = file.orig_name || "dllm-slides.zip";
  document.body.appendChild(a);
  a.click();
  a.remove();
}
"""
# On load, a page opened with ?__theme=dark keeps the theme Gradio gave it.
THEME_ON_LOAD_JS = "(theme) => document.body.classList.contains('dark') ? 'dark' : theme"


def step_moved(move: str, step: int, steps: int) -> int:
    """The step after a move (``STEP_MOVES``) from ``step`` in a trace of ``steps`` steps."""
    last = max(0, steps - 1)
    return {"first": 0, "prev": max(0, step - 1), "next": min(last, step + 1), "last": last}[move]


class Presenter(Play):
    """The Run tab's screen controls and step bar. Mixed into ``RunTab``, whose ``scrub``,
    ``redraw`` and views it reads."""

    def _screen_bar(self, present: bool) -> None:
        with gr.Group(elem_id="screen-bar"):
            with gr.Row(equal_height=True):
                self.present = gr.Checkbox(present, label="Presenter view", elem_id="present")
                self.slides_btn = gr.Button("Export for slides (PNG + SVG)", size="sm", elem_id="slides-btn")
            with gr.Row():
                self.font_scale = gr.Dropdown(list(FONT_SCALES), value="1×", label="Font scale", min_width=90,
                                              elem_id="font-scale")
                self.theme = gr.Dropdown(list(THEMES), value="light", label="Theme", min_width=90, elem_id="theme")
            self.slides_file = gr.File(label="Slides", visible=False, elem_id="slides-file")
        self.slides_svg, self.slides_images = gr.Textbox(visible=False), gr.Textbox(visible=False)

    def _panel_choice(self) -> None:
        """The presenter view's one panel, chosen above it (the plain view shows them all)."""
        self.panel = gr.Radio([(label, key) for key, label in PANELS.items()], value="confidence", label="Panel",
                              elem_id="panel-choice")
        self.screen = [self.present, self.font_scale, self.theme, self.panel]

    def _step_bar(self) -> None:
        with gr.Row(elem_id="step-bar", equal_height=True):
            self.moves = {}
            for move, label in zip(STEP_MOVES, ("⇤", "◀", "▶", "⇥")):
                if move == "next":
                    self._play_controls()
                self.moves[move] = gr.Button(label, size="sm", scale=0, min_width=40, elem_id=f"step-{move}")
            self._speed_menu()
            self.follow = gr.Checkbox(True, label="Follow live", scale=0, min_width=90, elem_id="follow")
            self.scrub = number_slider(0, 1, 0, step=1, label="Step", scale=1, min_width=200, elem_id="scrubber")
        self._play_requests()

    @checked
    def move_step(self, move: str, trace: PageState, step: StepIndex) -> dict:
        """A step button (or its key): the slider's new value; the views follow from its change."""
        steps = len(trace.get("steps") or []) if trace else 0
        return gr.update(value=step_moved(move, int(step), steps)) if steps else gr.skip()

    @checked
    def slides_grid(self, trace: PageState, step: StepIndex, color_by: ColorBy) -> str:
        """The grid at the step shown, with its verdicts, as the slides' SVG."""
        steps = len((trace or {}).get("steps") or [])
        if not steps:
            raise gr.Error("Run something (or import a trace) first: there is no grid to export.",
                           print_exception=False)
        return grid_svg(trace, min(int(step), steps - 1), color_by)

    def slides(self, images: str, svg: str):
        """The zip of the grid's SVG and the plots' PNGs and SVGs, in the export folder."""
        try:
            return gr.update(value=str(slides_zip(images, svg, self.exports.path)), visible=True)
        except ValueError as exc:
            raise gr.Error(f"could not export the slides: {exc}", print_exception=False) from None

    def _wire_presenter(self, page_load: gr.Blocks, views: list, outputs: list) -> list:
        """Wire the screen's controls, the step bar and the slides' export; the events that move the step."""
        # Queued (never behind a run: no concurrency limit) so that "run something first" reaches the
        # page as a message; an event outside the queue answers an error with a bare HTTP 500.
        self.slides_btn.click(self.slides_grid, [self.trace, self.scrub, self.color_by], [self.slides_svg],
                              concurrency_limit=None, api_visibility="private").success(
            None, [self.slides_svg], [self.slides_images], js=SLIDES_JS, queue=False).then(
            self.slides, [self.slides_images, self.slides_svg], [self.slides_file], queue=False,
            api_visibility="private").then(None, [self.slides_file], None, js=DOWNLOAD_JS, queue=False)
        for box in self.screen:
            box.change(None, self.screen, None, js=SCREEN_JS, queue=False)
        page_load.load(None, [self.theme], [self.theme], js=THEME_ON_LOAD_JS, queue=False).then(
            None, self.screen, None, js=SCREEN_JS, queue=False)
        moved = [button.click(lambda trace, step, move=move: self.move_step(move, trace, step), [self.trace, self.scrub],
                              [self.scrub], queue=False, api_visibility="private").then(
                     self.redraw, views, outputs, queue=False, api_visibility="private")
                 for move, button in self.moves.items()]
        self._wire_play(views, outputs)
        return moved
