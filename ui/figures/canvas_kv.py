"""A canvas model's KV and cache views (DiffusionGemma): the decoder's K/V drift on the canvas from
one step to the next, beside the encoder's entries that every step reads from its cache unchanged;
and, per canvas, what the encoder computed and what it found cached."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..canvas.parts import canvas_steps
from ..parts.figure_style import message_figure, styled
from ..parts.replay import MEAN_LAYERS, Trace, answer_length, prompt_len, steps_upto
from ..parts.trace_parts import one_value, per_position
from .axes import EMPTY_MESSAGE, NAN, axis_ticks, cell_gaps, cell_range, num, step_axis
from .cosine_scale import COS_SCALE, colour_bar

ENCODER_EXACT = "encoder cache: exact by construction (read, never recomputed)"
KV_CAPTION = ("Each cell compares a position's K or V in the decoder with the step before's, on the cosine scale in "
              "nines (yellow: the same; dark: changed): the canvas the decoder refines drifts as its draft moves. "
              f"Left of the black staircase, green: the {ENCODER_EXACT}. White: a canvas's first step, with no step "
              "before it. At trace level summary, each step's mean and least cosine over the canvas.")
CACHE_CAPTION = ("Per canvas, the encoder's pass before it: the tokens it computed (the prompt, then the canvas "
                 "finished before) and the entries it found in its cache and kept as they were (exact, never "
                 "recomputed). Every decoder step reads the whole cache; the hit rate is the share of the K/V "
                 "entries the decoder attends over that it read rather than computed.")
_EXACT_COLOUR = "#a1d99b"


def _row(record: dict, layer: str, which: str) -> list[float]:
    """One step's cosines over the sequence for ``layer`` (or the mean over layers, where any
    layer holds one); NaN where nothing is recorded."""
    by_layer = record.get("kv") or {}
    names = list(by_layer) if layer == MEAN_LAYERS else [layer]
    rows = [[num(v) for v in per_position(by_layer.get(name), which) or []] for name in names]
    width = max((len(r) for r in rows), default=0)  # as long as the sequence; a shorter row is padded with gaps
    grid = np.array([r + [NAN] * (width - len(r)) for r in rows], dtype=np.float64).reshape(len(rows), width)
    counts = (~np.isnan(grid)).sum(axis=0)
    return np.where(counts > 0, np.nansum(grid, axis=0) / np.maximum(counts, 1), NAN).tolist()


def canvas_kv_grid(trace: Trace, steps: list[dict], layer: str, which: str) -> tuple[np.ndarray, np.ndarray]:
    """[steps, prompt + answer] of the decoder's cosine with the step before (canvas cells) and of
    1.0 where the step read the encoder's cache (every position before its canvas: exact by
    construction, so the trace stores nothing there); NaN elsewhere."""
    P, n = prompt_len(trace), answer_length(trace)
    drift = np.full((len(steps), P + n), NAN, dtype=np.float32)
    exact = np.full((len(steps), P + n), NAN, dtype=np.float32)
    for i, record in enumerate(steps):
        start, length = int(record["canvas"]["start"]), len(record["canvas"]["draft"])
        row = _row(record, layer, which)
        drift[i, start:start + len(row[start:start + length])] = row[start:start + length]
        exact[i, :start] = 1.0  # the encoder's cache: read, never written by the decoder (nothing stored)
    return drift, exact


def canvas_kv_heatmap(trace: Trace, layer: str = MEAN_LAYERS, which: str = "k", upto_step: int | None = None,
                      view: str = "drift") -> go.Figure:
    """The decoder's K (or V) drift on the canvas, step by step, with the encoder's cached entries
    beside it; at trace level summary, the per-step mean and least cosine over the canvas."""
    layer = str(layer)
    where = "all layers (mean)" if layer == MEAN_LAYERS else f"layer {layer}"
    title = f"Decoder K/V drift · {where} · {which.upper()}"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    if view != "drift":
        return message_figure("a canvas model has no exact-drift diagnostic: the drift view shows its decoder's "
                              f"K/V from step to step; the {ENCODER_EXACT}", title)
    if layer != MEAN_LAYERS and not any(layer in (s.get("kv") or {}) for s in steps):
        return message_figure(f"layer {layer} is not in this trace", title)
    if any(f"{which}_mean" in row for s in steps for row in (s.get("kv") or {}).values()):
        return _summary_lines(trace, steps, layer, which, title)
    P, n = prompt_len(trace), answer_length(trace)
    drift, exact = canvas_kv_grid(trace, steps, layer, which)
    x, rows, gaps = np.arange(-P, n), np.arange(len(steps)), cell_gaps(P + n, len(steps))
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=exact, x=x, y=rows, name=ENCODER_EXACT, zmin=0, zmax=1, showscale=False,
                             showlegend=True, colorscale=[[0, _EXACT_COLOUR], [1, _EXACT_COLOUR]], hoverongaps=False,
                             hovertemplate=f"pos %{{x}} · step %{{y}}<br>cos %{{z:.4f}}: {ENCODER_EXACT}<extra></extra>",
                             **gaps))
    fig.add_trace(go.Heatmap(z=drift, x=x, y=rows, name="decoder drift", zmin=0, zmax=1, colorscale=COS_SCALE,
                             showscale=False, hoverongaps=False, **gaps,
                             hovertemplate="pos %{x} · step %{y}<br>cos to the step before %{z:.4f}<extra></extra>"))
    fig.add_trace(colour_bar())
    stair_x, stair_y = [], []
    for i, record in enumerate(steps):  # the edge between the encoder's entries and the canvas, row by row
        edge = int(record["canvas"]["start"]) - P - 0.5
        stair_x += [edge, edge, None]
        stair_y += [i - 0.5, i + 0.5, None]
    fig.add_trace(go.Scatter(x=stair_x, y=stair_y, mode="lines", name="canvas starts", hoverinfo="skip",
                             line={"color": "#111", "width": 2.5}))
    if np.isnan(drift).all(axis=1).any():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="white: a canvas's first step",
                                 hoverinfo="skip", marker={"symbol": "square", "size": 12, "color": "#ffffff",
                                                           "line": {"color": "#888", "width": 1}}))
    ticks = axis_ticks(n)
    fig.update_layout(xaxis={"title": {"text": "answer position (the prompt left of 0)"}, "range": [-P - 0.5, n - 0.5],
                             "autorange": False, "zeroline": False, "tickmode": "array",
                             "tickvals": [-P / 2 - 0.5, *ticks], "ticktext": ["prompt", *map(str, ticks)]})
    step_axis(fig, len(steps))
    return styled(fig, title)


def _summary_lines(trace: Trace, steps: list[dict], layer: str, which: str, title: str) -> go.Figure:
    """Trace level summary: per step, the mean and least cosine over the canvas (for ``layer``,
    or the mean of the layers' means and the least of their minima), and the encoder's 1.0."""
    names = [name for name in (steps[0].get("kv") or {}) if layer in (MEAN_LAYERS, name)]
    lines = {}
    for stat, pool in (("mean", np.nanmean), ("min", np.nanmin)):
        values = [[num(one_value((s.get("kv") or {}).get(name), f"{which}_{stat}")) for name in names] for s in steps]
        lines[stat] = [NAN if np.isnan(v).all() else float(pool(v)) for v in values]
    x = np.arange(len(steps))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[1.0] * len(steps), mode="lines", name=ENCODER_EXACT,
                             line={"color": "#1a9850", "width": 3}, hovertemplate=f"step %{{x}}: 1.0, {ENCODER_EXACT}"
                                                                                  "<extra></extra>"))
    for stat, colour, dash in (("mean", "#3d6aa6", "solid"), ("min", "#e4572e", "dot")):
        fig.add_trace(go.Scatter(x=x, y=lines[stat], mode="lines+markers", name=f"canvas {stat} cosine",
                                 line={"color": colour, "dash": dash}, connectgaps=False,
                                 hovertemplate=f"step %{{x}}: canvas {stat} cos %{{y:.4f}}<extra></extra>"))
    for rows in list(canvas_steps(trace, len(steps) - 1).values())[1:]:
        fig.add_vline(x=rows[0] - 0.5, line={"color": "#111", "width": 1.5, "dash": "dash"})
    fig.update_layout(xaxis={"title": {"text": "step (dashed: a new canvas)"}, "range": cell_range(len(steps)),
                             "tickmode": "array", "tickvals": axis_ticks(len(steps))},
                      yaxis={"title": {"text": f"{which.upper()} cosine with the step before"}})
    return styled(fig, f"{title} · per step (trace level summary)")


def canvas_cache_panel(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """Per canvas begun by ``upto_step``: the encoder's tokens computed and its cache entries reused
    (its pass on the canvas's first step), and the decoder's cache hit rate."""
    title = "Encoder cache per canvas"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    passes = [(int(s["canvas"]["canvas"]) + 1, s["canvas"]["encoder"]) for s in steps if s["canvas"].get("encoder")]
    labels = [f"canvas {c}" for c, _ in passes]
    fig = go.Figure()
    for name, key, colour in (("computed by the encoder", "positions", "#3d6aa6"),
                              ("cached, reused (exact)", "cached", "#1a9850")):
        fig.add_trace(go.Bar(x=labels, y=[int(p[key]) for _, p in passes], name=name, marker_color=colour,
                             hovertemplate=f"%{{x}}: %{{y}} {name}<extra></extra>"))
    fig.update_layout(barmode="stack", xaxis={"title": {"text": "the encoder's pass before each canvas"}},
                      yaxis={"title": {"text": "encoder entries"}, "rangemode": "tozero"})
    return styled(fig, f"{title} · decoder hit rate {hit_rate(trace, steps):.0%} (cached positions read / "
                       "(read + canvas computed))")


def hit_rate(trace: Trace, steps: list[dict]) -> float:
    """The run's ``cache_hit_rate`` once it covers the whole run, else the same share so far."""
    stats = trace.get("stats") or {}
    if len(steps) == len(trace.get("steps") or []) and stats.get("cache_hit_rate") is not None:
        return float(stats["cache_hit_rate"])
    reads, computed = sum(int(s.get("reads") or 0) for s in steps), sum(int(s.get("g") or 0) for s in steps)
    return reads / (reads + computed) if reads + computed else 0.0
