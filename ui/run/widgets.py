"""The run's controls as components: each policy with its description and its parameters' knobs
(from the policy specs), then the settings' own knobs, whose defaults, ranges, labels and help
come from the settings' schema (``settings.knob``). Nothing here holds a number of its own."""
from __future__ import annotations

from typing import Any

import gradio as gr

from dllm_local.canvas.settings import CANVAS_KNOBS, canvas_knob
from dllm_local.settings import knob

from ..canvas.controls import REASON_NOTE, canvas_key, knob_placeholder
from ..canvas.parts import is_canvas_model
from ..block.parts import is_block_model
from .controls import (KINDS, Specs, cache_choices, fit_to_model, knobs, masked_only, model_start, policy_choices,
                       spec_named, visible_knobs)
from ..parts.inputs import number_box, number_slider


def in_words(choices: list) -> list[tuple[str, object]]:
    """(shown, value) of each choice: a menu shows words ("low confidence"), and gives the value
    the settings, the trace and the CLI know (``low_confidence``)."""
    return [(choice.replace("_", " ") if isinstance(choice, str) else str(choice), choice) for choice in choices]


def knob_widget(param: dict, value: Any, visible: bool, elem_id: str) -> gr.Component:
    """The component for one policy parameter (a ``Param.to_dict()``): a dropdown for choices, a
    checkbox for a flag, a slider where the spec gives the page a range, else a number box. An
    optional parameter gets a text box that may be left empty (None): a number box without a value
    would be a required argument of the page's API, so ``/run`` could not be called with a prompt alone."""
    common = {"label": param["label"], "info": param["help"], "visible": visible, "elem_id": elem_id}
    if param["choices"]:
        return gr.Dropdown(in_words(param["choices"]), value=value, **common)
    if param["type"] == "bool":
        return gr.Checkbox(value, **common)
    if param["type"] == "str" or param["optional"]:
        return gr.Textbox("" if value is None else value, placeholder="empty: None" if param["optional"] else None,
                          **common)
    if param["slider"]:
        low, high, step = param["slider"]
        return number_slider(low, high, value, step=step, **common)
    return number_box(value, precision=0 if param["type"] == "int" else None, **common)


def policy_knobs(specs: Specs, kind: str, values: dict, shown: dict[str, bool]) -> dict[str, gr.Component]:
    """One component per knob of ``kind`` (see ``controls.knobs``), by control name, set to
    ``values`` and visible where ``shown`` says. Call it inside a Blocks."""
    names = [param["name"] for param in knobs(specs).values()]
    # An element id is the parameter's name, prefixed by its kind where both kinds have that name.
    ids = {key: (key if names.count(param["name"]) > 1 else param["name"]).replace(".", "-").replace("_", "-")
           for key, param in knobs(specs, kind).items()}
    return {key: knob_widget(param, values[key], shown[key], ids[key]) for key, param in knobs(specs, kind).items()}


def setting_widget(name: str, value: Any, step: float | None = None, **options: Any) -> gr.Component:
    """The component for the setting ``name``, labelled, explained and bounded by its knob: a
    checkbox for a flag; a menu of its choices; with a ``step``, a slider from its low bound to its
    knob's ``top`` (else its high bound); else a box of whole numbers within its bounds."""
    spec = knob(name)
    common = {"label": spec.label, "info": spec.help, "elem_id": name.replace("_", "-"), **options}
    if isinstance(spec.default, bool):
        return gr.Checkbox(value, **common)
    if spec.choices:
        return gr.Dropdown(list(spec.choices), value=value, **common)
    if step is None:
        return number_box(value, precision=0, minimum=spec.low, maximum=spec.high, **common)
    return number_slider(spec.low, spec.high if spec.top is None else spec.top, value, step=step, **common)


def canvas_knob_widgets(values: dict, canvas: bool, model: dict) -> dict[str, gr.Component]:
    """A box per canvas knob (``canvas_settings.CANVAS_KNOBS``), by control name, set to
    ``values`` and shown while a canvas model is loaded (``canvas``). A box left empty is the
    checkpoint's own value (``model``: the loaded model's info says it): text, which ``Settings`` reads as the
    number the knob asks for (and within its bounds, or says why not)."""
    widgets = {}
    for name in CANVAS_KNOBS:
        label, help_ = canvas_knob(name)
        widgets[canvas_key(name)] = gr.Textbox(values[canvas_key(name)], label=label, info=help_, visible=canvas,
                                               placeholder=knob_placeholder(model, name),
                                               elem_id=f"canvas-{name.replace('_', '-')}")
    return widgets


def run_controls(specs: Specs, start: dict, model: dict) -> tuple[dict[str, gr.Component], dict[str, gr.Markdown],
                                                                  gr.Markdown, gr.Markdown]:
    """The run's controls set to ``start`` (control values, see ``controls.controls_from_settings``),
    laid out where it is called (inside a Blocks), for the loaded ``model`` (its info): for a canvas
    model its own knobs shown, the masked models' controls disabled; for a block model its cache
    choices, its block cache and trained block to start at; by control name; each policy's
    description box, by kind; the box for the generation length's notice; and the line saying why
    a canvas model's controls are disabled."""
    # A block model starts at its block cache and trained block; a masked model where its preset says.
    start = {**start, **model_start(model)} if is_block_model(model) else fit_to_model(start, specs, model)
    shown, canvas = visible_knobs(start["cache"], start["unmask"], specs), is_canvas_model(model)
    canvas_reason = gr.Markdown(REASON_NOTE, visible=canvas, elem_id="canvas-reason", elem_classes="policy-info")
    controls: dict[str, gr.Component] = {}
    policy_info: dict[str, gr.Markdown] = {}
    for kind in KINDS:
        with gr.Group():  # one box per policy: its choice, what it does, its knobs
            choices = cache_choices(specs, model) if kind == "cache" else policy_choices(specs, kind)
            controls[kind] = gr.Dropdown(choices, value=start[kind], label=knob(kind).label,
                                         info=knob(kind).help, elem_id=kind)
            policy_info[kind] = gr.Markdown(spec_named(specs, kind, start[kind])["description"],
                                            elem_id=f"{kind}-info", elem_classes="policy-info")
            controls.update(policy_knobs(specs, kind, start, shown))
    controls["block_size"] = setting_widget("block_size", start["block_size"], step=1)
    controls["gen_length"] = setting_widget("gen_length", start["gen_length"], step=1)
    length_notice = gr.Markdown("", elem_id="length-notice")
    controls["steps"] = setting_widget("steps", start["steps"], step=1, visible=shown["steps"])
    with gr.Row():
        controls["temperature"] = setting_widget("temperature", start["temperature"], step=0.1)
        controls["seed"] = setting_widget("seed", start["seed"])
    controls["exact_drift"] = setting_widget("exact_drift", start["exact_drift"])
    controls["forward_mode"] = setting_widget("forward_mode", start["forward_mode"])
    controls.update(canvas_knob_widgets(start, canvas, model))
    for name in masked_only(specs):  # read as the page is put together (Blocks' config), not before
        controls[name].interactive = not canvas
    return controls, policy_info, length_notice, canvas_reason
