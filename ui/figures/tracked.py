"""The cache panel's position map for a sliding-window cache (Flash-dLLM as released): per step,
each prompt and answer position as the window, a tracked decoded position (recomputed), another
recomputed position (the next masks; everything at the first, full forward) or read from the cache."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..parts.replay import Trace, answer_length, prompt_len
from .axes import axis_ticks, cell_gaps, cell_range

# name, colour, what the hover says; the window's purple is the token grid's
KINDS = (("read from cache", "#dcdcdc", "read from the cache"),
         ("next masks (all at the full forward)", "#a6c4e6",
          "recomputed: a mask ahead of the window (at the full forward: every position)"),
         ("tracked", "#1b9e77", "tracked: a decoded position recomputed"),
         ("window", "#6a3d9a", "the window: scored this step"))
READ, OTHER, TRACKED, WINDOW = range(len(KINDS))
HEIGHT = 520  # with a line of the legend for each kind below
MAP_TOP = 0.40  # the map fills the figure's lower part, the G bars the upper part from BARS_BOTTOM
BARS_BOTTOM = 0.64


def has_window(steps: list[dict]) -> bool:
    """Whether the steps come from a sliding-window cache (they report ``policy.tracked``)."""
    return any("tracked" in (s.get("policy") or {}) for s in steps)


def position_kinds(trace: Trace, steps: list[dict]) -> np.ndarray:
    """[steps, prompt + answer] of kind indices (READ ... WINDOW), columns in sequence order; NaN
    where the trace does not say (a summary trace lists no recomputed positions)."""
    P, n = prompt_len(trace), answer_length(trace)
    kinds = np.full((len(steps), P + n), np.nan)
    for row, record in enumerate(steps):
        policy = record.get("policy") or {}
        recomputed = record.get("recomputed")
        if recomputed is not None:
            kinds[row] = READ
            kinds[row, [p for p in recomputed if p < P + n]] = OTHER
        for kind, key in ((TRACKED, "tracked"), (WINDOW, "window")):
            kinds[row, [int(p) for p in policy.get(key) or [] if int(p) < P + n]] = kind
    return kinds


def add_position_map(fig: go.Figure, trace: Trace, steps: list[dict]) -> None:
    """Below the G bars: one row per step, one column per position (the prompt left of answer
    position 0), coloured by what the step did with it; one heatmap per kind, so the hover names it."""
    P, n = prompt_len(trace), answer_length(trace)
    kinds = position_kinds(trace, steps)
    x, y = np.arange(-P, n), np.arange(len(steps))
    for index, (name, colour, told) in enumerate(KINDS):
        z = np.where(kinds == index, 1.0, np.nan)
        if not np.any(z == 1.0):
            continue
        fig.add_trace(go.Heatmap(x=x, y=y, z=z, name=name, xaxis="x2", yaxis="y3", zmin=0, zmax=1,
                                 colorscale=[[0, colour], [1, colour]], showscale=False, showlegend=True,
                                 legendrank=1000 + index,
                                 hovertemplate=f"step %{{y}} · position %{{x}}: {told}<extra></extra>",
                                 **cell_gaps(P + n, len(steps))))
    fig.add_vline(x=-0.5, line={"color": "#333", "width": 2}, xref="x2", yref="y3")
    # The kinds are legend entries (a line each, at the figure's foot): a key on one line above the
    # map ran out of a narrow panel.
    unsaid = " (a full trace lists the rest)" if any(s.get("recomputed") is None for s in steps) else ""
    fig.add_annotation(text=f"<b>Positions each step</b>{unsaid}", x=0, y=MAP_TOP + 0.03,
                       xref="paper", yref="paper", xanchor="left", yanchor="bottom", showarrow=False,
                       font={"size": 14})
    ticks = axis_ticks(n)
    top, bottom = cell_range(len(steps))
    fig.update_layout(
        yaxis={"domain": [BARS_BOTTOM, 1]}, yaxis2={"domain": [BARS_BOTTOM, 1]},
        xaxis2={"anchor": "y3", "domain": [0, 0.92], "range": [-P - 0.5, n - 0.5], "autorange": False,
                "title": {"text": "answer position (the prompt left of 0)"},
                "tickmode": "array", "tickvals": [-P / 2 - 0.5, *ticks], "ticktext": ["prompt", *map(str, ticks)]},
        yaxis3={"anchor": "x2", "domain": [0, MAP_TOP], "range": [bottom, top], "autorange": False,
                "title": {"text": "step"}, "tickmode": "array", "tickvals": axis_ticks(len(steps)), "zeroline": False})
