"""A canvas model's confidence view (DiffusionGemma): the entropy of every canvas position step by
step, the positions the sampler kept, and beside each row the two rules entropy drives: the
stopping rule (mean entropy against its threshold) and the sampler's bound."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..canvas.parts import canvas_rules
from ..parts.figure_style import message_figure, styled
from ..parts.replay import Trace, answer_length, prompt_len, steps_upto
from .axes import EMPTY_MESSAGE, NAN, cell_gaps, mark_column, mark_size, position_axis, step_axis

CAPTION = ("Each row is one step of a canvas (one decoder pass): colour is the entropy of each canvas position's "
           "distribution, bright where the model is sure (low entropy). Dots: the positions whose sample the sampler "
           "kept; it keeps the lowest-entropy ones while their entropies, less the largest, sum to at most the entropy "
           "bound, and redraws the rest at random. Right: the mean entropy against the stopping rule's threshold (a "
           "canvas ends early once it is below and the draft is stable) and the kept entropies' sum against the "
           "bound. Left: ● the step that ended its canvas early, ○ a stable draft that was not confident yet.")
RULES_COLUMN = (0.70, 1.0)  # the part of the width the rules' column takes, right of the grid and its colour bar
GRID_RIGHT = 0.56  # where the grid ends; its colour bar stands between it and the rules' column
DOTS_UP_TO = 4.0  # the kept samples are dotted while a cell is at least this many pixels tall: else hover says


def kept_sum(canvas: dict) -> float:
    """What the sampler bounds: the entropies of the positions it kept, less the largest of them."""
    start = int(canvas["start"])
    kept = [float(canvas["entropy"][int(p) - start]) for p in canvas["accepted"]]
    return sum(kept) - max(kept, default=0.0)


def entropy_grid(trace: Trace, steps: list[dict]) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """[steps, answer positions] of entropy, NaN outside each step's canvas, and of the sampler's
    decision in words; and the (answer position, step) of every kept sample."""
    P, n = prompt_len(trace), answer_length(trace)
    z = np.full((len(steps), n), NAN, dtype=np.float32)
    decided = np.full((len(steps), n), "", dtype=object)
    kept_x, kept_y = [], []
    for i, record in enumerate(steps):
        canvas = record["canvas"]
        first = int(canvas["start"]) - P
        low, high = max(0, first), min(n, first + len(canvas["entropy"]))  # the part of the canvas in the answer
        if low < high:
            z[i, low:high] = canvas["entropy"][low - first:high - first]
            decided[i, low:high] = "renoised (redrawn at random)"
        decided[i, [int(p) - P for p in canvas["accepted"] if 0 <= int(p) - P < n]] = "kept by the sampler"
        kept_x += [int(p) - P for p in canvas["accepted"]]
        kept_y += [i] * len(canvas["accepted"])
    return z, decided, kept_x, kept_y


def canvas_entropy_heatmap(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """y = step, x = answer position, z = entropy of the canvas refined at that step."""
    title = "Entropy per position and the stopping rule"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    n = answer_length(trace)
    z, decided, kept_x, kept_y = entropy_grid(trace, steps)
    top = max(1e-3, float(np.nanmax(z)))
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=np.arange(n), y=np.arange(len(steps)), zmin=0, zmax=top, colorscale="Viridis", reversescale=True,
        name="entropy", hoverongaps=False, **cell_gaps(n, len(steps)), customdata=decided,
        colorbar={"title": {"text": "entropy"}, "thickness": 12, "x": GRID_RIGHT + 0.02, "xanchor": "left"},
        hovertemplate="pos %{x} · step %{y}<br>entropy %{z:.3f}<br>%{customdata}<extra></extra>"))
    if mark_size(6, n, len(steps), share=0.4) >= DOTS_UP_TO:
        fig.add_trace(go.Scatter(
            x=kept_x, y=kept_y, mode="markers", name="kept by the sampler", hoverinfo="skip",
            marker={"symbol": "circle", "color": "white", "size": mark_size(6, n, len(steps), share=0.4),
                    "line": {"color": "#222", "width": 1}}))
    _stop_marks(fig, steps)
    _canvas_starts(fig, steps, n)
    position_axis(fig, n)
    fig.update_layout(xaxis={"domain": [fig.layout.xaxis.domain[0], GRID_RIGHT]})
    step_axis(fig, len(steps), title="step (1 decoder pass each)")
    _rules_column(fig, trace, steps)
    return styled(fig, title)


def _stop_marks(fig: go.Figure, steps: list[dict]) -> None:
    """Left of each row: ● where the stopping rule ended the canvas, ○ where the draft was stable
    but the canvas not yet confident."""
    column, size = mark_column(fig), mark_size(11, None, len(steps), share=0.75)
    for name, symbol, rows in (
            ("ended early (stable and confident)", "circle",
             [i for i, s in enumerate(steps) if s["canvas"]["finished"]]),
            ("stable, not confident", "circle-open",
             [i for i, s in enumerate(steps) if s["canvas"]["stable"] and not s["canvas"]["finished"]])):
        fig.add_trace(go.Scatter(
            x=[0] * len(rows), y=rows, xaxis=column, mode="markers", name=name, cliponaxis=False,
            hovertext=[f"step {i}: {name}" for i in rows], hoverinfo="text",
            marker={"symbol": symbol, "size": size, "color": "#1a9850", "line": {"color": "#1a9850", "width": 2}}))


def _canvas_starts(fig: go.Figure, steps: list[dict], n: int) -> None:
    """A line above the first step of each canvas after the first: where the decoder moved on."""
    for i in range(1, len(steps)):
        if steps[i]["canvas"]["canvas"] != steps[i - 1]["canvas"]["canvas"]:
            fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=i - 0.5, y1=i - 0.5,
                          line={"color": "#111", "width": 2})


def _rules_column(fig: go.Figure, trace: Trace, steps: list[dict]) -> None:
    """Right of the grid, on its step axis: per step the mean entropy (the stopping rule's) and
    the kept entropies less the largest (the sampler's), each with its threshold as a dashed line."""
    rows = np.arange(len(steps))
    mean = [float(s["canvas"]["mean_entropy"]) for s in steps]
    sums = [kept_sum(s["canvas"]) for s in steps]
    threshold = canvas_rules(trace).confidence_threshold
    bound = float(steps[-1]["canvas"]["entropy_bound"])
    for name, values, colour in (("mean entropy (stopping rule)", mean, "#e4572e"),
                                 ("kept entropies less the largest (sampler)", sums, "#3d6aa6")):
        fig.add_trace(go.Scatter(x=values, y=rows, xaxis="x2", mode="lines+markers", name=name,
                                 line={"color": colour, "width": 1.5}, marker={"size": 5, "color": colour},
                                 hovertemplate=f"step %{{y}}: {name} %{{x:.3f}}<extra></extra>"))
    edge = [-0.5, len(steps) - 0.5]
    lines = [(bound, f"entropy bound {bound:g}", "#3d6aa6")]
    if threshold is not None:
        lines.append((threshold, f"confident below {threshold:g}", "#e4572e"))
    for x, name, colour in lines:
        fig.add_trace(go.Scatter(x=[x, x], y=edge, xaxis="x2", mode="lines", name=name, hoverinfo="name",
                                 line={"color": colour, "dash": "dash", "width": 1.5}))
    right = max([*mean, *sums, *(x for x, _, _ in lines)]) * 1.08 or 1.0
    fig.update_layout(xaxis2={"domain": list(RULES_COLUMN), "anchor": "y", "range": [0, right],
                              "title": {"text": "entropy (nats)"}, "nticks": 4, "zeroline": False})
