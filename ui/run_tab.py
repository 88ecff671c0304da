"""The Run tab: a prompt, the policies and their knobs, the model box, export and import, and
the views of a run (grid, numbers, figures, cost model), drawn live as the engine streams it."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import gradio as gr

from dllm_local.errors import DllmError
from dllm_local.devices import DEVICES
from dllm_local.experiments.costmodel import TARGET_MODELS, project
from dllm_local.values import Text
from dllm_local.settings import Length, Settings, length_notice
from dllm_local.values import FLAG
from dllm_local.tiny.tasks import verdict
from dllm_local.trace import KV_VIEWS, load_trace_file

from . import grid, lessons, run_figures, tables
from .controls import (
    Specs,
    controls_from_settings,
    knobs,
    policy_choices,
    settings_from_controls,
    settings_line,
    shown_for,
    spec_named,
    toggled_controls,
    visible_knobs,
)
from .engine_queue import CANCELLED, ENGINE, EngineQueue, client_of, error_text, throttled
from .exports import ExportFolder
from .downloads import DownloadBox
from .inputs import (Choice, ColorBy, DeviceName, Fraction, KVView, PageState, Quantization, StepIndex, TargetName,
                     Which, checked)
from .model_access import DownloadNeeded, ModelAccess
from .replay import numbers, prompt_of

TINY_EXAMPLES = [
    "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?",
    "Ben has 9 coins, finds 8 more, then gives away 9. How many now?",
    "Kate is playing cards. Name a poker hand Kate could hold.",
    "Give two numbers whose sum is 9.",
    "Make a record from these facts. Leo lives in Oslo. Leo is 42 years old. Leo works as a pilot.",
]
# Mid-run plot redraws at most this often (and none in a shorter run): redrawing the three plots
# costs a browser about half a second of CPU, taken from the engine on a small machine.
PLOTS_EVERY_S = 1.0
# Past the tiny model's trained 512 (a notice says so), short of its 1,024 positions.
SLIDER_MAX_LENGTH = 768
KV_VIEW_DEFAULTS = {"which": "v", "kv_view": "drift"}
PLOTS = ("confidence", "kv", "cache")


def draw(trace: dict, step: int | None, color_by: str, layer: str, which: str, kv_view: str, what_if: float = 0.0,
         with_plots: bool = True) -> dict[str, Any]:
    """Every view of a trace at one step, by name ("grid", "numbers" and, ``with_plots``, the
    three figures): the only way views are produced."""
    steps = len(trace.get("steps", []))
    at = steps - 1 if step is None else min(int(step), steps - 1)
    upto = at if steps else None
    views = {"grid": grid.token_grid_html(trace, at, color_by=color_by, what_if_threshold=float(what_if) or None),
             "numbers": tables.numbers_html(numbers(trace, upto)),
             "grid_verdicts": lessons.verdicts_html(lessons.grid_verdicts(trace, at) if steps else [])}
    if with_plots:
        views.update(confidence=run_figures.confidence_heatmap(trace, upto),
                     kv=run_figures.kv_heatmap(trace, layer=layer, which=which, upto_step=upto, view=kv_view),
                     cache=run_figures.cache_panel(trace, upto),
                     kv_verdicts=lessons.verdicts_html([lessons.kv_reuse_verdict(trace, at, layer, which)] if steps else []),
                     cache_verdicts=lessons.verdicts_html([lessons.cache_saves_verdict(trace, at)] if steps else []))
    return views


def layer_choices(layers: int) -> dict:
    """The KV panel's layer menu: the mean over layers, then each layer; it opens on a middle
    layer, since layer 0's K/V depend on the token alone and never drift."""
    choices = [("all layers (mean)", run_figures.MEAN_LAYERS)] + [(f"layer {i}", str(i)) for i in range(max(1, layers))]
    return {"choices": choices, "value": str(max(1, layers) // 2)}


def knob_widget(param: dict, value: Any, visible: bool, elem_id: str) -> gr.Component:
    """The component for one policy parameter (a ``Param.to_dict()``): a dropdown for choices, a
    checkbox for a flag, a slider where the spec gives the page a range, else a number box. An
    optional parameter gets a text box that may be left empty (None): a number box without a value
    would be a required argument of the page's API, so ``/run`` could not be called with a prompt alone."""
    common = {"label": param["label"], "info": param["help"], "visible": visible, "elem_id": elem_id}
    if param["choices"]:
        return gr.Dropdown(param["choices"], value=value, **common)
    if param["type"] == "bool":
        return gr.Checkbox(value, **common)
    if param["type"] == "str" or param["optional"]:
        return gr.Textbox("" if value is None else value, placeholder="empty: None" if param["optional"] else None,
                          **common)
    if param["slider"]:
        low, high, step = param["slider"]
        return gr.Slider(low, high, value, step=step, **common)
    return gr.Number(value, precision=0 if param["type"] == "int" else None, **common)


def policy_knobs(specs: Specs, kind: str, values: dict, shown: dict[str, bool]) -> dict[str, gr.Component]:
    """One component per knob of ``kind`` (see ``controls.knobs``), by control name, set to
    ``values`` and visible where ``shown`` says. Call it inside a Blocks."""
    names = [param["name"] for param in knobs(specs).values()]
    # An element id is the parameter's name, prefixed by its kind where both kinds have that name.
    ids = {key: (key if names.count(param["name"]) > 1 else param["name"]).replace(".", "-").replace("_", "-")
           for key, param in knobs(specs, kind).items()}
    return {key: knob_widget(param, values[key], shown[key], ids[key]) for key, param in knobs(specs, kind).items()}


@checked
def show_cost(trace: PageState, model: TargetName, device: DeviceName) -> str:
    """This run's G and τ projected onto a real model on a GPU (see costmodel.project)."""
    stats = (trace or {}).get("stats") or {}
    if not stats.get("nfe"):
        return "Run something to project its G and τ onto a real model."
    rows = project(stats, len(trace["prompt_ids"]), int(trace["gen_length"]), TARGET_MODELS[model], DEVICES[device])
    return tables.cost_table_html(rows, model, DEVICES[device].name, trace)


def model_line(info: dict) -> str:
    return (f"**Model:** {info['name']} · {info['family']} · {info['parameters'] / 1e6:.1f}M parameters · "
            f"{info['device']} · {info['dtype']} · quantization {info['quantization']} · {info['memory_mb']} MB")


def mark_run(grid_html: str, run_no: int, steps: int, done: bool) -> str:
    """The live grid tagged with its run number, steps drawn and whether the run ended, so a
    browser (tests, ``bench/ui_latency.py``) can tell a new run's state from the previous one's."""
    return f'<div class="dl-run" data-run="{run_no}" data-steps="{steps}" data-done="{int(done)}">{grid_html}</div>'


def step_slider(steps: int, finished: bool, **value: int) -> dict:
    """The step slider of a trace with ``steps`` steps: 0 to the last step. A finished trace of
    one step has nothing to scrub (and a slider cannot run from 0 to 0): it is hidden. A run's
    first step leaves the range as it is until a second step gives it one."""
    if steps > 1:
        return gr.update(maximum=steps - 1, visible=True, **value)
    return gr.update(visible=False, value=0) if finished else gr.update(**({"value": 0} if value else {}))


def off_task_line(prompt: str | None, model_name: str | None) -> str:
    notice = grid.off_task_notice(prompt, model_name)
    return f"⚠ {notice}" if notice else ""


def run_status(trace: dict, notice: str, first_paint: float | None, done: bool, behind: int = 0,
               redraw_s: float = 0.0, frozen_at: int | None = None) -> str:
    """The status line of a run: the off-task word, notices, then its progress or how it ended.
    While it runs: ``behind``, how many steps the engine gets ahead of the view before its next
    redraw, ``redraw_s`` apart (said when over 2), and ``frozen_at``, the step the view holds
    while Follow live is off."""
    n = len(trace.get("steps", []))
    parts = [off_task_line(prompt_of(trace), (trace.get("model") or {}).get("name")), notice]
    parts = [part for part in parts if part]
    if done:
        st = trace.get("stats", {})
        answer = trace.get("text", "")
        # A step is one record of the trace; a policy that verifies runs more than one forward in it.
        forwards = st.get("nfe", sum(int(s.get("forwards") or 0) for s in trace.get("steps", [])))
        work = _count(n, "step") + ("" if forwards == n else f", {_count(forwards, 'forward')}")
        parts.append(("Stopped" if st.get("stopped") else "Done") + f": {work} ({settings_line(trace['settings'])})."
                     f" **Answer:** {answer}{_verdict_text(trace, answer)}")
    else:
        parts.append(f"Running… {_count(n, 'step')} so far.")
        if frozen_at is not None:
            parts.append(f"The view holds step {frozen_at} (Follow live is off: tick it to catch up).")
        elif behind > 2:
            parts.append(f"The view trails the engine by up to {_count(behind, 'step')}: it is redrawn every "
                         f"{redraw_s:.1f} s, as often as the page can without slowing the run.")
    if first_paint is not None:
        parts.append(f"(first step painted {first_paint * 1e3:.0f} ms after the click)")
    return " ".join(parts)


def _verdict_text(trace: dict, answer: str) -> str:
    """" — ✓ valid" and the like, when the prompt is one of the tiny task suite's."""
    judged = verdict(prompt_of(trace) or "", answer)
    if judged is None:
        return ""
    mark = "✓" if judged in ("right", "valid") else "✗"
    return f" — {mark} **{judged}**"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _fit_slider(name: str, value: Any) -> Any:
    """A control value from an imported trace; a length past the slider's range widens it."""
    if name in ("gen_length", "steps") and isinstance(value, int) and value > SLIDER_MAX_LENGTH:
        return gr.update(value=value, maximum=value)
    return value


@dataclass
class LiveView:
    """What one client's view of its run going shows: whether it follows the run live (the Follow
    live box, read at every step) and the step and grid options it was last drawn with."""
    follow: bool
    step: int | None = None
    color_by: str = "step"
    what_if: float = 0.0


class RunTab:
    """The Run tab's components (laid out on creation, inside a ``gr.Tab``) and its callbacks.
    ``controls``: the controls a run reads, by control name; they reach a callback by name too
    (Gradio's ``inputs_kwargs``), and a callback sets them by component."""

    def __init__(self, engine: EngineQueue, presets: dict, default_preset: str | None, specs: Specs,
                 models: ModelAccess, exports: ExportFolder, model_line_box: gr.Markdown) -> None:
        self.engine, self.session, self.presets, self.specs = engine, engine.session, presets, specs
        self.models, self.exports, self.model_line = models, exports, model_line_box
        self.run_numbers = itertools.count(1)  # tags the live grid so a browser can tell runs apart
        self.live: dict[str, LiveView] = {}  # by client (engine_queue.client_of): the runs going
        self.trace = gr.State({})
        preset = presets[default_preset] if default_preset else {}
        start = controls_from_settings(preset.get("settings", {}), specs)
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                self._inputs(preset)
                self.controls = self._controls(start)
                self._model_and_files()
            with gr.Column(scale=5):
                self._views()

    # ---------------------------------------------------------------- layout
    def _inputs(self, preset: dict) -> None:
        self.preset = gr.Dropdown(list(self.presets), value=preset.get("name"), label="Preset", elem_id="preset")
        self.preset_info = gr.Markdown(preset.get("description", ""), elem_id="preset-info")
        self.prompt = gr.Textbox(preset.get("prompt", TINY_EXAMPLES[0]), label="Prompt", lines=3, elem_id="prompt")
        gr.Examples([[e] for e in TINY_EXAMPLES], inputs=[self.prompt], label="Examples for the tiny model")
        with gr.Row():
            self.run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
        self.stop_note = gr.Markdown("", elem_id="stop-note")
        self.status = gr.Markdown("", elem_id="status")

    def _controls(self, start: dict) -> dict[str, gr.Component]:
        """The run's controls, by control name: each policy with its description and knobs (from the
        specs), then the rest."""
        shown = visible_knobs(start["cache"], start["unmask"], self.specs)
        self.policy_info = {}
        controls: dict[str, gr.Component] = {}
        for kind, label in (("cache", "Cache policy"), ("unmask", "Unmasking policy")):
            with gr.Group():  # one box per policy: its choice, what it does, its knobs
                controls[kind] = gr.Dropdown(policy_choices(self.specs, kind), value=start[kind], label=label,
                                             elem_id=kind)
                self.policy_info[kind] = gr.Markdown(spec_named(self.specs, kind, start[kind])["description"],
                                                     elem_id=f"{kind}-info", elem_classes="policy-info")
                controls.update(policy_knobs(self.specs, kind, start, shown))
        controls["block_size"] = gr.Slider(4, 128, start["block_size"], step=4, label="Block size", elem_id="block-size")
        controls["gen_length"] = gr.Slider(16, SLIDER_MAX_LENGTH, start["gen_length"], step=16,
                                           label="Generation length", elem_id="gen-length")
        self.length_notice_box = gr.Markdown("", elem_id="length-notice")
        controls["steps"] = gr.Slider(1, SLIDER_MAX_LENGTH, start["steps"], step=1, label="Steps (fixed schedule)",
                                      elem_id="steps", visible=shown["steps"])
        with gr.Row():
            controls["temperature"] = gr.Slider(0.0, 2.0, start["temperature"], step=0.1, label="Temperature")
            controls["seed"] = gr.Number(start["seed"], label="Seed", precision=0)
        controls["exact_drift"] = gr.Checkbox(
            start["exact_drift"], label="Exact-drift diagnostic (a full forward each step, cost reported apart)")
        return controls

    def _model_and_files(self) -> None:
        options = self.session.quantization_options()
        quant_ok = {name: ok for name, ok, _ in options}
        quant_reason = next((r for name, _, r in options if name != "none" and r), "")
        with gr.Accordion("Model", open=False):
            self.model_pick = gr.Dropdown([n for n, _, _ in self.session.model_options()],
                                          value=self.session.info()["name"], label="Model", allow_custom_value=True)
            self.quant = gr.Radio(["none", "8bit", "4bit"], value="none", label="Quantization",
                                  info=quant_reason and f"8-bit and 4-bit: {quant_reason}",
                                  interactive=quant_ok.get("4bit", False))
            self.load_btn = gr.Button("Load model")
            self.downloads = DownloadBox(self.models, self.status)
        with gr.Row():
            self.export_btn = gr.DownloadButton("Export trace (JSON)", elem_id="export-btn")
            self.import_file = gr.UploadButton("Import trace", file_types=[".json"], elem_id="import-btn")

    def _views(self) -> None:
        with gr.Row():
            self.scrub = gr.Slider(0, 1, 0, step=1, label="Step", elem_id="scrubber")
            self.follow = gr.Checkbox(True, label="Follow live", scale=0, elem_id="follow")
            self.color_by = gr.Radio(["step", "confidence"], value="step", label="Colour tokens by", scale=0)
        self.grid = gr.HTML(elem_id="token-grid")
        self.grid_verdicts = gr.HTML(elem_id="grid-verdicts")
        gr.Markdown(grid.CAPTION, elem_classes="caption")
        self.what_if = gr.Slider(0, 1, 0, step=0.05, elem_id="what-if",
                                 label="What-if threshold τ′ (0 = off): the positions τ′ would commit at this step, "
                                       "replayed from the stored confidences without running the model")
        self.nums = gr.HTML(elem_id="numbers")
        with gr.Accordion("Cost model: this run projected onto a real model on a GPU", open=False):
            with gr.Row():
                self.cost_target = gr.Dropdown(list(TARGET_MODELS), value="LLaDA-8B-Instruct", label="Real model")
                self.cost_device = gr.Dropdown(list(DEVICES), value="H100", label="GPU")
            self.cost_html = gr.HTML(elem_id="cost-model")
        # Each plot starts with its empty figure: the browser loads the plotting
        # library with the page, not on the first run's first step.
        self.conf_plot = gr.Plot(run_figures.confidence_heatmap({}), label="Confidence", elem_id="conf-plot")
        gr.Markdown(run_figures.CAPTIONS["confidence"], elem_classes="caption")
        with gr.Row():
            self.layer = gr.Dropdown(**layer_choices(self.session.info().get("layers", 1)), label="Layer",
                                     elem_id="kv-layer")
            self.which = gr.Radio(["k", "v"], value=KV_VIEW_DEFAULTS["which"], label="K or V")
            self.kv_view = gr.Radio(list(KV_VIEWS), value=KV_VIEW_DEFAULTS["kv_view"], label="KV view")
        self.kv_plot = gr.Plot(run_figures.kv_heatmap({}, which="v"), label="KV cosine similarity", elem_id="kv-plot")
        self.kv_verdicts = gr.HTML(elem_id="kv-verdicts")
        gr.Markdown(run_figures.CAPTIONS["kv"], elem_classes="caption")
        self.cache_plot = gr.Plot(run_figures.cache_panel({}), label="Cache", elem_id="cache-plot")
        self.cache_verdicts = gr.HTML(elem_id="cache-verdicts")
        gr.Markdown(run_figures.CAPTIONS["cache"], elem_classes="caption")
        self.view_inputs = [self.color_by, self.layer, self.which, self.kv_view, self.what_if]
        self.view_boxes = {"grid": self.grid, "numbers": self.nums, "confidence": self.conf_plot, "kv": self.kv_plot,
                           "cache": self.cache_plot, "grid_verdicts": self.grid_verdicts, "kv_verdicts": self.kv_verdicts,
                           "cache_verdicts": self.cache_verdicts}

    # ---------------------------------------------------------------- events
    def wire(self) -> None:
        controls = list(self.controls.values())
        for kind, info in self.policy_info.items():  # each policy its own controls: no race between the two
            toggled = [self.controls[name] for name in toggled_controls(self.specs, kind)]
            self.controls[kind].change(partial(self.show_policy, kind), [self.controls[kind]], [info, *toggled],
                                       queue=False)
        self.preset.change(self.apply_preset, [self.preset],
                           [self.preset_info, self.prompt, *controls, self.layer, self.which, self.kv_view], queue=False)
        self.controls["gen_length"].change(self.length_notice, [self.controls["gen_length"]],
                                           [self.length_notice_box], queue=False)
        self._wire_run()
        self.engine.wire_stop(self.stop_btn, self.stop_note, self.run_events, api_name="stop")
        views = [self.trace, self.scrub, *self.view_inputs]
        outputs = list(self.view_boxes.values())
        self.scrub.input(self.redraw, views, outputs, queue=False)
        # Read by the run at every step: unticked, the view holds still; ticked, it catches up at once.
        self.follow.change(self.set_follow, [self.follow, self.trace, *self.view_inputs], [*outputs, self.scrub],
                           queue=False)
        self.prompt.change(self.prompt_notice, [self.prompt, self.status], [self.status], queue=False)
        for view in (v for v in self.view_inputs if v is not self.what_if):
            view.change(self.redraw, views, outputs, queue=False)
        # The what-if threshold changes the grid only: no plot redraw, no model run.
        self.what_if.change(self.redraw_grid, [self.trace, self.scrub, self.color_by, self.what_if], [self.grid],
                            queue=False)
        # Checked in full (size, schema, lengths) before anything is drawn: a bad file is one message.
        self.import_file.upload(self.import_trace, [self.import_file, *self.view_inputs],
                                [self.trace, *outputs, self.scrub, self.status, self.export_btn, self.prompt, *controls,
                                 self.preset],
                                api_name="import_trace", concurrency_limit=2, concurrency_id="import")
        loaded = [self.model_line, self.status, self.layer, self.downloads.note, self.downloads.button,
                  self.downloads.box]
        self.load_btn.click(self.load_model, [self.model_pick, self.quant], loaded, api_name="load_model", **ENGINE)
        self.downloads.wire(self.model_pick, self.load_downloaded, [self.model_pick, self.quant], loaded)
        for box in (self.cost_target, self.cost_device):  # arithmetic on the trace: no model, no queue
            box.change(show_cost, [self.trace, self.cost_target, self.cost_device], [self.cost_html], queue=False)

    def _wire_run(self) -> None:
        """Run (button or Enter in the prompt), then the export file and the cost model once it ends."""
        inputs = [self.prompt, self.trace, self.follow, *self.view_inputs]
        outputs = [self.trace, *self.view_boxes.values(), self.scrub, self.status, self.controls["gen_length"]]
        # Gradio's queue position and timer on the status line only: overlays on the grid and the
        # plots would cover the live views and cost the browser CPU at every redraw.
        options = {"inputs_kwargs": self.controls, "show_progress": "minimal", "show_progress_on": [self.status],
                   **ENGINE}
        run_event = self.run_btn.click(self.run, inputs, outputs, api_name="run", **options)
        submit_event = self.prompt.submit(self.run, inputs, outputs, api_visibility="private", **options)
        self.run_events = [run_event, submit_event]
        for event in self.run_events:
            event.then(self.export_ready, [self.trace], [self.export_btn], api_visibility="private").then(
                show_cost, [self.trace, self.cost_target, self.cost_device], [self.cost_html],
                api_visibility="private", queue=False)

    # ---------------------------------------------------------------- callbacks
    def shown(self, views: dict[str, Any]) -> dict:
        """Views by name (``draw``) as updates of their components."""
        return {self.view_boxes[name]: value for name, value in views.items()}

    def control_values(self, settings: dict) -> dict:
        """The controls set to ``settings`` (a preset's, a trace's), by component."""
        values = controls_from_settings(settings, self.specs)
        return {box: values[name] for name, box in self.controls.items()}

    @checked
    def show_policy(self, kind: Literal["cache", "unmask"], name: Choice) -> dict:
        """What the policy ``name`` of ``kind`` does, and only its controls."""
        shown = shown_for(self.specs, kind, name)
        return {self.policy_info[kind]: spec_named(self.specs, kind, name)["description"],
                **{self.controls[control]: gr.update(visible=v) for control, v in shown.items()}}

    @checked
    def length_notice(self, gen_length: Length) -> str:
        notice = length_notice(gen_length, self.session.info().get("trained_length"))
        return f"⚠ {notice}" if notice else ""

    def preset_matching(self, settings: dict, prompt: str | None = None) -> str | None:
        """The preset whose controls (and prompt, where ``prompt`` is given and the preset has
        one) equal ``settings``: what the preset box may name once they are loaded; else None."""
        def chosen(s: dict) -> dict:
            return settings_from_controls(controls_from_settings(s, self.specs), self.specs)[0]

        loaded = chosen(settings)
        return next((name for name, p in self.presets.items() if chosen(p["settings"]) == loaded
                     and (prompt is None or p.get("prompt", prompt) == prompt)), None)

    def settings_loaded(self, settings: dict) -> dict:
        """The controls set to ``settings`` from elsewhere (a Tune row), and the preset box naming
        the preset they equal, or none: a name the controls no longer match would be stale."""
        return {**self.control_values(settings), self.preset: self.preset_matching(settings)}

    @checked
    def prompt_notice(self, prompt: Text, status: Text) -> str | dict:
        """The off-task word for a prompt being typed or chosen, before it runs; cleared once the
        prompt is one of the tiny model's tasks again."""
        line = off_task_line(prompt, self.session.info().get("name"))
        if line:
            return line
        return "" if status == f"⚠ {grid.OFF_TASK}" else gr.update()

    @checked
    def apply_preset(self, name: Choice | None) -> dict:
        """The preset's description, prompt and controls, and the KV view it opens on (its "view":
        layer, which, kv_view; the defaults where it names none). No preset (the box cleared after
        an import): no description, the controls as they are."""
        if name not in self.presets:
            return {self.preset_info: ""}
        p = self.presets[name]
        layers = layer_choices(self.session.info().get("layers", 1))
        view = {"layer": layers["value"], **KV_VIEW_DEFAULTS, **p.get("view", {})}
        if view["layer"] not in [value for _, value in layers["choices"]]:  # a smaller model than the preset's
            view["layer"] = layers["value"]
        return {self.preset_info: p["description"], **({self.prompt: p["prompt"]} if "prompt" in p else {}),
                **self.control_values(p["settings"]), self.layer: view["layer"], self.which: view["which"],
                self.kv_view: view["kv_view"]}

    def viewed(self, request: gr.Request, step: int, color_by: str, what_if: float) -> None:
        """Note what this client's view shows, for its run going (drawn as it ends while the view is held)."""
        view = self.live.get(client_of(request))
        if view is not None:
            view.step, view.color_by, view.what_if = int(step), color_by, what_if

    @checked
    def redraw(self, request: gr.Request, trace: PageState, step: StepIndex, color_by: ColorBy, layer: Choice,
               which: Which, kv_view: KVView, what_if: Fraction = 0.0) -> dict:
        if not trace or not trace.get("steps"):
            return {box: gr.skip() for box in self.view_boxes.values()}  # Gradio reads {} as one value
        self.viewed(request, step, color_by, what_if)
        return self.shown(draw(trace, step, color_by, layer, which, kv_view, what_if))

    @checked
    def redraw_grid(self, request: gr.Request, trace: PageState, step: StepIndex, color_by: ColorBy,
                    what_if: Fraction) -> dict:
        if not trace or not trace.get("steps"):
            return {self.grid: gr.skip()}
        self.viewed(request, step, color_by, what_if)
        at = min(int(step), len(trace["steps"]) - 1)
        return {self.grid: grid.token_grid_html(trace, at, color_by=color_by, what_if_threshold=float(what_if) or None)}

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

    def export_ready(self, trace: dict):
        # After the final state is drawn: writing a long trace is not what the user waits to see.
        return self.exports.write(trace) if trace.get("steps") else gr.update()

    @checked
    def import_trace(self, file: Any, color_by: ColorBy, layer: Choice, which: Which, kv_view: KVView,
                     what_if: Fraction) -> dict:
        """A trace file, checked in full before anything is drawn; its prompt and settings go into
        the Run tab's controls. A bad file is one message in the status line."""
        try:
            if file is None:
                raise DllmError("no file was given; choose a trace exported by dllm-local")
            trace = load_trace_file(file if isinstance(file, str) else file.name).to_dict()
        except DllmError as exc:
            return {self.status: f"⚠ could not import that file: {exc}"}
        n = len(trace["steps"])
        prompt = prompt_of(trace)
        try:
            values = controls_from_settings(trace["settings"], self.specs)
            controls = {box: _fit_slider(name, values[name]) for name, box in self.controls.items()}
            preset = self.preset_matching(trace["settings"], prompt)
        except (ValueError, TypeError, KeyError):
            controls, preset = {}, None  # a trace of policies this build lacks
        status = " ".join(filter(None, [
            off_task_line(prompt, (trace.get("model") or {}).get("name")),
            f"Replaying an imported trace: {_count(n, 'step')}, {trace['settings'].get('cache')} + "
            f"{trace['settings'].get('unmask')}." + (" Move the step slider." if n > 1 else "")]))
        return {self.trace: trace, **self.shown(draw(trace, None, color_by, layer, which, kv_view, what_if)),
                self.scrub: step_slider(n, True, value=max(0, n - 1)), self.status: status,
                self.export_btn: self.exports.write(trace), **({} if prompt is None else {self.prompt: prompt}),
                **controls, self.preset: preset}

    @checked
    def run(self, request: gr.Request, prompt: Text, trace: PageState, following: FLAG, color_by: ColorBy,
            layer: Choice, which: Which, kv_view: KVView, what_if: Fraction, **controls: Any) -> Iterator[dict]:
        client = client_of(request)
        if self.engine.take_cancel(client):
            yield {self.status: CANCELLED}
            return
        try:
            chosen, notice = settings_from_controls(controls, self.specs)
            settings = Settings.from_dict(chosen)  # the one check of every knob
        except (ValueError, TypeError) as exc:
            yield {self.status: f"⚠ {exc}"}
            return
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
                        update[self.grid] = mark_run(grid.token_grid_html(
                            live, held, color_by=view.color_by, what_if_threshold=float(view.what_if) or None),
                            run_no, n, done)
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

    @checked
    def load_model(self, request: gr.Request, name: Choice, quantization: Quantization, progress=gr.Progress()) -> dict:
        client = client_of(request)
        if self.engine.take_cancel(client):  # Stop pressed while it waited: it ends unrun, as Stop said
            return {self.status: CANCELLED}
        try:
            target = self.models.check(name)  # only the models the page was started to allow
            progress((0, None), desc=f"loading {name}", unit="s")
            # The model loads in the engine process; the page shows the seconds it has taken.
            info = self.session.switch_model(target, quantization, run_id=client,
                                             on_wait=lambda s: progress((int(s), None), desc=f"loading {name}", unit="s"))
        except DownloadNeeded as need:  # nothing is fetched before its user has seen the size and agreed
            return self.downloads.offer(need)
        except Exception as exc:  # noqa: BLE001
            return {self.status: f"⚠ {error_text(exc)}"}
        return {self.model_line: model_line(info), self.status: f"Loaded {info['name']}.",
                self.layer: gr.update(**layer_choices(info["layers"])), self.downloads.box: gr.update(visible=False)}

    @checked
    def load_downloaded(self, request: gr.Request, name: Choice, quantization: Quantization,
                        progress=gr.Progress()) -> dict:
        """After a download: the model loads if it is complete on disk; after a cancel or a failure
        the download's own message stays."""
        try:
            self.models.check(name)
        except Exception:  # noqa: BLE001 - still not on disk: the download said why
            return {}
        return self.load_model(request, name, quantization, progress)
