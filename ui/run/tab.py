"""The Run tab: its layout (a prompt, the run's controls, the model box, export and import, the
views of a run) and its wiring. Its callbacks come one job a module: ``live_run`` (a run drawn
as it streams), ``run_views`` (replay), ``trace_files``, ``model_box``, ``run_settings``."""
from __future__ import annotations

import itertools
from functools import partial

import gradio as gr

from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import TARGET_MODELS
from dllm_local.trace import KV_VIEWS

from ..grid import tokens as grid
from .. import figures as run_figures
from .branching import Branching
from ..canvas.controls import cost_target
from .widgets import run_controls
from .controls import Specs, controls_from_settings, preset_label, toggled_controls
from ..engine.queue import RUNS, EngineQueue
from ..parts.exports import ExportFolder
from ..parts.presets import presets_for
from .live import LiveRun, LiveView
from ..model.access import ModelAccess
from ..model.box import ModelBox
from .presenter import Presenter
from .settings import RunSettings
from .views import KV_VIEW_DEFAULTS, RunReplay, draw, layer_choices, show_cost
from .trace_files import TraceFiles
from ..parts.inputs import number_slider

__all__ = ["RunTab", "draw", "show_cost"]  # draw: the views' one maker, as callers outside the tab know it

TINY_EXAMPLES = [
    "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?",
    "Ben has 9 coins, finds 8 more, then gives away 9. How many now?",
    "Kate is playing cards. Name a poker hand Kate could hold.",
    "Give two numbers whose sum is 9.",
    "Make a record from these facts. Leo lives in Oslo. Leo is 42 years old. Leo works as a pilot.",
]


class RunTab(LiveRun, RunReplay, TraceFiles, ModelBox, RunSettings, Presenter, Branching):
    """The Run tab's components (laid out on creation, inside a ``gr.Tab``) and its callbacks.
    ``controls``: the controls a run reads, by control name; they reach a callback by name too
    (Gradio's ``inputs_kwargs``), and a callback sets them by component."""

    def __init__(self, engine: EngineQueue, presets: dict, default_preset: str | None, specs: Specs,
                 models: ModelAccess, exports: ExportFolder, model_line_box: gr.Markdown, present: bool = False) -> None:
        self.engine, self.session, self.presets, self.specs = engine, engine.session, presets, specs
        self.models, self.exports, self.model_line = models, exports, model_line_box
        self.run_numbers = itertools.count(1)  # tags the live grid so a browser can tell runs apart
        self.last: dict[str, dict] = {}
        self.live: dict[str, LiveView] = {}  # by client (engine_queue.client_of): the runs going, and the
        # Follow live box of a client whose run has not started yet
        self.trace = gr.State({})
        preset = presets[default_preset] if default_preset else {}
        with gr.Row():
            with gr.Column(scale=2, min_width=300, elem_id="controls-col"):
                self._inputs(preset)
                self._screen_bar(present)
                with gr.Column(elem_classes="dl-knobs"):  # stepped aside in presenter view
                    start = controls_from_settings(preset.get("settings", {}), specs)
                    self.controls, self.policy_info, self.length_notice_box, self.canvas_reason = run_controls(
                        specs, start, self.session.info())
                    self._model_box(start)
                    with gr.Row():
                        self.export_btn = gr.DownloadButton("Export trace (JSON)", elem_id="export-btn")
                        self.import_file = gr.UploadButton("Import trace", file_types=[".json"], elem_id="import-btn")
            with gr.Column(scale=5, elem_id="views-col"):
                self._views()

    # ---------------------------------------------------------------- layout
    def _inputs(self, preset: dict) -> None:
        # Prompt and Run first: on the first screen at 1280x720. One line that grows: Enter runs
        # (Gradio submits a multi-line box on Shift+Enter only).
        self.prompt = gr.Textbox(preset.get("prompt", TINY_EXAMPLES[0]), label="Prompt (Enter runs)", lines=1,
                                 max_lines=4, elem_id="prompt")
        with gr.Row():
            self.run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
        self.stop_note = gr.Markdown("", elem_id="stop-note")
        self.status = gr.Markdown("", elem_id="status")
        # The preset menu stays in presenter view (a lecture moves from one preset to the next); its
        # description and the examples step aside there.
        self.preset = gr.Dropdown(presets_for(self.presets, self.session.info()), value=preset.get("name"),
                                  label=preset_label(self.session.info()),
                                  elem_id="preset")
        # What no longer matches the preset the box names (``preset_changes``): empty while all of it
        # does; beside the menu, in presenter view too.
        self.preset_changed = gr.Markdown("", elem_id="preset-changed")
        with gr.Column(elem_classes="dl-knobs"):
            self.preset_info = gr.Markdown(preset.get("description", ""), elem_id="preset-info")
            # The preset whose reply last set the controls, in the browser beside them: Run reads it
            # with the preset box, and a box ahead of it is a preset whose reply has not landed.
            self.preset_applied = gr.Textbox(preset.get("name", ""), visible=False, elem_id="preset-applied")
            with gr.Column(elem_id="examples"):
                gr.Examples([[e] for e in TINY_EXAMPLES], inputs=[self.prompt], label="Examples for the tiny model")

    def _views(self) -> None:
        self._step_bar()
        with gr.Row(elem_id="stage"):
            with gr.Column(elem_id="stage-grid"):
                with gr.Row():
                    with gr.Column():
                        self.grid = gr.HTML(elem_id="token-grid")
                        self.grid_verdicts = gr.HTML(elem_id="grid-verdicts")
                    self._branch_boxes()
                self.grid_caption = gr.Markdown(grid.CAPTION, elem_classes="caption")  # a masked model's grid
                self.color_by = gr.Radio(["step", "confidence"], value="step", label="Colour tokens by",
                                         elem_classes="dl-knobs")
                self.what_if = number_slider(0, 1, 0, step=0.05, elem_id="what-if",
                                            label="What-if threshold τ′ (0 = off): the positions τ′ would commit at this "
                                                  "step, replayed from the stored confidences without running the model")
                self.nums = gr.HTML(elem_id="numbers")
            with gr.Column(elem_id="stage-panels"):
                self._panels()
        with gr.Accordion("Cost model: this run projected onto a real model on a GPU", open=False,
                          elem_id="cost-accordion"):
            with gr.Row():
                self.cost_target = gr.Dropdown(list(TARGET_MODELS), value=cost_target(self.session.info()),
                                               label="Real model")
                self.cost_device = gr.Dropdown(list(DEVICES), value="H100", label="GPU")
            self.cost_html = gr.HTML(elem_id="cost-model")
        # What a view is drawn with; the screen's font scale and theme last (the plots' type and colours).
        self.view_inputs = [self.color_by, self.layer, self.which, self.kv_view, self.what_if, self.font_scale,
                            self.theme]
        self.view_boxes = {"grid": self.grid, "numbers": self.nums, "confidence": self.conf_plot, "kv": self.kv_plot,
                           "cache": self.cache_plot, "grid_verdicts": self.grid_verdicts, "kv_verdicts": self.kv_verdicts,
                           "cache_verdicts": self.cache_verdicts}

    def _panels(self) -> None:
        """The token's side panel and the three figures, each in a box that presenter view shows alone,
        captioned for the kind of model loaded."""
        captions = run_figures.captions_for(self.session.info())
        self._panel_choice()
        with gr.Column(elem_id="panel-token"):
            self._token_panel()
        # No label tab over a plot: its title, hung from the figure's top, names it.
        # Each plot starts with its empty figure: the browser loads the plotting
        # library with the page, not on the first run's first step.
        with gr.Column(elem_id="panel-confidence"):
            self.conf_plot = gr.Plot(run_figures.confidence_heatmap({}), label="Confidence", show_label=False,
                                     elem_id="conf-plot")
            self.captions = {"confidence": gr.Markdown(captions["confidence"], elem_classes="caption")}
        with gr.Column(elem_id="panel-kv"):
            with gr.Row():
                self.layer = gr.Dropdown(**layer_choices(self.session.info().get("layers", 1)), label="Layer",
                                         elem_id="kv-layer")
                self.which = gr.Radio(["k", "v"], value=KV_VIEW_DEFAULTS["which"], label="K or V", elem_id="kv-which")
                # The identifiers in words, no longer than they are: the presenter view's panel fits as it did.
                self.kv_view = gr.Radio([(view.replace("_", " "), view) for view in KV_VIEWS],
                                        value=KV_VIEW_DEFAULTS["kv_view"], label="KV view", elem_id="kv-view")
            self.kv_plot = gr.Plot(run_figures.kv_heatmap({}, which="v"), label="KV cosine similarity", show_label=False,
                                   elem_id="kv-plot")
            self.kv_verdicts = gr.HTML(elem_id="kv-verdicts")
            self.captions["kv"] = gr.Markdown(captions["kv"], elem_classes="caption")
        with gr.Column(elem_id="panel-cache"):
            self.cache_plot = gr.Plot(run_figures.cache_panel({}), label="Cache", show_label=False, elem_id="cache-plot")
            self.cache_verdicts = gr.HTML(elem_id="cache-verdicts")
            self.captions["cache"] = gr.Markdown(captions["cache"], elem_classes="caption")

    # ---------------------------------------------------------------- events
    def wire(self) -> None:
        controls = list(self.controls.values())
        for kind, info in self.policy_info.items():  # each policy its own controls: no race between the two
            toggled = [self.controls[name] for name in toggled_controls(self.specs, kind)]
            self.controls[kind].change(partial(self.show_policy, kind), [self.controls[kind]], [info, *toggled],
                                       queue=False)
        self.preset.change(self.apply_preset, [self.preset, self.preset_applied],
                           [self.preset_info, self.prompt, *controls, self.layer, self.which, self.kv_view,
                            self.preset_applied], queue=False)
        # On the user's moves (.input): a .change listener reading every control undid a slider move
        # (the length went back to the preset's within 0.5 s). Unprocessed: a model switch changes
        # the cache's choices a moment before its value, and in that moment the dropdown refuses its
        # own value; the last change is always read again.
        gr.on([self.preset.change, *(box.input for box in controls)], self.preset_changes, [self.preset],
              [self.preset_changed], inputs_kwargs=self.controls, queue=False, api_visibility="private",
              preprocess=False, trigger_mode="always_last")
        self.controls["gen_length"].change(self.length_notice, [self.controls["gen_length"]],
                                           [self.length_notice_box], queue=False)
        self._wire_run()
        self.engine.wire_stop(self.stop_btn, self.stop_note, self.run_events, api_name="stop")
        views = [self.trace, self.scrub, *self.view_inputs]
        outputs = list(self.view_boxes.values())
        scrubbed = self.scrub.input(self.redraw, views, outputs, queue=False)
        # Read by the run at every step: unticked, the view holds still; ticked, it catches up at once.
        self.follow.change(self.set_follow, [self.follow, self.trace, *self.view_inputs], [*outputs, self.scrub],
                           queue=False)
        self.prompt.change(self.prompt_notice, [self.prompt, self.status], [self.status], queue=False)
        for view in (v for v in self.view_inputs if v is not self.what_if):
            view.change(self.redraw, views, outputs, queue=False)
        # The what-if threshold changes the grid only: no plot redraw, no model run.
        self.what_if.change(self.redraw_grid, [self.trace, self.scrub, self.color_by, self.what_if], [self.grid],
                            queue=False)
        imported = self.wire_import(outputs, controls)
        self._wire_model_box()
        # The side panel and the branch follow every move of the step (not the slider's every
        # change: a run's own updates of it would send a step past the maximum it has just set).
        self._wire_branching([scrubbed, *self._wire_presenter(self.engine.page, views, outputs)])
        for box in (self.cost_target, self.cost_device):  # arithmetic on the trace: no model, no queue
            box.change(show_cost, [self.trace, self.cost_target, self.cost_device], [self.cost_html], queue=False)
        # An imported trace is costed as a run is (one run on a GPU, say, read on a laptop).
        imported.then(show_cost, [self.trace, self.cost_target, self.cost_device], [self.cost_html],
                      api_visibility="private", queue=False)

    def _wire_run(self) -> None:
        """Run (button or Enter in the prompt), then the export file and the cost model once it ends."""
        inputs = [self.prompt, self.trace, self.follow, *self.view_inputs, self.preset, self.preset_applied]
        outputs = [self.trace, *self.view_boxes.values(), self.scrub, self.status]
        # Gradio's queue position and timer on the status line only: overlays on the grid and the
        # plots would cover the live views and cost the browser CPU at every redraw.
        options = {"inputs_kwargs": self.controls, "show_progress": "minimal", "show_progress_on": [self.status],
                   **RUNS}
        run_event = self.run_btn.click(self.run, inputs, outputs, api_name="run", **options)
        submit_event = self.prompt.submit(self.run, inputs, outputs, api_visibility="private", **options)
        self.run_events = [run_event, submit_event]
        # Export offers nothing while a run goes: the last run's file, clicked for this run's once
        # it has ended, would be the wrong trace (its own is written after its final state is drawn).
        gr.on([self.run_btn.click, self.prompt.submit], lambda: gr.update(value=None), None, [self.export_btn],
              queue=False, api_visibility="private", show_progress="hidden")
        for event in self.run_events:
            event.then(self.export_ready, [self.trace], [self.export_btn], api_visibility="private").then(
                show_cost, [self.trace, self.cost_target, self.cost_device], [self.cost_html],
                api_visibility="private", queue=False)
