"""The grid every Run-tab figure is drawn on: cells numbered from 0, a step axis read downwards,
ticks that never name a cell outside the trace, gaps in place of values not recorded, a column of
its own for one mark per step, and marks sized to the cells so that dense ones stay apart."""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

NAN = float("nan")
EMPTY_MESSAGE = "no steps yet"


def num(value: Any) -> float:
    """None (JSON null: nothing recorded) becomes NaN so plotly leaves a gap."""
    return NAN if value is None else float(value)


def axis_ticks(count: int) -> list[int]:
    """Tick values for ``count`` cells numbered from 0: every cell up to 24, else a 1-2-5 step giving
    at most 12 ticks; never a tick outside 0..count-1 (no "step -1", no step past the last)."""
    if count <= 24:
        return list(range(max(1, count)))
    step = next(m * 10**e for e in range(12) for m in (1, 2, 5) if count / (m * 10**e) <= 12)
    return list(range(0, count, step))


def cell_range(count: int) -> list[float]:
    """The axis range that holds cells 0..count-1 exactly, half a cell either side."""
    return [-0.5, max(1, count) - 0.5]


def cell_gaps(positions: int, steps: int) -> dict[str, int]:
    """A heatmap's gaps between cells: a hairline while cells are wide enough to show one."""
    return {"xgap": 1 if positions <= 64 else 0, "ygap": 1 if steps <= 64 else 0}


def step_axis(fig: go.Figure, n_steps: int, title: str = "step", **kwargs: Any) -> None:
    """The y axis as steps, time running downwards like reading the decode from top to bottom."""
    # The range is set, not left to autorange: markers beside the rows would pad it to a "step -1"
    # and a step past the last.
    top, bottom = cell_range(n_steps)
    fig.update_yaxes(title_text=title, range=[bottom, top], autorange=False, zeroline=False,
                     tickmode="array", tickvals=axis_ticks(n_steps), **kwargs)


def position_axis(fig: go.Figure, n_positions: int) -> None:
    """The x axis as answer positions, cells 0..n-1 and nothing else (marks beside the rows have a
    column of their own: :func:`mark_column`)."""
    fig.update_layout(xaxis={"title": {"text": "answer position"}, "range": cell_range(n_positions), "autorange": False,
                             "zeroline": False, "tickmode": "array", "tickvals": axis_ticks(n_positions)})


# Plotly sizes markers in pixels and a cell's size depends on the width the page gives the plot:
# this is about the Run tab's plot width, enough to keep marks inside their cells.
PLOT_WIDTH = 640
PLOT_ROWS_HEIGHT = 250  # the plot area of a figure of figure_style.HEIGHT, less title and axis
MARK_COLUMN = 0.05  # the share of the width the column of per-step marks takes, left of the grid
MARK_AXIS = "x3"


def mark_column(fig: go.Figure) -> str:
    """A narrow column left of the grid, on the grid's step axis and an x axis of its own, for one
    mark per step (Theorem 1's verdict, a full refresh): in data units beside the grid such a mark
    lay over the first cells once there were many positions. The step axis moves to the figure's
    left edge, outside the column. Returns the x axis the marks are drawn on."""
    fig.update_layout(xaxis3={"domain": [0, MARK_COLUMN], "anchor": "y", "range": [-1, 1], "visible": False,
                              "fixedrange": True},
                      xaxis={"domain": [MARK_COLUMN + 0.01, 1]}, yaxis={"anchor": "free", "position": 0})
    return MARK_AXIS


def mark_size(largest: float, n_positions: int | None, n_steps: int, share: float = 0.8) -> float:
    """A marker's size in pixels: at most ``largest``, at most ``share`` of a cell (of a row where
    ``n_positions`` is None) so that neighbouring marks stay apart; never under 3 px."""
    cell = PLOT_ROWS_HEIGHT / max(1, n_steps)
    if n_positions is not None:
        cell = min(cell, PLOT_WIDTH * (1 - MARK_COLUMN) / max(1, n_positions))
    return round(max(3.0, min(largest, share * cell)), 1)
