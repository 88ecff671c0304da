"""The playground page: Gradio Blocks over a ``dllm_local.session.Session``. No torch here.

``build`` lays the page out (``_layout`` and the functions it calls, which only create
components) and then wires its events (``_wire``) to the methods of ``Callbacks``, which hold the
session; callbacks that need no session are plain module functions.
"""
from __future__ import annotations

import atexit
import html
import itertools
import json
import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from dllm_local.errors import DllmError, ModelLoadError, SettingsError
from dllm_local.experiments.costmodel import (
    CONCURRENCY_MODELS,
    DEVICES,
    TARGET_MODELS,
    TEACHING_EXAMPLE,
    concurrency_crossovers,
    concurrency_curve,
    project,
)
from dllm_local.experiments.frontier import add_points
from dllm_local.settings import length_notice
from dllm_local.tiny.tasks import verdict
from dllm_local.trace import load_trace_file

from . import plots
from .controls import (
    Specs,
    controls_from_settings,
    knobs,
    policy_choices,
    settings_from_controls,
    shown_for,
    spec_named,
    toggled_controls,
    visible_knobs,
)

TINY_EXAMPLES = [
    "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?",
    "Ben has 9 coins, finds 8 more, then gives away 9. How many now?",
    "Kate is playing cards. Name a poker hand Kate could hold.",
    "Give two numbers whose sum is 9.",
    "Make a record from these facts. Leo lives in Oslo. Leo is 42 years old. Leo works as a pilot.",
]
REDRAW_EVERY_S = 0.2  # throttle: the browser keeps up; the first step and the final state are always drawn
# Mid-run plot redraws at most this often (and none in a shorter run): redrawing the three plots
# costs a browser about half a second of CPU, taken from the engine on a small machine.
PLOTS_EVERY_S = 1.0
PAGE_SHARE = 0.2  # at most this share of a run's time goes to drawing it
# Every event that talks to the engine (runs, compare, sweep, cost model, model switch) waits in
# one queue group: one at a time, in order, so none meets a busy engine.
ENGINE = {"concurrency_limit": 1, "concurrency_id": "engine", "queue": True}
ON_MODEL = ENGINE  # the old name
RESULTS_MAX_BYTES = 4 * 2**20  # an added results report (lm-eval, sweep JSON) is a few kB
EXPORTS_KEPT = 20  # export files kept on disk while the page runs (older ones are deleted)
# Gradio's own cache of files handed to browsers: swept every hour of anything older than an hour.
DELETE_CACHE = (3600, 3600)
CANCELLED = "Your queued request was cancelled before it started."
CSS = """
.tok-grid {line-height: 2.1em}
#status {min-height: 1.5em}
.caption, .caption p {color: #444; font-size: 15px !important; margin-top: -6px}
.policy-info, .policy-info p {color: #444; font-size: 15px !important; padding: 4px 12px}
#status, #status p {font-size: 16px !important}
#tune-concurrency-line, #tune-concurrency-line p {font-size: 18px !important}
"""

# Gradio's queue line ("queue: 2/3 | 1.2/4.0s") read as words: every run ahead (the one going and
# those waiting before yours) counts.
JS = """
() => {
  const words = (node) => {
    const m = node.nodeValue && node.nodeValue.match(/queue: (\\d+)\\/\\d+ \\|/);
    if (!m) return;
    const ahead = Number(m[1]);
    node.nodeValue = node.nodeValue.replace(m[0], `waiting: ${ahead} run${ahead === 1 ? "" : "s"} ahead of yours |`);
  };
  const walk = (root) => {
    if (root.nodeType === Node.TEXT_NODE) return words(root);
    const it = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = it.nextNode(); n; n = it.nextNode()) words(n);
  };
  new MutationObserver((changes) => {
    for (const c of changes) {
      if (c.type === "characterData") words(c.target);
      else c.addedNodes.forEach(walk);
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}
"""
LAUNCH_OPTIONS = {"css": CSS, "js": JS, "footer_links": []}


def throttled(events: Iterable[dict], every: float = REDRAW_EVERY_S,
              page_share: float = PAGE_SHARE) -> Iterator[tuple[dict, bool]]:
    """The growing trace of a session's run events (``Session.run``); yield ``(trace, done)`` at
    most every ``every`` seconds, and always the first step (it sets the click-to-paint latency)
    and the final state.

    The gap between redraws also grows with what a redraw costs (the time the consumer takes
    before asking for more), so drawing takes at most ``page_share`` of the run: the engine has
    a process of its own, but on a small machine the page and the browser share its cores.
    """
    last, gap = -math.inf, every  # the start (the empty grid) is drawn at once
    for event in events:
        live, done = event["trace"], "end" in event
        first_step = "step" in event and len(live["steps"]) == 1
        if done or first_step or time.perf_counter() - last >= gap:
            yielded = time.perf_counter()
            yield live, done
            last = time.perf_counter()
            gap = max(every, (last - yielded) * (1 - page_share) / page_share)


def _views(trace: dict, step: int | None, color_by: str, layer: str, which: str, kv_view: str, what_if: float = 0.0,
           with_plots: bool = True) -> tuple:
    """Everything drawn from a trace at one step: the only way views are produced.
    ``with_plots=False`` leaves the three plots as they are (grid and numbers only)."""
    steps = len(trace.get("steps", []))
    at = steps - 1 if step is None else min(int(step), steps - 1)
    upto = at if steps else None
    if not with_plots:
        figures = [gr.update()] * 3
    else:
        figures = [plots.confidence_heatmap(trace, upto),
                   plots.kv_heatmap(trace, layer=layer, which=which, upto_step=upto, view=kv_view),
                   plots.cache_panel(trace, upto)]
    grid = plots.token_grid_html(trace, at, color_by=color_by, what_if_threshold=float(what_if) or None)
    return (grid, plots.numbers_html(plots.numbers(trace, upto)), *figures)


# ---------------------------------------------------------------- layout
def build(session, presets: dict, preset_problems: list[str], default_preset: str | None = None,
          models: ModelAccess | None = None, exports: ExportFolder | None = None) -> gr.Blocks:
    """The page over ``session``: the policy controls come from the engine's policy specs.
    ``models``: which models the page may load (default: the listed ones only); ``exports``: where
    export files go (default: a new folder, deleted at exit)."""
    default_preset = _pick(presets, default_preset)
    specs = session.policy_specs()
    exports = exports or ExportFolder()
    with gr.Blocks(title="dllm-local", delete_cache=DELETE_CACHE) as page:
        w = _layout(session, presets, preset_problems, default_preset, specs)
        cb = Callbacks(session, presets, specs, list(w.controls), models or ModelAccess(), exports)
        _wire(w, cb)
    page.run_event = w.run_event
    page.callbacks, page.exports, cb.page = cb, exports, page
    return page


class ExportFolder:
    """One folder for the export files of one app run: created at once, keeping the newest
    ``keep`` files, deleted at exit (``atexit``, which a Ctrl-C also reaches) or by ``cleanup``."""

    def __init__(self, keep: int = EXPORTS_KEPT, prefix: str = "dllm-local-") -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        atexit.register(self.cleanup)

    def write(self, trace: dict) -> str:
        """The trace as a new JSON file here (the older ones beyond ``keep`` are deleted)."""
        with self._lock:
            self.path.mkdir(parents=True, exist_ok=True)
            path = self.path / f"dllm-trace-{next(self._numbers):04d}.json"
            path.write_text(json.dumps(trace))
            files = sorted(self.path.glob("dllm-trace-*.json"), key=lambda f: f.name)
            for old in files[:-self.keep]:
                old.unlink(missing_ok=True)
        return str(path)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class ModelAccess:
    """Which models the page's model box may load: the listed short names, folders under
    ``models_dir`` (a folder name there, or a path inside it), and hub ids only when
    ``allow_downloads``. The command line's ``--model`` is not limited by this."""

    HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

    def __init__(self, models_dir: str | Path | None = None, allow_downloads: bool = False,
                 listed: Iterable[str] | None = None) -> None:
        if listed is None:
            from dllm_local.serving.session import MODEL_CHOICES
            listed = MODEL_CHOICES
        self.listed = list(listed)
        self.models_dir = Path(models_dir).expanduser().resolve() if models_dir else None
        self.allow_downloads = allow_downloads

    def check(self, name: str) -> str:
        """What to hand the engine for ``name`` (a listed name, a folder path or a hub id); raise
        ModelLoadError saying what is allowed otherwise."""
        name = (name or "").strip()
        if name in self.listed:
            return name
        if name and self.models_dir is not None:
            candidate = Path(name).expanduser()
            candidate = (candidate if candidate.is_absolute() else self.models_dir / candidate).resolve()
            if candidate.is_relative_to(self.models_dir) and candidate != self.models_dir:
                if candidate.is_dir():
                    return str(candidate)
                if not self.HUB_ID.match(name):
                    raise ModelLoadError(f"there is no model folder {name!r} in {self.models_dir}")
        if self.HUB_ID.match(name) and not Path(name).expanduser().exists():
            if self.allow_downloads:
                return name
            raise ModelLoadError(f"loading hub model {name!r} from the page is off; start the page with "
                                 "--allow-downloads to allow it, or pick a listed model")
        where = (f"a model folder in {self.models_dir}" if self.models_dir is not None
                 else "a local folder (start the page with --models-dir DIR to allow the folders in DIR)")
        raise ModelLoadError(f"the page does not load {name!r}: pick one of {', '.join(self.listed)}, or {where}")


def _layout(session, presets: dict, problems: list[str], default_preset: str | None, specs: Specs) -> SimpleNamespace:
    """Every component, by name (``w.controls``: the controls a run reads, by control name)."""
    w = SimpleNamespace(trace=gr.State({}))
    start_settings = presets[default_preset]["settings"] if default_preset else {}
    start = controls_from_settings(start_settings, specs)
    start_prompt = presets[default_preset].get("prompt", TINY_EXAMPLES[0]) if default_preset else TINY_EXAMPLES[0]
    gr.Markdown("# dllm-local\nAccelerated diffusion-LLM decoding, live, step by step. "
                "Timings are model time measured with device synchronisation; page work is counted apart.")
    w.model_line = gr.Markdown(_model_line(session.info()), elem_id="model-line")
    if problems:
        gr.Markdown("\n".join(f"- ⚠ {p}" for p in problems), elem_id="preset-problems")
    with gr.Tabs() as w.tabs:
        with gr.Tab("Run", id="run"):
            with gr.Row():
                with gr.Column(scale=2, min_width=320):
                    _run_inputs(w, presets, default_preset, start_prompt)
                    w.controls = _controls(w, start, specs)
                    _model_and_files(w, session)
                with gr.Column(scale=5):
                    _run_views(w, session)
        with gr.Tab("Compare", id="compare"):
            _compare_tab(w, presets, default_preset)
        with gr.Tab("Tune", id="tune"):
            _tune_tab(w, presets, default_preset)
    return w


def _run_inputs(w: SimpleNamespace, presets: dict, default_preset: str | None, start_prompt: str) -> None:
    w.preset = gr.Dropdown(list(presets), value=default_preset, label="Preset", elem_id="preset")
    w.preset_info = gr.Markdown(presets[default_preset]["description"] if default_preset else "", elem_id="preset-info")
    w.prompt = gr.Textbox(start_prompt, label="Prompt", lines=3, elem_id="prompt")
    gr.Examples([[e] for e in TINY_EXAMPLES], inputs=[w.prompt], label="Examples for the tiny model")
    with gr.Row():
        w.run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
        w.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
    w.stop_note = gr.Markdown("", elem_id="stop-note")
    w.status = gr.Markdown("", elem_id="status")


KV_VIEW_DEFAULTS = {"which": "v", "kv_view": "drift"}


def layer_choices(layers: int) -> dict:
    """The KV panel's layer menu: the mean over layers, then each layer; it opens on a middle
    layer, since layer 0's K/V depend on the token alone and never drift."""
    choices = [("all layers (mean)", plots.MEAN_LAYERS)] + [(f"layer {i}", str(i)) for i in range(max(1, layers))]
    return {"choices": choices, "value": str(max(1, layers) // 2)}


# Past the tiny model's trained 512 (a notice says so), short of its 1,024 positions.
SLIDER_MAX_LENGTH = 768


def _controls(w: SimpleNamespace, start: dict, specs: Specs) -> dict[str, gr.Component]:
    """The run's controls, by control name: each policy with its description and knobs (from the
    specs), then the rest."""
    shown = visible_knobs(start["cache"], start["unmask"], specs)
    w.policy_info = {}
    controls: dict[str, gr.Component] = {}
    for kind, label in (("cache", "Cache policy"), ("unmask", "Unmasking policy")):
        with gr.Group():  # one box per policy: its choice, what it does, its knobs
            controls[kind] = gr.Dropdown(policy_choices(specs, kind), value=start[kind], label=label, elem_id=kind)
            w.policy_info[kind] = gr.Markdown(spec_named(specs, kind, start[kind])["description"],
                                              elem_id=f"{kind}-info", elem_classes="policy-info")
            controls.update(policy_knobs(specs, kind, start, shown))
    controls["block_size"] = gr.Slider(4, 128, start["block_size"], step=4, label="Block size", elem_id="block-size")
    controls["gen_length"] = gr.Slider(16, SLIDER_MAX_LENGTH, start["gen_length"], step=16, label="Generation length",
                                       elem_id="gen-length")
    w.length_notice = gr.Markdown("", elem_id="length-notice")
    controls["steps"] = gr.Slider(1, SLIDER_MAX_LENGTH, start["steps"], step=1, label="Steps (fixed schedule)", elem_id="steps",
                                  visible=shown["steps"])
    with gr.Row():
        controls["temperature"] = gr.Slider(0.0, 2.0, start["temperature"], step=0.1, label="Temperature")
        controls["seed"] = gr.Number(start["seed"], label="Seed", precision=0)
    controls["exact_drift"] = gr.Checkbox(
        start["exact_drift"], label="Exact-drift diagnostic (a full forward each step, cost reported apart)")
    return controls


def policy_knobs(specs: Specs, kind: str, values: dict, shown: dict[str, bool]) -> dict[str, gr.Component]:
    """One component per knob of ``kind`` (see ``controls.knobs``), by control name, set to
    ``values`` and visible where ``shown`` says. Call it inside a Blocks."""
    names = [param["name"] for param in knobs(specs).values()]
    # An element id is the parameter's name, prefixed by its kind where both kinds have that name.
    ids = {key: (key if names.count(param["name"]) > 1 else param["name"]).replace(".", "-").replace("_", "-")
           for key, param in knobs(specs, kind).items()}
    return {key: knob_widget(param, values[key], shown[key], ids[key]) for key, param in knobs(specs, kind).items()}


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


def _model_and_files(w: SimpleNamespace, session) -> None:
    quant_ok = {name: ok for name, ok, _ in session.quantization_options()}
    quant_reason = next((r for name, _, r in session.quantization_options() if name != "none" and r), "")
    with gr.Accordion("Model", open=False):
        w.model_pick = gr.Dropdown([n for n, _, _ in session.model_options()], value=session.info()["name"],
                                   label="Model", allow_custom_value=True)
        w.quant = gr.Radio(["none", "8bit", "4bit"], value="none", label="Quantization",
                           info=quant_reason and f"8-bit and 4-bit: {quant_reason}",
                           interactive=quant_ok.get("4bit", False))
        w.load_btn = gr.Button("Load model")
    with gr.Row():
        w.export_btn = gr.DownloadButton("Export trace (JSON)", elem_id="export-btn")
        w.import_file = gr.UploadButton("Import trace", file_types=[".json"], elem_id="import-btn")


def _run_views(w: SimpleNamespace, session) -> None:
    with gr.Row():
        w.scrub = gr.Slider(0, 1, 0, step=1, label="Step", elem_id="scrubber")
        w.follow = gr.Checkbox(True, label="Follow live", scale=0, elem_id="follow")
        w.color_by = gr.Radio(["step", "confidence"], value="step", label="Colour tokens by", scale=0)
    w.grid = gr.HTML(elem_id="token-grid")
    gr.Markdown(plots.CAPTIONS["token_grid"], elem_classes="caption")
    w.what_if = gr.Slider(0, 1, 0, step=0.05, elem_id="what-if",
                          label="What-if threshold τ′ (0 = off): the positions τ′ would commit at this step, replayed "
                                "from the stored confidences without running the model")
    w.nums = gr.HTML(elem_id="numbers")
    with gr.Accordion("Cost model: this run projected onto a real model on a GPU", open=False):
        with gr.Row():
            w.cost_target = gr.Dropdown(list(TARGET_MODELS), value="LLaDA-8B-Instruct", label="Real model")
            w.cost_device = gr.Dropdown(list(DEVICES), value="H100", label="GPU")
        w.cost_html = gr.HTML(elem_id="cost-model")
    # Each plot starts with its empty figure: the browser loads the plotting
    # library with the page, not on the first run's first step.
    w.conf_plot = gr.Plot(plots.confidence_heatmap({}), label="Confidence", elem_id="conf-plot")
    gr.Markdown(plots.CAPTIONS["confidence"], elem_classes="caption")
    with gr.Row():
        w.layer = gr.Dropdown(**layer_choices(session.info().get("layers", 1)), label="Layer", elem_id="kv-layer")
        w.which = gr.Radio(["k", "v"], value=KV_VIEW_DEFAULTS["which"], label="K or V")
        w.kv_view = gr.Radio(["drift", "true_drift", "cache_error"], value=KV_VIEW_DEFAULTS["kv_view"], label="KV view")
    w.kv_plot = gr.Plot(plots.kv_heatmap({}, which="v"), label="KV cosine similarity", elem_id="kv-plot")
    gr.Markdown(plots.CAPTIONS["kv"], elem_classes="caption")
    w.cache_plot = gr.Plot(plots.cache_panel({}), label="Cache", elem_id="cache-plot")
    gr.Markdown(plots.CAPTIONS["cache"], elem_classes="caption")
    w.view_inputs = [w.color_by, w.layer, w.which, w.kv_view, w.what_if]
    w.view_outputs = [w.grid, w.nums, w.conf_plot, w.kv_plot, w.cache_plot]


CURRENT = "Current Run settings"
SETTING_FIELDS = ("gen_length", "block_size", "steps", "temperature", "seed", "exact_drift", "early_stop")


def _compare_tab(w: SimpleNamespace, presets: dict, default_preset: str | None) -> None:
    gr.Markdown("Two settings on the Run tab's prompt and seed, run one after the other so each run's time is its "
                "own. Either side can be the Run tab's current settings or a preset; B can be changed further.")
    choices = [CURRENT, *presets]
    with gr.Row():
        w.preset_a = gr.Dropdown(choices, value=CURRENT, label="Settings A", elem_id="preset-a")
        w.preset_b = gr.Dropdown(choices, value=_pick(presets, "LLaDA baseline"), label="Settings B", elem_id="preset-b")
    w.cmp_changes = gr.Textbox("", label="Changes to B (optional), e.g. threshold=0.5, block_size=16, cache=prefix",
                               elem_id="cmp-changes")
    w.cmp_btn = gr.Button("Run both", variant="primary", elem_id="cmp-btn")
    w.cmp_status = gr.Markdown("", elem_id="cmp-status")
    with gr.Row():
        w.grid_a = gr.HTML(elem_id="grid-a")
        w.grid_b = gr.HTML(elem_id="grid-b")
    w.cmp_table = gr.HTML(elem_id="cmp-table")


def _tune_tab(w: SimpleNamespace, presets: dict, default_preset: str | None) -> None:
    gr.Markdown("Sweep threshold × block size on one of the tiny model's tasks: accuracy against speed, "
                "the Pareto frontier in red. Click a table row to load its settings into the Run tab. "
                "*Add results* puts the points of a JSON report (`lm-eval --out`, `sweep --out`) beside "
                "them as diamonds; a new sweep starts a new chart.")
    with gr.Row():
        w.tune_preset = gr.Dropdown(list(presets), value=default_preset, label="Base settings", elem_id="tune-preset")
        w.tune_task = gr.Dropdown(["arithmetic", "poker", "sums", "records"], value="arithmetic", label="Task")
        w.tune_n = gr.Number(20, label="Problems", precision=0, elem_id="tune-n")
    with gr.Row():
        w.tune_thresholds = gr.Textbox("0.5,0.7,0.8,0.9", label="Thresholds", elem_id="tune-thresholds")
        w.tune_blocks = gr.Textbox("8,16,32", label="Block sizes", elem_id="tune-blocks")
        w.tune_gen = gr.Number(64, label="Generation length", precision=0)
    with gr.Row():
        w.tune_btn = gr.Button("Run sweep", variant="primary", elem_id="tune-btn")
        w.tune_stop = gr.Button("Cancel", variant="stop", elem_id="tune-stop")
        w.tune_add = gr.UploadButton("Add results (JSON)", file_types=[".json"], elem_id="tune-add")
    w.tune_stop_note = gr.Markdown("", elem_id="tune-stop-note")
    w.tune_status = gr.Markdown("", elem_id="tune-status")
    w.tune_plot = gr.Plot(elem_id="tune-plot")
    w.tune_table = gr.Dataframe(headers=plots.SWEEP_TABLE_HEADERS,
                                interactive=False, elem_id="tune-table")
    w.tune_state = gr.State({})
    _concurrency_view(w)


def _concurrency_view(w: SimpleNamespace) -> None:
    """The write-up's concurrency caveat as a plot: pure arithmetic on the cost model, no engine."""
    example = TEACHING_EXAMPLE
    with gr.Accordion("Concurrency: when does an autoregressive model catch up?", open=False,
                      elem_id="tune-concurrency-view"):
        gr.Markdown("Decode throughput of B concurrent requests on one GPU (the cost model's roofline: weight read "
                    "or arithmetic, attention and KV reads left out). **G** = positions recomputed per forward, "
                    "**τ** = tokens committed per forward. The defaults are the write-up's teaching example "
                    f"(7B, G = {example.g:g}, τ = {example.tau:g}); type in the last run's figures (the Run tab's "
                    "*mean G* and *content τ* cards) to see where it stands. The turning points depend on the GPU's "
                    "FLOP-to-byte ratio, G and τ, not on the model's size: the model only sets the curves' height.",
                    elem_classes="caption")
        with gr.Row():
            w.conc_device = gr.Dropdown(list(DEVICES), value=example.device, label="GPU", elem_id="tune-conc-device")
            w.conc_model = gr.Dropdown(list(CONCURRENCY_MODELS), value=example.model.name, label="Model",
                                       elem_id="tune-conc-model")
            w.conc_g = gr.Number(example.g, label="G (positions recomputed per forward)", elem_id="tune-conc-g")
            w.conc_tau = gr.Number(example.tau, label="τ (tokens committed per forward)", elem_id="tune-conc-tau")
        figure, line = show_concurrency(example.device, example.model.name, example.g, example.tau)
        w.conc_plot = gr.Plot(figure, label="Throughput against concurrent requests", elem_id="tune-concurrency")
        w.conc_line = gr.Markdown(line, elem_id="tune-concurrency-line")


# ---------------------------------------------------------------- events
def _wire(w: SimpleNamespace, cb: Callbacks) -> None:
    controls = list(w.controls.values())
    for kind, info in w.policy_info.items():  # each policy its own controls: no race between the two
        toggled = [w.controls[name] for name in toggled_controls(cb.specs, kind)]
        w.controls[kind].change(partial(cb.show_policy, kind), [w.controls[kind]], [info, *toggled], queue=False)
    w.preset.change(cb.apply_preset, [w.preset], [w.preset_info, w.prompt, *controls, w.layer, w.which, w.kv_view],
                    queue=False)
    w.controls["gen_length"].change(cb.length_notice, [w.controls["gen_length"]], [w.length_notice], queue=False)
    _wire_run(w, cb)
    _wire_stop(w.stop_btn, cb, w.stop_note, w.run_events, api_name="stop")
    views = [w.trace, w.scrub, *w.view_inputs]
    w.scrub.input(redraw, views, w.view_outputs, queue=False)
    for view in (v for v in w.view_inputs if v is not w.what_if):
        view.change(redraw, views, w.view_outputs, queue=False)
    # The what-if threshold changes the grid only: no plot redraw, no model run.
    w.what_if.change(redraw_grid, [w.trace, w.scrub, w.color_by, w.what_if], [w.grid], queue=False)
    # Checked in full (size, schema, lengths) before anything is drawn: a bad file is one message.
    w.import_file.upload(cb.import_trace, [w.import_file, *w.view_inputs],
                         [w.trace, *w.view_outputs, w.scrub, w.status, w.export_btn, w.prompt, *controls],
                         api_name="import_trace", concurrency_limit=2, concurrency_id="import")
    w.load_btn.click(cb.load_model, [w.model_pick, w.quant], [w.model_line, w.status, w.layer],
                     api_name="load_model", **ENGINE)
    for box in (w.cost_target, w.cost_device):  # arithmetic on the trace: no model, no queue
        box.change(show_cost, [w.trace, w.cost_target, w.cost_device], [w.cost_html], queue=False)
    _wire_concurrency(w)
    w.cmp_btn.click(cb.run_compare, [w.preset_a, w.preset_b, w.cmp_changes, w.prompt, *controls],
                    [w.grid_a, w.grid_b, w.cmp_table, w.cmp_status], api_name="compare", **ENGINE)
    tune_event = w.tune_btn.click(cb.run_sweep, [w.tune_preset, w.tune_task, w.tune_n, w.tune_thresholds,
                                                 w.tune_blocks, w.tune_gen],
                                  [w.tune_state, w.tune_plot, w.tune_table, w.tune_status], api_name="sweep", **ENGINE)
    _wire_stop(w.tune_stop, cb, w.tune_stop_note, [tune_event], api_name="cancel_sweep")
    w.tune_add.upload(cb.add_results, [w.tune_add, w.tune_state], [w.tune_state, w.tune_plot, w.tune_table, w.tune_status],
                      api_name="add_results", concurrency_limit=2, concurrency_id="import")
    w.tune_table.select(cb.load_point, [w.tune_state], [w.tabs, *controls], queue=False)


def _wire_concurrency(w: SimpleNamespace) -> None:
    """Any of the concurrency view's four inputs redraws it: arithmetic only, no model, no queue."""
    inputs = [w.conc_device, w.conc_model, w.conc_g, w.conc_tau]
    for box in inputs:  # one API endpoint, /concurrency, for the four events
        api = {"api_name": "concurrency"} if box is w.conc_tau else {"api_visibility": "private"}
        box.change(show_concurrency, inputs, [w.conc_plot, w.conc_line], queue=False, **api)


def _wire_run(w: SimpleNamespace, cb: Callbacks) -> None:
    """Run (button or Enter in the prompt), then the export file and the cost model once it ends."""
    inputs = [w.prompt, w.trace, w.follow, *w.view_inputs, *w.controls.values()]
    outputs = [w.trace, *w.view_outputs, w.scrub, w.status, w.controls["gen_length"]]
    # Gradio's queue position and timer on the status line only: overlays on the grid and the
    # plots would cover the live views and cost the browser CPU at every redraw.
    progress = {"show_progress": "minimal", "show_progress_on": [w.status]}
    w.run_event = w.run_btn.click(cb.run, inputs, outputs, api_name="run", **ENGINE, **progress)
    submit_event = w.prompt.submit(cb.run, inputs, outputs, api_visibility="private", **ENGINE, **progress)
    w.run_events = [w.run_event, submit_event]
    for event in w.run_events:
        event.then(cb.export_ready, [w.trace], [w.export_btn], api_visibility="private").then(
            show_cost, [w.trace, w.cost_target, w.cost_device], [w.cost_html], api_visibility="private", queue=False)


def _wire_stop(button: gr.Button, cb: Callbacks, note: gr.Markdown, events: list, api_name: str) -> None:
    """Stop for one tab: its own run stops within a step (and is drawn as it ended); its own
    request still waiting in the queue is taken out of it; another tab's run is left alone.

    Gradio's ``cancels`` would also end this tab's running event without its last update, so a
    queued request is cancelled on the server instead: it ends with a message, unrun, when its
    turn comes (``Callbacks.stop`` / ``_take_cancel``). Stop's reply goes to its own ``note``,
    never to the run's status line: under load it can arrive after the run's final update, and
    would then hide how the run ended. The note is cleared once the run (``events``) has ended:
    the status line then says how."""
    button.click(cb.stop, None, [note], queue=False, api_name=api_name, show_progress="hidden")
    for event in events:
        event.then(lambda: "", None, [note], queue=False, api_visibility="private", show_progress="hidden")


class Callbacks:
    """The event handlers that use the session, its presets or the policy specs. ``control_names``
    is the order in which the run's controls come in and go out."""

    def __init__(self, session, presets: dict, specs: Specs, control_names: list[str],
                 models: ModelAccess | None = None, exports: ExportFolder | None = None) -> None:
        self.session, self.presets, self.specs = session, presets, specs
        self.control_names = control_names
        self.models = models or ModelAccess()
        self.exports = exports or ExportFolder()
        self.run_numbers = itertools.count(1)  # tags the live grid so a browser can tell runs apart
        self.page: gr.Blocks | None = None  # set by ``build``: its queue tells who is waiting
        self.cancelled: set[str] = set()  # clients whose queued request was cancelled by Stop

    # ---- who is asking: one id per browser tab (Gradio's session hash) or gradio_client Client
    def _started(self, request) -> str:
        return _client(request)

    def _take_cancel(self, client: str) -> bool:
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
        """Stop this client's own run or sweep; never another's."""
        client = _client(request)
        if self.session.stop(client):
            return "Stopping after the current step…"
        if self._queued(client):  # it ends unrun when its turn comes (see _take_cancel)
            self.cancelled.add(client)
            return CANCELLED
        if self.session.owner() is not None:
            return "Nothing of this tab is running (another tab's run can only be stopped from that tab)."
        return "Nothing is running."

    def export_ready(self, trace: dict):
        # After the final state is drawn: writing a long trace is not what the user waits to see.
        return self.exports.write(trace) if trace.get("steps") else gr.update()

    def add_results(self, file, report: dict) -> tuple:
        """The points of a JSON report (``lm-eval --out``, ``sweep --out``) added to the chart and
        table beside the sweep's. A bad file is one message in the status line."""
        try:
            if file is None:
                raise DllmError("no file was given; choose the JSON of `lm-eval --out` or `sweep --out`")
            path = Path(file if isinstance(file, str) else file.name)
            if path.stat().st_size > RESULTS_MAX_BYTES:
                raise DllmError(f"it is over {RESULTS_MAX_BYTES // 2**20} MB; a results report is a few kB")
            try:
                added = json.loads(path.read_text())
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DllmError(f"it is not JSON ({exc})") from exc
            report = add_points(report or {}, added, path.name)
        except DllmError as exc:
            return gr.update(), gr.update(), gr.update(), f"⚠ could not add that file: {exc}"
        count = len(added["rows"])
        return (report, plots.sweep_figure(report), plots.sweep_table(report),
                f"Added {count} point{'s' if count != 1 else ''} from {path.name}.")

    def import_trace(self, file, color: str, lay: str, wh: str, view: str, what_if: float) -> tuple:
        """A trace file, checked in full before anything is drawn; its prompt and settings go into
        the Run tab's controls. A bad file is one message in the status line."""
        keep = [gr.update()] * (1 + len(self.control_names))
        try:
            if file is None:
                raise DllmError("no file was given; choose a trace exported by dllm-local")
            trace = load_trace_file(file if isinstance(file, str) else file.name).to_dict()
        except DllmError as exc:
            return (gr.update(), *[gr.update()] * 5, gr.update(), f"⚠ could not import that file: {exc}", gr.update(),
                    *keep)
        n = len(trace["steps"])
        prompt = prompt_of(trace)
        try:
            values = self._control_values(trace["settings"])
            values = [_fit_slider(name, v) for name, v in zip(self.control_names, values)]
        except (ValueError, TypeError, KeyError):
            values = [gr.update()] * len(self.control_names)  # a trace of policies this build lacks
        status = (f"Replaying an imported trace: {n} steps, {trace['settings'].get('cache')} + "
                  f"{trace['settings'].get('unmask')}. Move the step slider.")
        return (trace, *_views(trace, None, color, lay, wh, view, what_if), gr.update(maximum=max(1, n - 1), value=max(0, n - 1)),
                status, self.exports.write(trace), gr.update() if prompt is None else prompt, *values)

    def show_policy(self, kind: str, name: str) -> list:
        """What the policy ``name`` of ``kind`` does, and only its controls."""
        shown = shown_for(self.specs, kind, name)
        return [spec_named(self.specs, kind, name)["description"], *(gr.update(visible=v) for v in shown.values())]

    def _control_values(self, settings: dict) -> list:
        values = controls_from_settings(settings, self.specs)
        return [values[name] for name in self.control_names]

    def length_notice(self, gen_length: float) -> str:
        notice = length_notice(int(gen_length or 0), self.session.info().get("trained_length"))
        return f"⚠ {notice}" if notice else ""

    def apply_preset(self, name: str) -> list:
        """The preset's description, prompt and controls, and the KV view it opens on (its "view":
        layer, which, kv_view; the defaults where it names none)."""
        p = self.presets[name]
        layers = layer_choices(self.session.info().get("layers", 1))
        view = {"layer": layers["value"], **KV_VIEW_DEFAULTS, **p.get("view", {})}
        if view["layer"] not in [value for _, value in layers["choices"]]:  # a smaller model than the preset's
            view["layer"] = layers["value"]
        return [p["description"], p.get("prompt", gr.update()), *self._control_values(p["settings"]),
                view["layer"], view["which"], view["kv_view"]]

    def load_point(self, report: dict, evt: gr.SelectData) -> list:
        rows = report.get("rows") or []
        if evt.index is None or evt.index[0] >= len(rows) or "settings" not in rows[evt.index[0]]:
            return [gr.update()] * (len(self.control_names) + 1)
        return [gr.Tabs(selected="run"), *self._control_values(rows[evt.index[0]]["settings"])]

    def run(self, request: gr.Request, prompt_text: str, trace: dict, following: bool, color: str, lay: str, wh: str,
            view: str, what_if: float, *values) -> Iterator[tuple]:
        client = self._started(request)
        if self._take_cancel(client):
            yield _status_only(CANCELLED, trace)
            return
        try:
            settings, notice = settings_from_controls(dict(zip(self.control_names, values)), self.specs)
        except (ValueError, TypeError) as exc:
            yield _status_only(f"⚠ {exc}", trace)
            return
        notice = " ".join(filter(None, [notice, self.length_notice(settings["gen_length"])]))
        clicked = time.perf_counter()
        run_no = next(self.run_numbers)
        live: dict = {}
        first_paint, plots_drawn = None, clicked
        try:
            for live, done in throttled(self.session.run(prompt_text, settings, run_id=client)):
                n = len(live["steps"])
                if first_paint is None and n:
                    first_paint = time.perf_counter() - clicked
                msg = _run_status(live, notice, first_paint, done=done)
                if following:
                    # The grid at every redraw; the plots, far dearer to draw, less often.
                    with_plots = done or time.perf_counter() - plots_drawn >= PLOTS_EVERY_S
                    plots_drawn = time.perf_counter() if with_plots else plots_drawn
                    grid_html, *others = _views(live, None, color, lay, wh, view, what_if, with_plots=with_plots)
                    views = (_mark_run(grid_html, run_no, n, done), *others)
                    scrubber = gr.update(maximum=max(1, n - 1), value=max(0, n - 1))
                else:  # the user is looking at an earlier step: keep it, let the slider reach further
                    views, scrubber = [gr.update()] * 5, gr.update(maximum=max(1, n - 1))
                yield (live, *views, scrubber, msg, gr.update(value=int(settings["gen_length"])))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
            yield _status_only(f"⚠ {_message(exc)}", live or trace)

    def load_model(self, request: gr.Request, name: str, q: str, progress=gr.Progress()) -> tuple:
        client = self._started(request)
        try:
            target = self.models.check(name)  # only the models the page was started to allow
            progress((0, None), desc=f"loading {name}", unit="s")
            # The model loads in the engine process; the page shows the seconds it has taken.
            info = self.session.switch_model(target, q, run_id=client,
                                             on_wait=lambda s: progress((int(s), None), desc=f"loading {name}", unit="s"))
        except Exception as exc:  # noqa: BLE001
            return gr.update(), f"⚠ {_message(exc)}", gr.update()
        return _model_line(info), f"Loaded {info['name']}.", gr.update(**layer_choices(info["layers"]))

    def _compare_settings(self, name: str, current: dict) -> dict:
        return dict(current) if name == CURRENT else dict(self.presets[name]["settings"], seed=current["seed"])

    def run_compare(self, request: gr.Request, name_a: str, name_b: str, changes: str, prompt_text: str,
                    *values) -> Iterator[tuple]:
        client = self._started(request)
        if self._take_cancel(client):
            yield gr.update(), gr.update(), gr.update(), CANCELLED
            return
        try:
            current, _ = settings_from_controls(dict(zip(self.control_names, values)), self.specs)
            sides = {"a": self._compare_settings(name_a, current),
                     "b": apply_changes(self._compare_settings(name_b, current), changes, self.specs)}
        except (ValueError, TypeError, DllmError) as exc:
            yield gr.update(), gr.update(), gr.update(), f"⚠ {exc}"
            return
        results = {}
        grids = {"a": "", "b": ""}
        for key, settings in sides.items():
            label = f"{key.upper()}: {_settings_line({'unmask_params': {}, **settings})}"
            try:
                for live, _ in throttled(self.session.run(prompt_text, settings, run_id=client)):
                    grids[key] = f'<div class="dl-side"><b>{html.escape(label)}</b></div>' + plots.token_grid_html(
                        live, len(live["steps"]) - 1)
                    yield grids["a"], grids["b"], "", f"Running {label}…"
                results[key] = live
            except Exception as exc:  # noqa: BLE001
                yield grids["a"], grids["b"], "", f"⚠ {_message(exc)}"
                return
        seed = sides["a"]["seed"]
        yield (grids["a"], grids["b"], plots.compare_html(plots.compare(results["a"], results["b"])),
               f"Done. Both on the Run tab's prompt, seed {seed}.")

    def run_sweep(self, request: gr.Request, preset_name: str, task: str, n: int, thresholds: str, blocks: str,
                  gen: int, progress=gr.Progress()) -> Iterator[tuple]:
        client = self._started(request)
        if self._take_cancel(client):
            yield gr.update(), gr.update(), gr.update(), CANCELLED
            return
        try:
            axes = {"threshold": _numbers(thresholds, float, "Thresholds", lambda v: 0 < v <= 1, "between 0 and 1"),
                    "block_size": _numbers(blocks, int, "Block sizes", lambda v: v >= 1, "whole numbers >= 1")}
            base = dict(self.presets[preset_name]["settings"], gen_length=int(gen), trace="off", exact_drift=False)
            unmask = spec_named(self.specs, "unmask", base.get("unmask", "fixed"))
            if not any(p["name"] == "threshold" for p in unmask["params"]):  # the axis needs a policy with one
                base.update(unmask="threshold", unmask_params={"threshold": 0.9})
            report: dict = {"axes": axes, "rows": [], "problems": int(n)}
            for event in self.session.sweep(task, int(n), base, axes, run_id=client):
                if "progress" in event:
                    p = event["progress"]
                    report["rows"].append({**p["row"], "point": p["point"], "pareto": False})
                    progress(p["done"] / p["total"], desc=f"point {p['done']}/{p['total']}")
                    # The figure waits for the end: while the sweep runs, the browser's drawing would take
                    # CPU from it (the table, cheap, fills in point by point).
                    yield report, gr.update(), plots.sweep_table(report), f"Point {p['done']}/{p['total']}…"
                else:
                    report = event["report"]
            word = "Cancelled" if report["cancelled"] else "Done"
            yield report, plots.sweep_figure(report), plots.sweep_table(report), f"{word}: {len(report['rows'])} points."
        except Exception as exc:  # noqa: BLE001
            yield gr.update(), gr.update(), gr.update(), f"⚠ {_message(exc)}"


def redraw(trace: dict, step: int, color: str, lay: str, wh: str, view: str, what_if: float = 0.0) -> list | tuple:
    if not trace or not trace.get("steps"):
        return [gr.update()] * 5
    return _views(trace, step, color, lay, wh, view, what_if)


def show_cost(trace: dict, model: str, device: str) -> str:
    """This run's G and τ projected onto a real model on a GPU (see costmodel.project)."""
    stats = (trace or {}).get("stats") or {}
    if not stats.get("nfe"):
        return "Run something to project its G and τ onto a real model."
    rows = project(stats, len(trace["prompt_ids"]), int(trace["gen_length"]), TARGET_MODELS[model], DEVICES[device])
    return plots.cost_table_html(rows, model, DEVICES[device].name, trace)


def concurrency_levels(crossovers: dict, per_octave: int = 16) -> list[float]:
    """Whole numbers of requests from 1, about ``per_octave`` per doubling, up to the power of two at
    least four times the last turning point (at least 1024), so every turn shows with room for its
    label after it; and the turning points themselves, so the curves' corners sit on their markers."""
    turns = [v for v in crossovers.values() if math.isfinite(v) and v >= 1]
    top = min(2**20, max(1024, 2 ** math.ceil(math.log2(4 * max(turns)))))
    steps = int(math.log2(top)) * per_octave
    return sorted({round(2 ** (k / per_octave)) for k in range(steps + 1)} | {v for v in turns if v <= top})


def show_concurrency(device: str, model: str, g: float | None, tau: float | None) -> tuple[Any, str]:
    """The concurrency view: throughput curves and the sentence naming their two turning points
    (see costmodel.concurrency_curve). Bad G or τ leave the plot as it was and say why."""
    if g is None or tau is None:
        return gr.update(), "⚠ Type both G and τ."
    if model not in CONCURRENCY_MODELS or device not in DEVICES:
        return gr.update(), f"⚠ Pick a listed GPU and model, not {device!r} and {model!r}."
    target, gpu = CONCURRENCY_MODELS[model], DEVICES[device]
    try:
        crossovers = concurrency_crossovers(target, gpu, float(g), float(tau))
    except ValueError as exc:
        return gr.update(), f"⚠ {exc}"
    rows = concurrency_curve(target, gpu, float(g), float(tau), concurrency_levels(crossovers))
    title = f"{target.name} on {gpu.name}: G = {float(g):g}, τ = {float(tau):g}"
    return plots.concurrency_figure(rows, crossovers, title), plots.concurrency_line(crossovers)


def redraw_grid(trace: dict, step: int, color: str, what_if: float) -> str | dict:
    if not trace or not trace.get("steps"):
        return gr.update()
    at = min(int(step), len(trace["steps"]) - 1)
    return plots.token_grid_html(trace, at, color_by=color, what_if_threshold=float(what_if) or None)


_TURNS = (re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)<\|eot_id\|>", re.DOTALL),  # LLaDA
          re.compile(r"<\|im_start\|>user\s*(.*?)<\|im_end\|>", re.DOTALL))  # Dream (Qwen)


def prompt_of(trace: dict) -> str | None:
    """The prompt of a trace: its ``prompt`` field, else the last user turn of its prompt ids
    decoded with its vocab (the chat template taken off); None when that cannot be done."""
    if isinstance(trace.get("prompt"), str):
        return trace["prompt"]
    vocab = trace.get("vocab") or {}
    try:
        text = "".join(vocab[str(i)] for i in trace.get("prompt_ids") or [])
    except (KeyError, TypeError):
        return None
    for turn in _TURNS:
        found = turn.findall(text)
        if found:
            return found[-1].strip()
    return None if "<|" in text or not text.strip() else text.strip()


def _fit_slider(name: str, value):
    """A control value from an imported trace; a length past the slider's range widens it."""
    if name in ("gen_length", "steps") and isinstance(value, int) and value > SLIDER_MAX_LENGTH:
        return gr.update(value=value, maximum=value)
    return value


def _client(request) -> str:
    """Who is asking: the tab's (or gradio_client Client's) session hash; "local" outside Gradio."""
    return getattr(request, "session_hash", None) or "local"


def _status_only(msg: str, trace: dict) -> tuple:
    return (trace, *[gr.update()] * 5, gr.update(), msg, gr.update())


def _numbers(text: str, kind: type, what: str, ok: Callable[[float], bool], rule: str) -> list:
    """Comma-separated numbers from a text box, or a SettingsError that names the box and the rule."""
    values = []
    for piece in str(text).replace(" ", "").split(","):
        if not piece:
            continue
        try:
            value = kind(piece)
        except ValueError:
            raise SettingsError(f"{what}: {piece!r} is not a number; give values {rule}, separated by commas "
                             f"(e.g. {'0.5, 0.9' if kind is float else '8, 16, 32'})") from None
        if not ok(value):
            raise SettingsError(f"{what}: {piece} is out of range; give values {rule}")
        values.append(value)
    if not values:
        raise SettingsError(f"{what}: no values given; give values {rule}, separated by commas")
    return values


def apply_changes(settings: dict, changes: str, specs: Specs) -> dict:
    """``settings`` with "key=value, ..." applied: a settings field (block_size, gen_length,
    temperature, cache, unmask, ...) or a parameter of the chosen policies (threshold, ...)."""
    out = {**settings, "cache_params": dict(settings.get("cache_params", {})),
           "unmask_params": dict(settings.get("unmask_params", {}))}
    pairs = [p.strip() for p in str(changes or "").split(",") if p.strip()]
    for pair in pairs:
        key, sep, text = (part.strip() for part in pair.partition("="))
        if not sep or not key or not text:
            raise SettingsError(f"Changes to B: {pair!r} is not key=value (e.g. threshold=0.5)")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if key in ("cache", "unmask"):
            spec_named(specs, key, value)  # an unknown policy is an error here, with the names
            out[key], out[f"{key}_params"] = value, {}
        elif key in SETTING_FIELDS:
            out[key] = value
        else:
            kind = next((k for k in ("unmask", "cache")
                         if any(p["name"] == key for p in spec_named(specs, k, out[k])["params"])), None)
            if kind is None:
                raise SettingsError(f"Changes to B: {key!r} is neither a setting nor a parameter of "
                                    f"{out['cache']} or {out['unmask']}")
            out[f"{kind}_params"][key] = value
    return out


def _pick(presets: dict, name: str) -> str | None:
    return name if name in presets else next(iter(presets), None)


def _model_line(info: dict) -> str:
    return (f"**Model:** {info['name']} · {info['family']} · {info['parameters'] / 1e6:.1f}M parameters · "
            f"{info['device']} · {info['dtype']} · quantization {info['quantization']} · {info['memory_mb']} MB")


def _mark_run(grid_html: str, run_no: int, steps: int, done: bool) -> str:
    """The live grid tagged with its run number, steps drawn and whether the run ended, so a
    browser (tests, ``bench/ui_latency.py``) can tell a new run's state from the previous one's."""
    return f'<div class="dl-run" data-run="{run_no}" data-steps="{steps}" data-done="{int(done)}">{grid_html}</div>'


def _settings_line(settings: dict) -> str:
    params = ", ".join(f"{k} {v}" for k, v in sorted(settings.get("unmask_params", {}).items()))
    unmask = f"{settings['unmask']} ({params})" if params else settings["unmask"]
    return f"{settings['cache']} + {unmask} · block {settings['block_size']} · length {settings['gen_length']} · seed {settings['seed']}"


def _verdict_text(trace: dict, answer: str) -> str:
    """" — ✓ valid" and the like, when the prompt is one of the tiny task suite's."""
    judged = verdict(prompt_of(trace) or "", answer)
    if judged is None:
        return ""
    mark = "✓" if judged in ("right", "valid") else "✗"
    return f" — {mark} **{judged}**"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _run_status(trace: dict, notice: str, first_paint: float | None, done: bool) -> str:
    n = len(trace.get("steps", []))
    parts = [notice] if notice else []
    if done:
        st = trace.get("stats", {})
        answer = trace.get("text", "")
        # A step is one record of the trace; a policy that verifies runs more than one forward in it.
        forwards = st.get("nfe", sum(int(s.get("forwards") or 0) for s in trace.get("steps", [])))
        work = _count(n, "step") + ("" if forwards == n else f", {_count(forwards, 'forward')}")
        parts.append(("Stopped" if st.get("stopped") else "Done") + f": {work} ({_settings_line(trace['settings'])})."
                     f" **Answer:** {answer}{_verdict_text(trace, answer)}")
    else:
        parts.append(f"Running… step {n}")
    if first_paint is not None:
        parts.append(f"(first step painted {first_paint * 1e3:.0f} ms after the click)")
    return " ".join(parts)


def _message(exc: Exception) -> str:
    name = type(exc).__name__
    text = str(exc) or name
    return text if name.endswith(("Error", "Memory")) and "dllm" in type(exc).__module__ else f"{name}: {text}"
