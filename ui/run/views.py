"""The views of a run at one step (token grid, numbers, the three figures and their verdicts, a
mixture of experts' routed experts beside the KV view, the cost model): ``draw`` makes them, and
the Run tab's replay redraws them as the step slider or a view option moves, from the trace alone
(no model, no queue)."""
from __future__ import annotations

from typing import Any

import gradio as gr

from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import TARGET_MODELS, project

from ..lessons import acceptance, verdicts as lessons
from ..grid import tokens as grid
from .. import figures as run_figures
from ..parts import tables
from ..parts.measured_steps import measured_steps_html
from ..block.lessons import stored_verdict
from ..block.edit_lessons import edit_verdict
from ..canvas.parts import is_canvas
from ..parts.figure_style import on_screen
from ..parts.inputs import (Choice, ColorBy, DeviceName, FontScale, Fraction, KVView, PageState, StepIndex, TargetName,
                            Theme, Which, checked)
from .presenter import FONT_SCALES
from ..parts.replay import MEAN_LAYERS, numbers
from ..parts.trace_parts import read_number

KV_VIEW_DEFAULTS = {"which": "v", "kv_view": "drift"}


def draw(trace: dict, step: int | None, color_by: str, layer: str, which: str, kv_view: str, what_if: float = 0.0,
         with_plots: bool = True, font_scale: str = "1×", theme: str = "light") -> dict[str, Any]:
    """Every view of a trace at one step, by name ("grid", "numbers" and, ``with_plots``, the
    three figures, with the screen's font scale and theme): the only way views are produced."""
    steps = len(trace.get("steps", []))
    at = steps - 1 if step is None else min(int(step), steps - 1)
    upto = at if steps else None
    views = {"grid": grid_at(trace, at, color_by, what_if),
             "numbers": tables.numbers_html(numbers(trace, upto)),
             "grid_verdicts": lessons.verdicts_html(
                 [*lessons.grid_verdicts(trace, at), acceptance.acceptance_verdict(trace, at), edit_verdict(trace, at)]
                 if steps else [])}
    if with_plots:
        scale = FONT_SCALES.get(font_scale, 1.0)
        kv_told, cache_told = _kv_and_cache_verdicts(trace, at, layer, which) if steps else ([], [])
        views.update(confidence=on_screen(run_figures.confidence_heatmap(trace, upto), scale, theme),
                     kv=on_screen(run_figures.kv_heatmap(trace, layer=layer, which=which, upto_step=upto, view=kv_view),
                                  scale, theme),
                     cache=on_screen(run_figures.cache_panel(trace, upto), scale, theme),
                     kv_verdicts=lessons.verdicts_html(kv_told) + (run_figures.experts_html(trace, at) if steps else ""),
                     cache_verdicts=lessons.verdicts_html(cache_told))
    return views


def _kv_and_cache_verdicts(trace: dict, at: int, layer: str, which: str) -> tuple[list, list]:
    """The verdicts beside the KV and the cache panels; a canvas model's is its encoder's exact cache,
    beside the cache panel (it has no cache policy whose reuse or savings to check)."""
    if is_canvas(trace):
        return [], [v for v in lessons.canvas_verdicts(trace, at) if v.lesson == lessons.ENCODER_LESSON]
    return ([lessons.kv_reuse_verdict(trace, at, layer, which), stored_verdict(trace, at, layer, which)],
            [lessons.cache_saves_verdict(trace, at)])


def grid_at(trace: dict, step: int, color_by: str, what_if: float) -> str:
    """The token grid at ``step``; a what-if threshold of 0 is none."""
    return grid.token_grid_html(trace, step, color_by=color_by, what_if_threshold=float(what_if) or None)


def layer_choices(layers: int) -> dict:
    """The KV panel's layer menu: the mean over layers, then each layer; it opens on a middle
    layer, since layer 0's K/V depend on the token alone and never drift."""
    choices = [("all layers (mean)", MEAN_LAYERS)] + [(f"layer {i}", str(i)) for i in range(max(1, layers))]
    return {"choices": choices, "value": str(max(1, layers) // 2)}


def step_slider(steps: int, finished: bool, **value: int) -> dict:
    """The step slider of a trace with ``steps`` steps: 0 to the last step. A finished trace of
    one step has nothing to scrub (and a slider cannot run from 0 to 0): it is hidden. A run's
    first step leaves the range as it is until a second step gives it one."""
    if steps > 1:
        return gr.update(maximum=steps - 1, visible=True, **value)
    return gr.update(visible=False, value=0) if finished else gr.update(**({"value": 0} if value else {}))


@checked
def show_cost(trace: PageState, model: TargetName, device: DeviceName) -> str:
    """This run's G and τ projected onto a real model on a GPU (see costmodel.project), and its
    measured steps beside it (``measured_steps``)."""
    stats = (trace or {}).get("stats") or {}
    if not stats.get("nfe"):
        return "Run something to project its G and τ onto a real model."
    if min(read_number(stats.get(key), float) or 0 for key in ("mean_g", "content_tokens_per_forward")) < 0:
        return "This trace's mean G or τ is negative: positions and tokens per forward cannot be, so it is not projected."
    rows = project(stats, len(trace["prompt_ids"]), int(trace["gen_length"]), TARGET_MODELS[model], DEVICES[device])
    return tables.cost_table_html(rows, model, DEVICES[device].name, trace) + measured_steps_html(trace)


class RunReplay:
    """The Run tab's replay: its views redrawn from the trace it holds. Mixed into ``RunTab``,
    whose ``view_boxes`` (the views' components by name, see ``draw``), ``grid`` and ``live``
    (the runs going, see ``live_run``) it reads."""

    def shown(self, views: dict[str, Any]) -> dict:
        """Views by name (``draw``) as updates of their components."""
        return {self.view_boxes[name]: value for name, value in views.items()}

    @checked
    def redraw(self, request: gr.Request, trace: PageState, step: StepIndex, color_by: ColorBy, layer: Choice,
               which: Which, kv_view: KVView, what_if: Fraction = 0.0, font_scale: FontScale = "1×",
               theme: Theme = "light") -> dict:
        if not trace or not trace.get("steps"):
            return {box: gr.skip() for box in self.view_boxes.values()}  # Gradio reads {} as one value
        self.viewed(request, step, color_by, what_if)
        return self.shown(draw(trace, step, color_by, layer, which, kv_view, what_if, font_scale=font_scale,
                               theme=theme))

    @checked
    def redraw_grid(self, request: gr.Request, trace: PageState, step: StepIndex, color_by: ColorBy,
                    what_if: Fraction) -> dict:
        if not trace or not trace.get("steps"):
            return {self.grid: gr.skip()}
        self.viewed(request, step, color_by, what_if, full=False)
        return {self.grid: grid_at(trace, min(int(step), len(trace["steps"]) - 1), color_by, what_if)}
