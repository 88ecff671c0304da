"""The cache panel: positions recomputed per forward (G) and the share of K/V read from cache."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..canvas.parts import is_canvas
from ..parts.figure_style import message_figure, styled
from ..parts.replay import Trace, steps_upto
from .axes import EMPTY_MESSAGE, axis_ticks, cell_range
from .canvas_kv import canvas_cache_panel
from .tracked import HEIGHT as MAP_HEIGHT, add_position_map, has_window

CAPTION = ("Bars: positions recomputed per forward (G); lines: share of K/V read from cache, per step and "
           "cumulative; fewer recomputes at a high hit rate is where the speedup comes from. With Flash-Cache as "
           "released, a map below: per step, the window, the tracked decoded positions it recomputed, the next "
           "masks, and what was read from the cache.")
HIT_RATE_TICKS = [0.0, 0.25, 0.5, 0.75, 1.0]


def cache_panel(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """Bars: G (positions recomputed) per step; lines: hit rate per step and cumulative (right axis)."""
    if is_canvas(trace):  # the encoder's cache: no cache policy, no partial recompute
        return canvas_cache_panel(trace, upto_step)
    title = "Cache: recomputed positions and hit rate"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    if (trace.get("settings") or {}).get("cache") == "none":
        return message_figure("no cache in this run: every forward recomputes every position (hit rate 0)", title)
    x = np.arange(len(steps))
    # float64: the schema's counts reach 2**63 - 1, and two of them added overflow int64
    g = np.array([int(s.get("g") or 0) for s in steps], dtype=np.float64)
    reads = np.array([int(s.get("reads") or 0) for s in steps], dtype=np.float64)
    seen = g + reads
    rate = np.divide(reads, seen, out=np.zeros(len(steps)), where=seen > 0)
    total_seen = np.cumsum(seen)
    cumulative = np.divide(np.cumsum(reads), total_seen, out=np.zeros(len(steps)), where=total_seen > 0)
    refresh = np.array([bool(s.get("full_refresh")) for s in steps])
    fig = go.Figure()
    # Two bar traces, so the legend names both shades.
    for name, rows, colour in (("G, full refresh", refresh, "#3d6aa6"), ("G, partial", ~refresh, "#a6c4e6")):
        # width set: plotly sizes bars by the gap between a trace's own x, so two refreshes four steps
        # apart drew four-step-wide bars
        fig.add_trace(go.Bar(x=x[rows], y=g[rows], name=name, marker_color=colour, width=0.8,
                             hovertemplate=f"step %{{x}}: G %{{y}} ({name[3:]})<extra></extra>"))
    fig.update_layout(barmode="overlay")
    # hit rates on a right-hand axis laid over the G axis (make_subplots cost a redraw 15 ms)
    fig.add_trace(go.Scatter(x=x, y=rate, name="hit rate", mode="lines+markers", line={"color": "#e4572e"},
                             yaxis="y2", hovertemplate="step %{x}: hit rate %{y:.0%}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=cumulative, name="cumulative", mode="lines", yaxis="y2",
                             line={"color": "#333", "dash": "dot"},
                             hovertemplate="up to step %{x}: %{y:.0%}<extra></extra>"))
    # the plot area leaves the right-hand axis room for its ticks and title, as make_subplots did
    # The hit-rate axis reaches past 100% so that its top label sits inside the plot, clear of the legend.
    fig.update_layout(xaxis={"title": {"text": "step"}, "range": cell_range(len(steps)), "autorange": False,
                             "tickmode": "array", "tickvals": axis_ticks(len(steps)), "domain": [0, 0.92]},
                      yaxis={"title": {"text": "G (positions)"}, "rangemode": "tozero"},
                      yaxis2={"title": {"text": "hit rate"}, "overlaying": "y", "side": "right", "range": [0, 1.12],
                              "tickmode": "array", "tickvals": HIT_RATE_TICKS, "tickformat": ".0%", "showgrid": False})
    if has_window(steps):  # a sliding window: which positions each step recomputed, tracked or read
        add_position_map(fig, trace, steps)
        return styled(fig, title, height=MAP_HEIGHT)
    return styled(fig, title)
