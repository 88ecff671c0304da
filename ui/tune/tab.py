"""The Tune tab: a sweep of one numeric knob of the base settings' policies × block size on a task
(accuracy against speed), other reports added to its chart, and the concurrency view."""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from dllm_local.errors import DllmError, SettingsError, shown
from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import CONCURRENCY_MODELS, TEACHING_EXAMPLE, concurrency_crossovers, concurrency_curve
from dllm_local.analysis.reports import add_points
from dllm_local.files import read_json
from dllm_local.limits import SWEEP_BLOCK_SIZES, SWEEP_GEN_LENGTH, SWEEP_THRESHOLDS
from dllm_local.settings import Length
from dllm_local.tiny.tasks import TASKS, check_task
from dllm_local.values import Text

from . import figures as tune_figures
from .aup import aup_figure, aup_line
from ..run.widgets import setting_widget
from ..run.controls import KINDS, Specs, policies_of, sweep_knobs
from ..engine.handler import engine_handler
from ..engine.queue import ENGINE, EngineQueue, client_of, error_text
from ..parts.inputs import Choice, ConcurrencyModel, DeviceName, PageState, checked, number_box
from ..run.tab import RunTab

RESULTS_MAX_BYTES = 4 * 2**20  # an added results report (lm-eval, sweep JSON) is a few kB
_KIND_WORDS = {"cache": "cache", "unmask": "unmasking"}


def parse_numbers(text: str, kind: type, box: str, rule: str) -> list:
    """Comma-separated numbers from a text box, or a SettingsError that names the box. Only the
    form is read here: each value's range is the settings' to check (``rule`` says it in words)."""
    values = []
    for piece in str(text).replace(" ", "").split(","):
        if not piece:
            continue
        try:
            values.append(kind(piece))
        except ValueError:
            raise SettingsError(f"{box}: {shown(piece)} is not a number; give values {rule}, separated by commas "
                                f"(e.g. {'0.5, 0.9' if kind is float else '8, 16, 32'})") from None
    if not values:
        raise SettingsError(f"{box}: no values given; give values {rule}, separated by commas")
    return values


def knob_choices(specs: Specs, settings: dict) -> dict:
    """The knob menu for base ``settings``: every numeric parameter of its two policies (labelled
    with the policy kind), opening on the unmasking policy's first."""
    found = sweep_knobs(specs, settings)
    choices = [(f"{param['label']} ({_KIND_WORDS[key.partition('.')[0]]})", key) for key, param in found.items()]
    value = next((key for key in found if key.startswith("unmask.")), next(iter(found), None))
    info = "" if found else "These policies have no numeric knob: the sweep varies the block size only."
    return {"choices": choices, "value": value, "info": info}


def suggested_values(param: dict) -> str:
    """Four values to try for a knob: across the page's slider range (its low end left out), or
    around its default."""
    if param["slider"]:
        low, high, step = param["slider"]
        picks = [round(round((low + (high - low) * i / 4) / step) * step, 6) for i in range(1, 5)]
    else:
        picks = [(param["default"] or 1) * factor for factor in (0.5, 1, 2, 4)]
    if param["type"] == "int":
        picks = [int(round(v)) for v in picks]
    return listed(dict.fromkeys(picks), ", ")


def listed(values: Iterable[float], sep: str = ",") -> str:
    """Numbers as a text box takes them: "0.5,0.7"."""
    return sep.join(f"{v:g}" for v in values)


def sweep_axes(specs: Specs, base: dict, knob: str | None, values: str, blocks: str) -> dict[str, list]:
    """The sweep's axes: ``knob`` (a control name such as "unmask.threshold") over ``values``, and
    the block sizes. An axis is named by the parameter alone, as the sweep reports it, unless both
    policies have a parameter of that name."""
    axes: dict[str, list] = {}
    if knob:
        found = sweep_knobs(specs, base)
        if knob not in found:
            raise SettingsError(f"Knob: {knob!r} is not a numeric parameter of {' + '.join(policies_of(base))}; "
                                f"pick one of {', '.join(found) or 'none'}")
        param = found[knob]
        name = knob.partition(".")[2]
        shared = sum(f"{kind}.{name}" in found for kind in KINDS) > 1
        axes[knob if shared else name] = parse_numbers(values, int if param["type"] == "int" else float,
                                                       "Values", param["rule"])
    axes["block_size"] = parse_numbers(blocks, int, "Block sizes", "whole numbers >= 1")
    return axes


def concurrency_levels(crossovers: dict, per_octave: int = 16) -> list[float]:
    """Whole numbers of requests from 1, about ``per_octave`` per doubling, up to the power of two at
    least four times the last turning point (at least 1024), so every turn shows with room for its
    label after it; and the turning points themselves, so the curves' corners sit on their markers."""
    turns = [v for v in crossovers.values() if math.isfinite(v) and v >= 1]
    top = min(2**20, max(1024, 2 ** math.ceil(math.log2(4 * max(turns)))))
    steps = int(math.log2(top)) * per_octave
    return sorted({round(2 ** (k / per_octave)) for k in range(steps + 1)} | {v for v in turns if v <= top})


@checked
def show_concurrency(device: DeviceName, model: ConcurrencyModel, g: float | None, tau: float | None) -> tuple[Any, str]:
    """The concurrency view: throughput curves and the sentence naming their two turning points
    (see costmodel.concurrency_curve). Bad G or τ leave the plot as it was and say why."""
    if g is None or tau is None:
        return gr.update(), "⚠ Type both G and τ."
    if model not in CONCURRENCY_MODELS or device not in DEVICES:
        return gr.update(), f"⚠ Pick a listed GPU and model, not {device!r} and {model!r}."
    target, gpu = CONCURRENCY_MODELS[model], DEVICES[device]
    try:
        crossovers = concurrency_crossovers(target, gpu, float(g), float(tau))
    except (TypeError, ValueError) as exc:  # TypeError: a value that is no number (an API client's)
        return gr.update(), f"⚠ {exc}"
    rows = concurrency_curve(target, gpu, float(g), float(tau), concurrency_levels(crossovers))
    title = f"{target.name} on {gpu.name}: G = {float(g):g}, τ = {float(tau):g}"
    return tune_figures.concurrency_figure(rows, crossovers, title), tune_figures.concurrency_line(crossovers)


class ConcurrencyView:
    """The write-up's concurrency caveat as a plot: pure arithmetic on the cost model, no engine."""

    def __init__(self) -> None:
        example = TEACHING_EXAMPLE
        with gr.Accordion("Concurrency: when does an autoregressive model catch up?", open=False,
                          elem_id="tune-concurrency-view"):
            gr.Markdown("Decode throughput of B concurrent requests on one GPU (the cost model's roofline: weight "
                        "read or arithmetic, attention and KV reads left out). **G** = positions recomputed per "
                        "forward, **τ** = tokens committed per forward. The defaults are the write-up's teaching "
                        f"example (7B, G = {example.g:g}, τ = {example.tau:g}); type in the last run's figures (the "
                        "Run tab's *mean G* and *content τ* cards) to see where it stands. The turning points depend "
                        "on the GPU's FLOP-to-byte ratio, G and τ, not on the model's size: the model only sets the "
                        "curves' height.", elem_classes="caption")
            with gr.Row():
                self.device = gr.Dropdown(list(DEVICES), value=example.device, label="GPU", elem_id="tune-conc-device")
                self.model = gr.Dropdown(list(CONCURRENCY_MODELS), value=example.model.name, label="Model",
                                         elem_id="tune-conc-model")
                self.g = number_box(example.g, label="G (positions recomputed per forward)", elem_id="tune-conc-g")
                self.tau = number_box(example.tau, label="τ (tokens committed per forward)", elem_id="tune-conc-tau")
            figure, line = show_concurrency(example.device, example.model.name, example.g, example.tau)
            self.plot = gr.Plot(figure, label="Throughput against concurrent requests", elem_id="tune-concurrency")
            self.line = gr.Markdown(line, elem_id="tune-concurrency-line")

    def wire(self) -> None:
        """Any of the four inputs redraws the view: arithmetic only, no model, no queue."""
        inputs = [self.device, self.model, self.g, self.tau]
        for box in inputs:  # one API endpoint, /concurrency, for the four events
            api = {"api_name": "concurrency"} if box is self.tau else {"api_visibility": "private"}
            box.change(show_concurrency, inputs, [self.plot, self.line], queue=False, **api)


class TuneTab:
    """The Tune tab's components (laid out on creation, inside a ``gr.Tab``) and its callbacks. A
    clicked table row loads its settings into the Run tab (``tabs`` selects it)."""

    def __init__(self, engine: EngineQueue, presets: dict, default_preset: str | None, run: RunTab,
                 tabs: gr.Tabs) -> None:
        self.engine, self.session, self.presets, self.specs = engine, engine.session, presets, run.specs
        self.run_tab, self.tabs = run, tabs
        gr.Markdown("Sweep one knob of the base settings' policies × block size on one of the tiny model's tasks: "
                    "accuracy against speed, the Pareto frontier in red. Click a table row to load its settings into "
                    "the Run tab (the red points' numbers are the table's *Pareto #*). *Add results* puts the points of a "
                    "JSON report (`lm-eval --out`, `sweep --out`) beside them as diamonds; a new sweep starts a new chart. "
                    "The second chart is each policy's accuracy against content tokens per forward and its **AUP** "
                    "(accuracy under parallelism, d3LLM's score): the area under that curve, in % × tokens per forward, "
                    "accuracy below the best counting less. 100 is one token per forward at 100% accuracy, so an AUP "
                    "of 540 is worth about 5.4 tokens per forward decoded without a mistake.",
                    elem_classes="caption")
        base = presets[default_preset]["settings"] if default_preset else {}
        with gr.Row():
            self.preset = gr.Dropdown(list(presets), value=default_preset, label="Base settings", elem_id="tune-preset")
            self.task = gr.Dropdown(list(TASKS), value=TASKS[0], label="Task")
            self.n = number_box(20, label="Problems", precision=0, elem_id="tune-n")
        with gr.Row():
            # Its choices follow the base settings; a value typed by an API client is checked by the sweep.
            self.knob = gr.Dropdown(**knob_choices(self.specs, base), label="Knob", allow_custom_value=True,
                                    scale=2, elem_id="tune-knob")  # its labels are long: room beside the arrow
            self.values = gr.Textbox(listed(SWEEP_THRESHOLDS), label="Values to try", elem_id="tune-values")
            self.blocks = gr.Textbox(listed(SWEEP_BLOCK_SIZES), label="Block sizes", elem_id="tune-blocks")
            self.gen = setting_widget("gen_length", SWEEP_GEN_LENGTH, elem_id="tune-gen")
        with gr.Row():
            self.button = gr.Button("Run sweep", variant="primary", elem_id="tune-btn")
            self.stop = gr.Button("Cancel", variant="stop", elem_id="tune-stop")
            self.add = gr.UploadButton("Add results (JSON)", file_types=[".json"], elem_id="tune-add")
        self.stop_note = gr.Markdown("", elem_id="tune-stop-note")
        self.status = gr.Markdown("", elem_id="tune-status")
        self.plot = gr.Plot(elem_id="tune-plot")
        self.aup_plot = gr.Plot(elem_id="tune-aup")
        self.table = gr.Dataframe(headers=tune_figures.SWEEP_TABLE_HEADERS, interactive=False, elem_id="tune-table")
        self.report = gr.State({})
        self.concurrency = ConcurrencyView()

    def wire(self) -> None:
        self.preset.change(self.show_knobs, [self.preset, self.knob], [self.knob, self.values], queue=False)
        # On a new knob only: a dropdown's input event also fires when it loses focus unchanged.
        self.knob.change(self.suggest_values, [self.preset, self.knob], [self.values], queue=False)
        event = self.button.click(self.run_sweep, [self.preset, self.task, self.n, self.knob, self.values, self.blocks,
                                                   self.gen],
                                  [self.report, self.plot, self.aup_plot, self.table, self.status], api_name="sweep",
                                  **ENGINE)
        self.engine.wire_stop(self.stop, self.stop_note, [event], api_name="cancel_sweep")
        self.add.upload(self.add_results, [self.add, self.report],
                        [self.report, self.plot, self.aup_plot, self.table, self.status],
                        api_name="add_results", concurrency_limit=2, concurrency_id="import")
        # A click on a row only: without the click's data an API call has nothing to load.
        self.table.select(self.load_point, [self.report], [self.tabs, *self.run_tab.controls.values(),
                                                           self.run_tab.preset, self.run_tab.preset_applied],
                          queue=False, api_visibility="private")
        self.concurrency.wire()

    @checked
    def show_knobs(self, preset_name: Choice, knob: Choice | None) -> dict:
        """The knobs of the new base settings' policies; values to try for the knob, if it changed."""
        menu = knob_choices(self.specs, self.presets[preset_name]["settings"])
        if menu["value"] == knob:
            return {self.knob: gr.update(**menu)}
        return {self.knob: gr.update(**menu), self.values: self.suggest_values(preset_name, menu["value"])}

    @checked
    def suggest_values(self, preset_name: Choice, knob: Choice | None) -> str | dict:
        settings = self.presets[preset_name]["settings"]
        found = sweep_knobs(self.specs, settings)
        return suggested_values(found[knob]) if knob in found else gr.update()

    @engine_handler
    @checked
    def run_sweep(self, request: gr.Request, preset_name: Choice, task: Choice, n: Any, knob: Choice | None,
                  values: Text, blocks: Text, gen: Length, progress=gr.Progress()) -> Iterator[dict]:
        # n is read by the task suite's own check (check_task), its message told in the status line.
        client = client_of(request)
        self.engine.lab.require_lecturer(self.engine.lab.who(request), "A sweep")
        n = check_task(task, n)  # a count typed by an API client is checked before any work
        base = dict(self.presets[preset_name]["settings"], gen_length=gen, trace="off", exact_drift=False)
        axes = sweep_axes(self.specs, base, knob, values, blocks)
        try:
            report: dict = {"axes": axes, "rows": [], "problems": n}
            for event in self.session.sweep(task, n, base, axes, run_id=client):  # the points checked there
                if "units" in event:  # problems done, and each worker's pace (several on a cluster)
                    u = event["units"]
                    progress(u["done"] / u["total"], desc=f"problem {u['done']}/{u['total']}")
                    pace = ", ".join(f"{w} {v:.1f}/s" for w, v in u["throughput"].items())
                    yield {self.status: f"Problem {u['done']}/{u['total']} · {len(report['rows'])} points done · {pace}"}
                elif "progress" in event:
                    p = event["progress"]
                    report["rows"].append({**p["row"], "point": p["point"], "pareto": False})
                    # The figure waits for the end: while the sweep runs, the browser's drawing would take
                    # CPU from it (the table, cheap, fills in point by point).
                    yield {self.report: report, self.table: tune_figures.sweep_table(report)}
                else:
                    report = event["report"]
            word = "Cancelled" if report["cancelled"] else "Done"
            yield {self.report: report, self.plot: tune_figures.sweep_figure(report),
                   self.aup_plot: aup_figure(report), self.table: tune_figures.sweep_table(report),
                   self.status: f"{word}: {len(report['rows'])} points. {aup_line(report)}"}
        except Exception as exc:  # noqa: BLE001
            yield {self.status: f"⚠ {error_text(exc)}"}

    @checked
    def add_results(self, file: Any, report: PageState) -> dict:
        """The points of a JSON report (``lm-eval --out``, ``sweep --out``) added to the chart and
        table beside the sweep's. A bad file is one message in the status line."""
        try:
            if file is None:
                raise DllmError("no file was given; choose the JSON of `lm-eval --out` or `sweep --out`")
            path = Path(file if isinstance(file, str) else file.name)
            added = read_json(path, RESULTS_MAX_BYTES, "it")
            report = add_points(report or {}, added, path.name)
        except DllmError as exc:
            return {self.status: f"⚠ could not add that file: {exc}"}
        count = len(added["rows"])
        return {self.report: report, self.plot: tune_figures.sweep_figure(report),
                self.aup_plot: aup_figure(report), self.table: tune_figures.sweep_table(report),
                self.status: f"Added {count} point{'s' if count != 1 else ''} from {path.name}."}

    def load_point(self, report: dict, evt: gr.SelectData) -> dict:
        rows = report.get("rows") or []
        if evt.index is None or evt.index[0] >= len(rows) or "settings" not in rows[evt.index[0]]:
            return {}
        return {self.tabs: gr.Tabs(selected="run"), **self.run_tab.settings_loaded(rows[evt.index[0]]["settings"])}
