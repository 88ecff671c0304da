"""The grid every Run-tab figure is drawn on: cells numbered from 0, a step axis read downwards,
ticks that never name a cell outside the trace, and gaps in place of values not recorded."""
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


def step_axis(fig: go.Figure, n_steps: int, **kwargs: Any) -> None:
    """The y axis as steps, time running downwards like reading the decode from top to bottom."""
    # The range is set, not left to autorange: markers beside the rows would pad it to a "step -1"
    # and a step past the last.
    top, bottom = cell_range(n_steps)
    fig.update_yaxes(title_text="step", range=[bottom, top], autorange=False, zeroline=False,
                     tickmode="array", tickvals=axis_ticks(n_steps), **kwargs)


def position_axis(fig: go.Figure, n_positions: int, left: float) -> None:
    """The x axis as answer positions, reaching to ``left`` for the markers beside the rows."""
    fig.update_xaxes(title_text="answer position", range=[left, n_positions - 0.5], tickmode="array",
                     tickvals=axis_ticks(n_positions))
