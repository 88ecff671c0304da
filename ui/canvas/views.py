"""A canvas model's token grid and side panel (DiffusionGemma): each canvas's draft at a step, what
the sampler accepted and renoised there, what changed, and a position's draft step by step. The
masked-model grid (``grid``) and panel (``position_panel``) hand a canvas trace to these.
Trace dict in, HTML out (see ``canvas_parts`` for what a canvas step records)."""
from __future__ import annotations

import html
import math

from .parts import (CanvasState, canvas_count, canvas_ended, canvas_rules, canvas_state_at, canvas_steps, draft_history,
                    run_complete)
from ..grid.ends import BOX, CONF_STOPS, MASKED, POS, STEP_STOPS, SWATCH, attr, css, interp, text_colour, token_label
from ..parts.trace_parts import Trace, answer_length, first_end, is_end_token

ACCEPTED, RENOISED, CHANGED = "dl-canvas-accepted", "dl-canvas-renoised", "dl-canvas-changed"
# The sampler's decision as an outline inside the box, a changed draft as a bar along its foot: a box shows both.
# Black and grey, so that neither is lost on a box of either colour scale.
_ACCEPTED_STYLE = "outline:3px solid #111;outline-offset:-3px;"
_RENOISED_STYLE = "outline:2px dashed #999;outline-offset:-2px;"
_CHANGED_STYLE = "box-shadow:inset 0 -5px 0 #e4572e;"
_LABEL = ('<span class="dl-canvas-label" style="display:inline-block;margin:2px 4px;padding:1px 4px;font-size:14px;'
          'color:#555;border-left:3px solid #888;vertical-align:top;">canvas {}</span>')


def entropy_rgb(entropy: float) -> tuple[int, int, int]:
    """An entropy's colour on the confidence scale: e^-H (1 / perplexity) from red (unsure) to green
    (sure), so lower entropy reads as more confident, as a masked model's confidence does."""
    return interp(CONF_STOPS, math.exp(-max(0.0, entropy)))


def box_colour(color_by: str, state: CanvasState, p: int, last: int) -> tuple[int, int, int]:
    """A drafted position's colour: by entropy, or by the step since which its draft stands."""
    if color_by == "confidence":
        return entropy_rgb(state.entropy[p])
    return interp(STEP_STOPS, 0.1 + 0.9 * state.since[p] / max(1, last))


def _decision(state: CanvasState, trace: Trace, p: int) -> tuple[list[str], str, str]:
    """The classes, style and hover words of this step's sampler decision and draft change at ``p``."""
    if state.canvas_of[p] != state.current:
        return [], "", ""
    classes, style, words = [], "", ""
    if p in state.accepted:
        classes.append(ACCEPTED)
        style += _ACCEPTED_STYLE
        words += f" · accepted: the sampler kept its sample '{token_label(trace, state.accepted[p])}'"
    else:
        classes.append(RENOISED)
        style += _RENOISED_STYLE
        words += " · renoised: redrawn at random"
    if p in state.changed:
        classes.append(CHANGED)
        style += _CHANGED_STYLE
        words += f" · changed at step {state.step}: the draft moved"
    return classes, style, words


def _pending_box(trace: Trace, p: int, canvas: int, started: set[int]) -> str:
    """A position of a canvas not begun by the step shown; ``started``: the canvases the whole trace begins."""
    never = run_complete(trace) and canvas not in started
    title = f"pos {p} · canvas {canvas + 1}: " + ("never started (the answer ended before it)" if never
                                                  else "not started yet")
    return (f'<span class="dl-tok dl-canvas-pending" title="{attr(title)}" data-pos="{p}" '
            f'style="{BOX}{MASKED}">{POS.format(p)}▢</span>')


def _token_box(trace: Trace, state: CanvasState, p: int, color_by: str, last: int, answer_end: int | None) -> str:
    token, canvas = state.ids[p], state.canvas_of[p]
    label = token_label(trace, token)
    rgb = box_colour(color_by, state, p, last)
    classes, style, words = _decision(state, trace, p)
    classes = ["dl-tok", "dl-canvas" if canvas == state.current else "dl-canvas-done", *classes]
    style = f"{BOX}background:{css(rgb)};color:{text_colour(rgb)};{style}"
    when = "this step's draft" if canvas == state.current else "its last draft"
    title = (f"pos {p} · canvas {canvas + 1} · {when} '{label}' since step {state.since[p]} · "
             f"entropy {state.entropy[p]:.3f}{words}")
    if is_end_token(trace, token):
        style += "font-style:italic;"
        classes.append("dl-end")
        title += " · end of text" + (" (the answer ends here)" if p == answer_end else "")
    elif answer_end is not None and p > answer_end:
        style += "opacity:0.45;text-decoration:line-through;"
        classes.append("dl-after-end")
        title += " · after the end of text: the answer pads it"
    return (f'<span class="{" ".join(classes)}" title="{attr(title)}" data-pos="{p}" data-token="{token}" '
            f'style="{style}">{POS.format(p)}{html.escape(label)}</span>')


def _step_line(trace: Trace, state: CanvasState) -> str:
    """What the step shown did to its canvas, and where its stopping rule stands."""
    if state.step < 0:
        return ""
    record = trace["steps"][state.step]
    canvas, rules = record["canvas"], canvas_rules(trace)
    most = f" of {rules.max_steps}" if rules.max_steps else ""
    below = f" (confident below {rules.confidence_threshold})" if rules.confidence_threshold is not None else ""
    ended = ("; stable and confident: the stopping rule ends the canvas here" if canvas["finished"] else
             "; the canvas ends here" if canvas_ended(trace, state.step) else "")
    return (f'<div class="dl-canvas-step" style="font-size:16px;color:#333;font-weight:600;">Step {state.step}: '
            f"canvas {state.current + 1}, its step {int(record['step_in_block']) + 1}{most}: "
            f"{len(state.accepted)} accepted, {len(state.renoised)} renoised, {len(state.changed)} changed; "
            f"temperature {float(canvas['temperature']):.2f}, entropy bound {float(canvas['entropy_bound']):g}; "
            f"mean entropy {float(canvas['mean_entropy']):.3f}{below}{ended}</div>")


def _legend(trace: Trace, state: CanvasState, color_by: str, last: int) -> str:
    if color_by == "confidence":
        scale = (f'<span style="{SWATCH}background:{css(CONF_STOPS[0])}"></span>high → low entropy (more confident)'
                 f'<span style="{SWATCH}background:{css(CONF_STOPS[-1])}"></span>')
    else:
        scale = (f'<span style="{SWATCH}background:{css(interp(STEP_STOPS, 0.1))}"></span>draft since step 0 → '
                 f'step {last}<span style="{SWATCH}background:{css(interp(STEP_STOPS, 1.0))}"></span>')
    where = "before any step" if state.step < 0 else f"after step {state.step} · canvas {state.current + 1} of " \
                                                     f"{canvas_count(trace)}"
    return (f'<div class="dl-legend" style="font-size:14px;color:#444;margin-top:4px;">{where} · {scale} · '
            f'<span style="{SWATCH}{_ACCEPTED_STYLE}"></span>accepted: kept by the sampler · '
            f'<span style="{SWATCH}{_RENOISED_STYLE}"></span>renoised: redrawn at random · '
            f'<span style="{SWATCH}{_CHANGED_STYLE}"></span>changed: the draft moved this step · '
            f'<span style="{SWATCH}{MASKED}"></span>canvas not started · small numbers: answer position</div>')


def canvas_grid_html(trace: Trace, step: int, color_by: str = "step") -> str:
    """The answer region after ``step``: every canvas up to the one refined at ``step`` shows its
    latest draft (an earlier canvas its last: what joined the answer), a later canvas grey boxes.
    The canvas refined at ``step`` carries this step's sampler decision on each box (classes
    ``dl-canvas-accepted`` / ``dl-canvas-renoised``) and ``dl-canvas-changed`` where its draft moved.
    ``color_by`` "step": by the step since which the draft token stands; "confidence": by entropy."""
    state = canvas_state_at(trace, step)
    last = len(trace.get("steps") or []) - 1
    answer_end, started = first_end(trace, state.ids), set(canvas_steps(trace))
    boxes = []
    for p in range(answer_length(trace)):
        if p == 0 or state.canvas_of[p] != state.canvas_of[p - 1]:
            boxes.append(_LABEL.format(state.canvas_of[p] + 1))
        boxes.append(_pending_box(trace, p, state.canvas_of[p], started) if state.ids[p] is None
                     else _token_box(trace, state, p, color_by, last, answer_end))
    return (f'{_step_line(trace, state)}<div class="dl-grid dl-canvas-grid" style="line-height:1.2;">'
            f'{"".join(boxes)}</div>{_legend(trace, state, color_by, last)}')


# ----------------------------------------------------------------------------- the side panel

_CELL = '<td style="padding:0.05em 0.5em;">{}</td>'
_ROW = "<tr{}>" + _CELL * 5 + "</tr>"


def canvas_position_panel_html(trace: Trace, step: int, position: int) -> str:
    """The side panel of answer position ``position`` after ``step``: its draft now, and its draft
    at every step of its canvas so far (token, changed or not, accepted or renoised, entropy)."""
    state = canvas_state_at(trace, step)
    canvas = state.canvas_of[position]
    title = f"Position {position} · canvas {canvas + 1} · " + (
        "before any step" if state.step < 0 else f"after step {state.step}")
    parts = [f'<div class="dl-pp-title" style="font-size:1.3em;font-weight:700;">{html.escape(title)}</div>']
    history = draft_history(trace, state.step, position)
    if not history:
        parts.append(f'<div class="dl-pp-now">canvas {canvas + 1} has not started {"yet" if state.step >= 0 else ""}'
                     "</div>")
    else:
        now = history[-1]
        decided = "" if canvas != state.current else (" · accepted by the sampler this step" if now["kept"] is not None
                                                      else " · renoised this step")
        parts.append(f'<div class="dl-pp-now" style="margin:0.3em 0;">draft <b>{html.escape(token_label(trace, now["token"]))}'
                     f"</b> since step {state.since[position]} · entropy {now['entropy']:.3f}{decided}</div>")
        rows = [_ROW.format(' class="dl-pp-changed"' if h["changed"] else "", f"{h['step']} ({h['in_canvas']})",
                            html.escape(token_label(trace, h["token"])), "changed" if h["changed"] else "",
                            "renoised" if h["kept"] is None else
                            f"accepted ('{html.escape(token_label(trace, h['kept']))}' kept)", f"{h['entropy']:.3f}")
                for h in history]
        head = _ROW.format("", "step (of canvas)", "draft", "moved", "sampler", "entropy").replace("<td", "<th").replace("td>", "th>")
        parts.append('<div class="dl-pp-head" style="font-size:1.15em;font-weight:700;margin:0.7em 0 0.2em;">'
                     "Draft history</div>"
                     f'<table class="dl-pp-history" style="border-collapse:collapse;">{head}{"".join(rows)}</table>')
        parts.append(_cache_line(trace, state, canvas))
    return (f'<div class="dl-position-panel dl-canvas-panel" data-position="{position}" data-step="{state.step}" '
            f'style="font-size:1.1rem;line-height:1.45;">{"".join(parts)}</div>')


def _cache_line(trace: Trace, state: CanvasState, canvas: int) -> str:
    """Where the position's K/V come from: the decoder recomputes the canvas it refines at every
    step; an ended canvas was read into the encoder's cache when the next one began."""
    later = canvas_steps(trace).get(canvas + 1) or []
    if canvas == state.current:
        text = "the decoder recomputes this canvas's K/V at every step"
    elif later and later[0] <= state.step:
        text = (f"in the encoder's cache since step {later[0]} (read by every later step, never recomputed: "
                "exact by construction)")
    else:
        text = "its canvas has ended; the encoder reads it into its cache when the next canvas begins"
    return f'<div class="dl-pp-line" style="margin:0.4em 0;">{html.escape(text)}</div>'
