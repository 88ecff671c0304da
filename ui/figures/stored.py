"""The KV view's layer of stored entries, for a block-diffusion run: the answer positions whose K/V
a store forward wrote once their block finished, from the step that first read them on, drawn at
cosine 1.0 and said exact. Computed from the run's ``stored`` spans, not assumed."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..block.parts import EXACT_WORDS, exact_since
from ..parts.replay import Trace, answer_length, prompt_len
from .axes import NAN
from .cosine_scale import PALETTE

LEGEND = "exact (stored block)"
SAME = PALETTE[-1]  # the cosine scale's colour at 1.0, one colour so the legend's swatch shows it too


def stored_steps(trace: Trace, steps: list[dict]) -> np.ndarray:
    """Per (step, answer position), the step before which a store forward wrote that position's
    K/V, where it had by then; NaN elsewhere."""
    P, n = prompt_len(trace), answer_length(trace)
    cells = np.full((len(steps), n), NAN, dtype=np.float32)
    for position, since in exact_since(trace, len(steps) - 1).items():
        if 0 <= position - P < n:
            cells[since:, position - P] = since
    return cells


def exact_layer(stored: np.ndarray, gaps: dict) -> go.Heatmap:
    """The stored cells at cosine 1.0, in the KV view's colour for it, their hover saying why."""
    rows, columns = np.arange(stored.shape[0]), np.arange(stored.shape[1])
    return go.Heatmap(
        z=np.where(np.isnan(stored), NAN, 1.0).astype(np.float32), customdata=stored, x=columns, y=rows, name=LEGEND,
        zmin=0.0, zmax=1.0, colorscale=[[0, SAME], [1, SAME]], showscale=False, showlegend=True, hoverongaps=False, **gaps,
        hovertemplate=(f"pos %{{x}} · step %{{y}}<br>cos 1.0000 — {EXACT_WORDS}<br>"
                       "stored before step %{customdata:d}<extra></extra>"))
