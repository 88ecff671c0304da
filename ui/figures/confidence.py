"""The confidence heatmap: the model's confidence at every still-masked position, step by step,
with the commits, self-verify's sent-back drafts and Fast-dLLM's Theorem 1 beside each row."""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from ..canvas.parts import is_canvas
from ..parts.figure_style import message_figure, styled
from ..parts.replay import Trace, answer_length, prompt_len, steps_upto, theorem1, token_text, visible
from .axes import EMPTY_MESSAGE, NAN, cell_gaps, mark_column, mark_size, num, position_axis, step_axis
from .canvas_entropy import canvas_entropy_heatmap

CAPTION = ("Each row is one step, not one forward: colour is the model's confidence at still-masked positions "
           "in the step, x marks a commit; a policy that commits early on bright cells saves steps. A step that also "
           "runs a verify forward (self-verify) or asks a guider still takes one row: the step axis says how many "
           "forwards a row took. Left of each row: "
           "Fast-dLLM's Theorem 1. When a step commits n tokens, all with confidence above 1 − ε, and "
           "(n+1)ε ≤ 1, greedy parallel decoding commits exactly what one-at-a-time decoding would (green "
           "dot); otherwise there is no guarantee (red cross), and the tokens may not fit together.")


def confidence_heatmap(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """y = step, x = answer position, z = confidence at still-masked positions scored that step.

    Cells that were not scored (already committed, or outside the forward) are NaN; an "x" marks
    each commit at (position, step of commit).
    """
    if is_canvas(trace):  # a canvas model scores no masks: its entropy and stopping rule instead
        return canvas_entropy_heatmap(trace, upto_step)
    title = "Confidence at masked positions"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    P, n = prompt_len(trace), answer_length(trace)
    # numpy grids: plotly validates them in one pass, lists cell by cell (the redraw's main cost);
    # float32 halves what the browser is sent and parses
    z = np.full((len(steps), n), NAN, dtype=np.float32)
    cx, cy, ctext = [], [], []
    for i, record in enumerate(steps):
        for position, conf in zip(record.get("masked_positions") or [], record.get("masked_confidence") or []):
            p = int(position) - P
            if 0 <= p < n:
                z[i, p] = num(conf)
        for position, token, conf in record.get("committed") or []:
            cx.append(int(position) - P)
            cy.append(i)
            ctext.append(f"commit '{html.escape(visible(token_text(trace, token)))}' · confidence {conf:.3f}")
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=np.arange(n), y=np.arange(len(steps)), zmin=0, zmax=1, colorscale="Viridis",
        name="confidence", hoverongaps=False, **cell_gaps(n, len(steps)),
        colorbar={"title": {"text": "conf"}, "thickness": 12},
        hovertemplate="pos %{x} · step %{y}<br>confidence %{z:.3f}<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        x=cx, y=cy, mode="markers", name="commit", hovertext=ctext, hoverinfo="text",
        marker={"symbol": "x", "color": "white", "size": mark_size(8, n, len(steps)),
                "line": {"color": "#222", "width": 1}},
    ))
    _sent_back(fig, trace, steps, n)
    _theorem1_column(fig, steps)
    position_axis(fig, n)
    step_axis(fig, len(steps), title=row_title(steps))
    return styled(fig, title)


def forwards_of(record: dict) -> int | None:
    """The forwards one step ran: the diffusion model's (its main forward and any verify forward)
    and the guider's; None for a trace that does not count them."""
    if record.get("forwards") is None:
        return None
    return int(record["forwards"]) + int(record.get("guider_forwards") or 0)


def row_title(steps: list[dict]) -> str:
    """The step axis's title: what one row is, in forwards, true of every policy (self-verify's
    steps run two forwards, a guided step asks the guider too)."""
    counts = [forwards_of(record) for record in steps]
    if None in counts:
        return "step"
    low, high = min(counts), max(counts)
    if low == high:
        return f"step ({low} forward{'s' if low > 1 else ''} each)"
    return f"step ({low}–{high} forwards each)"


def _sent_back(fig: go.Figure, trace: Trace, steps: list[dict], n: int) -> None:
    """Red squares on the drafts self-verify sent back to mask, where there are any."""
    P = prompt_len(trace)
    rx, ry, rtext = [], [], []
    for i, record in enumerate(steps):
        for position, token, score in (record.get("policy") or {}).get("rejected_at") or []:
            rx.append(int(position) - P)
            ry.append(i)
            rtext.append(f"self-verify sent '{html.escape(visible(token_text(trace, token)))}' back to mask · "
                         f"conflict score {score:.3f}")
    if rx:
        fig.add_trace(go.Scatter(
            x=rx, y=ry, mode="markers", name="sent back (self-verify)", hovertext=rtext, hoverinfo="text",
            marker={"symbol": "square-open", "color": "#d73027", "size": mark_size(13, n, len(steps), share=1.0),
                    "line": {"width": 2}},
        ))


def _theorem1_column(fig: go.Figure, steps: list[dict]) -> None:
    """Theorem 1's verdict left of each row, in a column of its own: a green dot where it guarantees
    the step, a red cross where not; sized to the rows and outlined, so that 32 rows stay 32 marks."""
    # Told for the commits each step kept, as the grid's and the verdicts' lines are: the drafts
    # self-verify sent back have their red squares.
    verdicts = [theorem1(record) for record in steps]
    column, size = mark_column(fig), mark_size(11, None, len(steps), share=0.75)
    for verdict, symbol, colour, line in (("guaranteed", "circle", "#1a9850", {"color": "white", "width": 1}),
                                          ("no guarantee", "x-thin-open", "#d73027",
                                           {"color": "#d73027", "width": max(1.0, size / 4)})):
        rows = [i for i, v in enumerate(verdicts) if v["verdict"] == verdict]
        fig.add_trace(go.Scatter(
            x=[0] * len(rows), y=rows, xaxis=column, mode="markers", name=f"Theorem 1: {verdict}", cliponaxis=False,
            hovertext=[f"step {i}: {verdicts[i]['text']}" for i in rows], hoverinfo="text",
            marker={"symbol": symbol, "size": size, "color": colour, "line": line},
        ))
