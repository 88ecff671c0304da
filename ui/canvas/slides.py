"""A canvas model's grid as slide chips (``slides.grid_svg``): each position's draft after the
step, coloured as the page's canvas grid colours it, outlined as the sampler decided at that step
(kept: black, renoised: dashed grey), the drafts that moved marked in orange, and the canvases not
started yet as empty grey chips."""
from __future__ import annotations

from .parts import canvas_state_at
from .views import box_colour
from ..grid.ends import css, text_colour, token_label
from ..parts.trace_parts import Trace

KEPT, RENOISED, MOVED = "#111111", "#888888", "#e4572e"


def canvas_chips(trace: Trace, step: int, color_by: str) -> tuple[list[dict], int, str]:
    """The chips, the step shown (``step`` within the run) and the slide's head line (the step,
    the canvas refined, what the sampler did)."""
    state = canvas_state_at(trace, step)
    last = max(1, len(trace.get("steps") or []) - 1)
    chips = []
    for p, token in enumerate(state.ids):
        if token is None:
            chips.append({"label": "·", "pos": str(p), "fill": "#f0f0f0", "ink": "#999"})
            continue
        rgb = box_colour(color_by, state, p, last)
        chip = {"label": token_label(trace, token), "pos": str(p), "fill": css(rgb), "ink": text_colour(rgb)}
        if state.canvas_of[p] == state.current:
            kept = p in state.accepted
            chip.update(stroke=MOVED if p in state.changed else KEPT if kept else RENOISED, dashed=not kept)
        chips.append(chip)
    if state.current is None:
        return chips, state.step, "before any step"
    head = (f"after step {state.step} · canvas {state.current + 1}: {len(state.accepted)} kept, "
            f"{len(state.renoised)} renoised, {len(state.changed)} moved")
    return chips, state.step, head
