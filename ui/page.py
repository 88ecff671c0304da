"""The playground page: Gradio Blocks over a ``dllm_local.session.Session``. No torch here."""
from __future__ import annotations

import itertools
import json
import tempfile
import time
from pathlib import Path

import gradio as gr

from . import plots
from .controls import ALL_KNOBS, controls_from_settings, settings_from_controls, visible_knobs

CACHES = ["none", "prefix", "dual", "freecache", "adaptive"]
UNMASKS = ["fixed", "threshold", "factor", "guided", "self_verify"]
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
CSS = """
.tok-grid {line-height: 2.1em}
#status {min-height: 1.5em}
.caption {color: #666; font-size: 0.85em; margin-top: -6px}
"""


def throttled(events, every: float = REDRAW_EVERY_S, page_share: float = PAGE_SHARE):
    """Fold session events into a growing trace; yield ``(trace, done)`` at most every ``every``
    seconds, and always the first step (it sets the click-to-paint latency) and the final state.

    The gap between redraws also grows with what a redraw costs (the time the consumer takes
    before asking for more), so drawing takes at most ``page_share`` of the run: the engine has
    a process of its own, but on a small machine the page and the browser share its cores.
    """
    live: dict = {}
    last, gap = 0.0, every
    for event in events:
        if "start" in event:
            live = event["start"]
        elif "step" in event:
            live["steps"].append(event["step"])
            live["vocab"].update(event["vocab"])
        else:
            live = event["trace"]
        done = "trace" in event
        first_step = "step" in event and len(live["steps"]) == 1
        if done or first_step or time.perf_counter() - last >= gap:
            yielded = time.perf_counter()
            yield live, done
            last = time.perf_counter()
            gap = max(every, (last - yielded) * (1 - page_share) / page_share)


def _views(trace: dict, step: int | None, color_by: str, layer: int, which: str, kv_view: str,
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
                   plots.kv_heatmap(trace, layer=int(layer), which=which, upto_step=upto, view=kv_view),
                   plots.cache_panel(trace, upto)]
    return (plots.token_grid_html(trace, at, color_by=color_by), plots.numbers_html(plots.numbers(trace, upto)), *figures)


def build(session, presets: dict, preset_problems: list[str], default_preset: str | None = None) -> gr.Blocks:
    default_preset = default_preset if default_preset in presets else next(iter(presets), None)
    start = controls_from_settings(presets[default_preset]["settings"]) if default_preset else controls_from_settings({})
    start_prompt = presets[default_preset].get("prompt", TINY_EXAMPLES[0]) if default_preset else TINY_EXAMPLES[0]
    n_layers = session.info().get("layers", 1)
    quant_ok = {name: ok for name, ok, _ in session.quantization_options()}
    quant_reason = next((r for _, ok, r in session.quantization_options() if not ok), "")

    with gr.Blocks(title="dllm-local") as page:
        trace_state = gr.State({})
        gr.Markdown("# dllm-local\nAccelerated diffusion-LLM decoding, live, step by step. "
                    "Timings are model time measured with device synchronisation; page work is counted apart.")
        model_line = gr.Markdown(_model_line(session.info()), elem_id="model-line")
        if preset_problems:
            gr.Markdown("\n".join(f"- ⚠ {p}" for p in preset_problems), elem_id="preset-problems")
        with gr.Tabs() as tabs:
            with gr.Tab("Run", id="run"):
                with gr.Row():
                    with gr.Column(scale=2, min_width=320):
                        preset = gr.Dropdown(list(presets), value=default_preset, label="Preset", elem_id="preset")
                        preset_info = gr.Markdown(presets[default_preset]["description"] if default_preset else "")
                        prompt = gr.Textbox(start_prompt, label="Prompt", lines=3, elem_id="prompt")
                        gr.Examples([[e] for e in TINY_EXAMPLES], inputs=[prompt], label="Examples for the tiny model")
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        status = gr.Markdown("", elem_id="status")
                        with gr.Row():
                            cache = gr.Dropdown(CACHES, value=start["cache"], label="Cache policy", elem_id="cache")
                            unmask = gr.Dropdown(UNMASKS, value=start["unmask"], label="Unmasking policy", elem_id="unmask")
                        threshold = gr.Slider(0.05, 1.0, start["threshold"], step=0.05, label="Threshold τ", elem_id="threshold")
                        block_size = gr.Slider(4, 128, start["block_size"], step=4, label="Block size", elem_id="block-size")
                        gen_length = gr.Slider(16, 512, start["gen_length"], step=16, label="Generation length", elem_id="gen-length")
                        steps = gr.Slider(1, 512, start["steps"], step=1, label="Steps (fixed schedule)", elem_id="steps")
                        factor = gr.Slider(0.1, 4.0, start["factor"], step=0.1, label="Factor f")
                        refresh_every = gr.Slider(0, 32, start["refresh_every"], step=1, label="Refresh every N steps (0: block starts only)")
                        floor = gr.Slider(0.0, 1.0, start["floor"], step=0.05, label="Adaptive: confidence floor")
                        budget = gr.Number(start["budget"], label="Adaptive: cache budget (positions, 0 = none)", precision=0)
                        rho = gr.Slider(0.05, 1.0, start["rho"], step=0.05, label="Self-verify: conflict ρ")
                        window = gr.Slider(1, 8, start["window"], step=1, label="Self-verify: window")
                        guider_rule = gr.Radio(["exact", "topk", "relative"], value=start["guider_rule"], label="Guider acceptance rule")
                        with gr.Row():
                            temperature = gr.Slider(0.0, 2.0, start["temperature"], step=0.1, label="Temperature")
                            seed = gr.Number(start["seed"], label="Seed", precision=0)
                        exact_drift = gr.Checkbox(start["exact_drift"], label="Exact-drift diagnostic (a full forward each step, cost reported apart)")
                        with gr.Accordion("Model", open=False):
                            model_pick = gr.Dropdown([n for n, _, _ in session.model_options()], value=session.info()["name"],
                                                     label="Model", allow_custom_value=True)
                            quant = gr.Radio(["none", "8bit", "4bit"], value="none", label="Quantization",
                                             info=quant_reason and f"8-bit and 4-bit: {quant_reason}",
                                             interactive=quant_ok.get("4bit", False))
                            load_btn = gr.Button("Load model")
                        with gr.Row():
                            export_btn = gr.DownloadButton("Export trace (JSON)", elem_id="export-btn")
                            import_file = gr.UploadButton("Import trace", file_types=[".json"], elem_id="import-btn")
                    with gr.Column(scale=5):
                        with gr.Row():
                            scrub = gr.Slider(0, 1, 0, step=1, label="Step", elem_id="scrubber")
                            follow = gr.Checkbox(True, label="Follow live", scale=0)
                            color_by = gr.Radio(["step", "confidence"], value="step", label="Colour tokens by", scale=0)
                        grid = gr.HTML(elem_id="token-grid")
                        gr.Markdown(plots.CAPTIONS["token_grid"], elem_classes="caption")
                        nums = gr.HTML(elem_id="numbers")
                        with gr.Accordion("Cost model (seed 002): predicted step floor vs measured", open=False):
                            cost_device = gr.Dropdown(session.cost_devices(), value="H100", label="GPU for the prediction")
                            cost_html = gr.HTML(elem_id="cost-model")
                        # Each plot starts with its empty figure: the browser loads the plotting
                        # library with the page, not on the first run's first step.
                        conf_plot = gr.Plot(plots.confidence_heatmap({}), label="Confidence", elem_id="conf-plot")
                        gr.Markdown(plots.CAPTIONS["confidence"], elem_classes="caption")
                        with gr.Row():
                            layer = gr.Slider(0, max(0, n_layers - 1), 0, step=1, label="Layer")
                            which = gr.Radio(["k", "v"], value="v", label="K or V")
                            kv_view = gr.Radio(["drift", "true_drift", "cache_error"], value="drift", label="KV view")
                        kv_plot = gr.Plot(plots.kv_heatmap({}, which="v"), label="KV cosine similarity", elem_id="kv-plot")
                        gr.Markdown(plots.CAPTIONS["kv"], elem_classes="caption")
                        cache_plot = gr.Plot(plots.cache_panel({}), label="Cache", elem_id="cache-plot")
                        gr.Markdown(plots.CAPTIONS["cache"], elem_classes="caption")
            with gr.Tab("Compare", id="compare"):
                gr.Markdown("Two settings on the same prompt and seed, run one after the other so each run's time is its own.")
                with gr.Row():
                    preset_a = gr.Dropdown(list(presets), value=_pick(presets, "LLaDA baseline"), label="Settings A", elem_id="preset-a")
                    preset_b = gr.Dropdown(list(presets), value=default_preset, label="Settings B", elem_id="preset-b")
                cmp_prompt = gr.Textbox(start_prompt, label="Prompt", lines=2, elem_id="cmp-prompt")
                cmp_btn = gr.Button("Run both", variant="primary", elem_id="cmp-btn")
                cmp_status = gr.Markdown("", elem_id="cmp-status")
                with gr.Row():
                    grid_a = gr.HTML(elem_id="grid-a")
                    grid_b = gr.HTML(elem_id="grid-b")
                cmp_table = gr.HTML(elem_id="cmp-table")
            with gr.Tab("Tune", id="tune"):
                gr.Markdown("Sweep threshold × block size on one of the tiny model's tasks: accuracy against speed, "
                            "the Pareto frontier in red. Click a table row to load its settings into the Run tab.")
                with gr.Row():
                    tune_preset = gr.Dropdown(list(presets), value=default_preset, label="Base settings", elem_id="tune-preset")
                    tune_task = gr.Dropdown(["arithmetic", "poker", "sums", "records"], value="arithmetic", label="Task")
                    tune_n = gr.Number(20, label="Problems", precision=0, elem_id="tune-n")
                with gr.Row():
                    tune_thresholds = gr.Textbox("0.5,0.7,0.8,0.9", label="Thresholds", elem_id="tune-thresholds")
                    tune_blocks = gr.Textbox("8,16,32", label="Block sizes", elem_id="tune-blocks")
                    tune_gen = gr.Number(64, label="Generation length", precision=0)
                with gr.Row():
                    tune_btn = gr.Button("Run sweep", variant="primary", elem_id="tune-btn")
                    tune_stop = gr.Button("Cancel", variant="stop", elem_id="tune-stop")
                tune_status = gr.Markdown("", elem_id="tune-status")
                tune_plot = gr.Plot(elem_id="tune-plot")
                tune_table = gr.Dataframe(headers=["threshold", "block_size", "accuracy", "tok/s", "NFE", "pareto"],
                                          interactive=False, elem_id="tune-table")
                tune_state = gr.State({})

        knob_widgets = {"steps": steps, "threshold": threshold, "factor": factor, "refresh_every": refresh_every,
                        "floor": floor, "budget": budget, "rho": rho, "window": window, "guider_rule": guider_rule}
        control_names = ["gen_length", "block_size", "steps", "temperature", "seed", "cache", "unmask", "refresh_every",
                         "floor", "budget", "threshold", "factor", "rho", "window", "guider_rule", "exact_drift"]
        control_widgets = [gen_length, block_size, steps, temperature, seed, cache, unmask, refresh_every, floor,
                           budget, threshold, factor, rho, window, guider_rule, exact_drift]
        view_inputs = [color_by, layer, which, kv_view]
        view_outputs = [grid, nums, conf_plot, kv_plot, cache_plot]

        def show_knobs(c, u):
            vis = visible_knobs(c, u)
            return [gr.update(visible=vis[k]) for k in ALL_KNOBS]

        for w in (cache, unmask):
            w.change(show_knobs, [cache, unmask], [knob_widgets[k] for k in ALL_KNOBS], queue=False)
        page.load(show_knobs, [cache, unmask], [knob_widgets[k] for k in ALL_KNOBS], queue=False)

        def apply_preset(name):
            p = presets[name]
            values = controls_from_settings(p["settings"])
            return [p["description"], p.get("prompt", gr.update())] + [values[n] for n in control_names]

        preset.change(apply_preset, [preset], [preset_info, prompt] + control_widgets, queue=False)

        run_numbers = itertools.count(1)  # tags the live grid so a browser can tell runs apart
        # Gradio's queue position and timer on the status line only: overlays on the grid and the
        # plots would cover the live views and cost the browser CPU at every redraw.
        RUN_PROGRESS = {"show_progress": "minimal", "show_progress_on": [status]}

        def run(prompt_text, trace, following, color, lay, wh, view, *values):
            v = dict(zip(control_names, values))
            try:
                settings, notice = settings_from_controls(v)
            except (ValueError, TypeError) as exc:
                yield _status_only(f"⚠ {exc}", trace)
                return
            clicked = time.perf_counter()
            run_no = next(run_numbers)
            live: dict = {}
            first_paint, plots_drawn = None, clicked
            try:
                for live, done in throttled(session.run(prompt_text, settings)):
                    n = len(live["steps"])
                    if first_paint is None and n:
                        first_paint = time.perf_counter() - clicked
                    msg = _run_status(live, notice, first_paint, done=done)
                    if following:
                        # The grid at every redraw; the plots, far dearer to draw, less often.
                        with_plots = done or time.perf_counter() - plots_drawn >= PLOTS_EVERY_S
                        plots_drawn = time.perf_counter() if with_plots else plots_drawn
                        grid_html, *others = _views(live, None, color, lay, wh, view, with_plots=with_plots)
                        views = (_mark_run(grid_html, run_no, n, done), *others)
                        scrubber = gr.update(maximum=max(1, n - 1), value=max(0, n - 1))
                    else:  # the user is looking at an earlier step: keep it, let the slider reach further
                        views, scrubber = [gr.update()] * 5, gr.update(maximum=max(1, n - 1))
                    yield (live, *views, scrubber, msg, gr.update(value=int(settings["gen_length"])))
            except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
                yield _status_only(f"⚠ {_message(exc)}", live or trace)

        def _status_only(msg, trace):
            return (trace, *[gr.update()] * 5, gr.update(), msg, gr.update())

        run_event = run_btn.click(
            run, [prompt, trace_state, follow, *view_inputs, *control_widgets],
            [trace_state, *view_outputs, scrub, status, gen_length],
            concurrency_limit=1, concurrency_id="model", api_name="run", **RUN_PROGRESS,
        )
        submit_event = prompt.submit(run, [prompt, trace_state, follow, *view_inputs, *control_widgets],
                      [trace_state, *view_outputs, scrub, status, gen_length], concurrency_limit=1,
                      concurrency_id="model", api_visibility="private", **RUN_PROGRESS)

        def stop():
            return "Stopping after the current step…" if session.stop() else "Nothing is running."

        stop_btn.click(stop, None, [status], queue=False)

        def redraw(trace, step, color, lay, wh, view):
            if not trace or not trace.get("steps"):
                return [gr.update()] * 5
            return _views(trace, step, color, lay, wh, view)

        scrub.input(redraw, [trace_state, scrub, *view_inputs], view_outputs, queue=False)
        for w in view_inputs:
            w.change(redraw, [trace_state, scrub, *view_inputs], view_outputs, queue=False)

        def import_trace(file, color, lay, wh, view):
            try:
                trace = json.loads(Path(file if isinstance(file, str) else file.name).read_text())
                plots.check_trace(trace)
            except (ValueError, KeyError, TypeError, OSError) as exc:
                return (gr.update(), *[gr.update()] * 5, gr.update(), f"⚠ could not import that file: {exc}", gr.update())
            n = len(trace["steps"])
            return (trace, *_views(trace, None, color, lay, wh, view), gr.update(maximum=max(1, n - 1), value=n - 1),
                    f"Replaying an imported trace: {n} steps, {trace['settings']['cache']} + {trace['settings']['unmask']}. "
                    f"Move the step slider.", _export_file(trace))

        import_file.upload(import_trace, [import_file, *view_inputs], [trace_state, *view_outputs, scrub, status, export_btn])

        def load_model(name, q, progress=gr.Progress()):
            progress((0, None), desc=f"loading {name}", unit="s")
            try:
                # The model loads in the engine process; the page shows the seconds it has taken.
                info = session.switch_model(name, q, on_wait=lambda s: progress((int(s), None), desc=f"loading {name}",
                                                                                unit="s"))
            except Exception as exc:  # noqa: BLE001
                return gr.update(), f"⚠ {_message(exc)}", gr.update()
            return _model_line(info), f"Loaded {info['name']}.", gr.update(maximum=max(0, info["layers"] - 1), value=0)

        load_btn.click(load_model, [model_pick, quant], [model_line, status, layer], concurrency_limit=1,
                       concurrency_id="model")

        def run_compare(name_a, name_b, prompt_text):
            results = {}
            grids = {"a": "", "b": ""}
            for key, name in (("a", name_a), ("b", name_b)):
                settings = dict(presets[name]["settings"], seed=0)
                try:
                    for live, _ in throttled(session.run(prompt_text, settings)):
                        grids[key] = plots.token_grid_html(live, len(live["steps"]) - 1)
                        yield grids["a"], grids["b"], "", f"Running {key.upper()}: {name}…"
                    results[key] = live
                except Exception as exc:  # noqa: BLE001
                    yield grids["a"], grids["b"], "", f"⚠ {_message(exc)}"
                    return
            yield grids["a"], grids["b"], plots.compare_html(plots.compare(results["a"], results["b"])), "Done."

        cmp_btn.click(run_compare, [preset_a, preset_b, cmp_prompt], [grid_a, grid_b, cmp_table, cmp_status],
                      concurrency_limit=1, concurrency_id="model")
        def show_cost(trace, device):
            if not trace or not trace.get("stats", {}).get("nfe"):
                return "Run something to compare its measured step time with the prediction."
            try:
                return plots.cost_table_html(session.cost_model(trace, device), device)
            except Exception as exc:  # noqa: BLE001
                return f"⚠ {_message(exc)}"

        cost_device.change(show_cost, [trace_state, cost_device], [cost_html], queue=False)

        def export_ready(trace):
            # After the final state is drawn: writing a long trace is not what the user waits to see.
            return _export_file(trace) if trace.get("steps") else gr.update()

        for event in (run_event, submit_event):
            event.then(export_ready, [trace_state], [export_btn]).then(show_cost, [trace_state, cost_device], [cost_html])

        def run_sweep(preset_name, task, n, thresholds, blocks, gen, progress=gr.Progress()):
            try:
                axes = {"threshold": _numbers(thresholds, float), "block_size": _numbers(blocks, int)}
                base = dict(presets[preset_name]["settings"], gen_length=int(gen), trace="off", exact_drift=False)
                if base.get("unmask") not in ("threshold", "self_verify"):
                    base.update(unmask="threshold", unmask_params={"threshold": 0.9})
                events = session.sweep(task, int(n), base, axes)
                report: dict = {"axes": axes, "rows": []}
                for event in events:
                    if "progress" in event:
                        p = event["progress"]
                        report["rows"].append({**p["row"], "point": p["point"], "pareto": False})
                        progress(p["done"] / p["total"], desc=f"point {p['done']}/{p['total']}")
                        yield report, plots.sweep_figure(report), plots.sweep_table(report), f"Point {p['done']}/{p['total']}…"
                    else:
                        report = event["report"]
                word = "Cancelled" if report["cancelled"] else "Done"
                yield report, plots.sweep_figure(report), plots.sweep_table(report), f"{word}: {len(report['rows'])} points."
            except Exception as exc:  # noqa: BLE001
                yield gr.update(), gr.update(), gr.update(), f"⚠ {_message(exc)}"

        tune_btn.click(run_sweep, [tune_preset, tune_task, tune_n, tune_thresholds, tune_blocks, tune_gen],
                       [tune_state, tune_plot, tune_table, tune_status], concurrency_limit=1, concurrency_id="model")
        tune_stop.click(stop, None, [tune_status], queue=False)

        def load_point(report, evt: gr.SelectData):
            rows = report.get("rows") or []
            if evt.index is None or evt.index[0] >= len(rows):
                return [gr.update()] * (len(control_widgets) + 1)
            row = rows[evt.index[0]]
            values = controls_from_settings(row["settings"])
            return [gr.Tabs(selected="run")] + [values[n] for n in control_names]

        tune_table.select(load_point, [tune_state], [tabs] + control_widgets, queue=False)
    page.run_event = run_event
    return page


def _numbers(text: str, kind) -> list:
    values = [kind(v) for v in str(text).replace(" ", "").split(",") if v]
    if not values:
        raise ValueError(f"no values in {text!r}")
    return values


def _export_file(trace: dict) -> str:
    """The trace as a JSON file the Export button hands out."""
    path = Path(tempfile.mkdtemp(prefix="dllm-trace-")) / "dllm-trace.json"
    path.write_text(json.dumps(trace))
    return str(path)


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


def _run_status(trace: dict, notice: str, first_paint: float | None, done: bool) -> str:
    n = len(trace.get("steps", []))
    parts = [notice] if notice else []
    if done:
        st = trace.get("stats", {})
        answer = trace.get("text", "")
        parts.append(("Stopped" if st.get("stopped") else "Done") + f" in {n} steps ({_settings_line(trace['settings'])})."
                     f" **Answer:** {answer}")
    else:
        parts.append(f"Running… step {n}")
    if first_paint is not None:
        parts.append(f"(first step painted {first_paint * 1e3:.0f} ms after the click)")
    return " ".join(parts)


def _message(exc: Exception) -> str:
    name = type(exc).__name__
    text = str(exc) or name
    return text if name.endswith(("Error", "Memory")) and "dllm" in type(exc).__module__ else f"{name}: {text}"
