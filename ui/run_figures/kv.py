"""The Run tab's figures: confidence, KV cosine and cache, each a pure function of the trace
(trace dict in, plotly figure out). A figure shows the answer region only (see ``ui.replay``)."""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dllm_local.trace import KV_VIEWS

from .figure_style import message_figure, styled
from .replay import (MEAN_LAYERS, Trace, answer_length, drafts, prompt_len, state_at, steps_upto, theorem1, token_text,
                     visible)

NAN = float("nan")
SUMMARY_MESSAGE = "per-position KV data needs trace level 'full'"
EMPTY_MESSAGE = "no steps yet"

CAPTIONS: dict[str, str] = {
    "confidence": "Each row is one forward: colour is the model's confidence at still-masked positions, "
                  "x marks a commit; a policy that commits early on bright cells saves steps. Left of each row: "
                  "Fast-dLLM's Theorem 1. When a step commits n tokens, all with confidence above 1 − ε, and "
                  "(n+1)ε ≤ 1, greedy parallel decoding commits exactly what one-at-a-time decoding would (green "
                  "dot); otherwise there is no guarantee (red cross), and the tokens may not fit together.",
    "kv": "Each cell compares one position's K or V with a reference, on one colour scale: yellow, cosine near 1 "
          "(the same); dark, changed. Drift: against what the cache held (grey cells were reused, not recomputed); "
          "true drift: the exact K/V against the previous step's; cache vs exact: the cached K/V against a full "
          "uncached forward. Below the black staircase a position holds a decoded token, above it it is still "
          "masked; ▶ marks a full refresh. Reusing an entry is exact only where cache vs exact stays yellow: the "
          "verdict under the panel gives this run's mean and least cosine of the reused entries by kind (prompt, "
          "decoded, masked) and whether each kind is close to exact.",
    "cache": "Bars: positions recomputed per forward (G); lines: share of K/V read from cache, per step and "
             "cumulative; fewer recomputes at a high hit rate is where the speedup comes from.",
}


def _num(value: Any) -> float:
    """None (JSON null: nothing recorded) becomes NaN so plotly leaves a gap."""
    return NAN if value is None else float(value)


def axis_ticks(count: int) -> list[int]:
    """Tick values for ``count`` cells numbered from 0: every cell up to 24, else a 1-2-5 step giving
    at most 12 ticks; never a tick outside 0..count-1 (no "step -1", no step past the last)."""
    if count <= 24:
        return list(range(max(1, count)))
    step = next(m * 10**e for e in range(12) for m in (1, 2, 5) if count / (m * 10**e) <= 12)
    return list(range(0, count, step))


def _cell_range(count: int) -> list[float]:
    """The axis range that holds cells 0..count-1 exactly, half a cell either side."""
    return [-0.5, max(1, count) - 0.5]


def _step_axis(fig: go.Figure, n_steps: int, **kwargs) -> None:
    # Time runs downwards, like reading the decode from top to bottom. The range is set, not left to
    # autorange: markers beside the rows would pad it to a "step -1" and a step past the last.
    top, bottom = _cell_range(n_steps)
    fig.update_yaxes(title_text="step", range=[bottom, top], autorange=False, zeroline=False,
                     tickmode="array", tickvals=axis_ticks(n_steps), **kwargs)


# ----------------------------------------------------------------------------- confidence

def confidence_heatmap(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """y = step, x = answer position, z = confidence at still-masked positions scored that step.

    Cells that were not scored (already committed, or outside the forward) are NaN; an "x" marks
    each commit at (position, step of commit).
    """
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
                z[i, p] = _num(conf)
        for position, token, conf in record.get("committed") or []:
            cx.append(int(position) - P)
            cy.append(i)
            ctext.append(f"commit '{html.escape(visible(token_text(trace, token)))}' · confidence {conf:.3f}")
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=np.arange(n), y=np.arange(len(steps)), zmin=0, zmax=1, colorscale="Viridis",
        name="confidence", hoverongaps=False, xgap=1 if n <= 64 else 0, ygap=1 if len(steps) <= 64 else 0,
        colorbar={"title": {"text": "conf"}, "thickness": 12},
        hovertemplate="pos %{x} · step %{y}<br>confidence %{z:.3f}<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        x=cx, y=cy, mode="markers", name="commit", hovertext=ctext, hoverinfo="text",
        marker={"symbol": "x", "color": "white", "size": 8, "line": {"color": "#222", "width": 1}},
    ))
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
            marker={"symbol": "square-open", "color": "#d73027", "size": 13, "line": {"width": 3}},
        ))
    # Told for what each step drafted: a dot beside drafts self-verify sent back must not say "guaranteed".
    verdicts = [theorem1({"committed": drafts(record)}) for record in steps]
    for verdict, symbol, colour in (("guaranteed", "circle", "#1a9850"), ("no guarantee", "x-thin-open", "#d73027")):
        rows = [i for i, v in enumerate(verdicts) if v["verdict"] == verdict]
        fig.add_trace(go.Scatter(
            x=[-1.2] * len(rows), y=rows, mode="markers", name=f"Theorem 1: {verdict}", cliponaxis=False,
            hovertext=[verdicts[i]["text"] for i in rows], hoverinfo="text",
            marker={"symbol": symbol, "size": 11, "color": colour, "line": {"color": colour, "width": 3}},
        ))
    fig.update_xaxes(title_text="answer position", range=[-1.7, n - 0.5], tickmode="array", tickvals=axis_ticks(n))
    _step_axis(fig, len(steps))
    return styled(fig, title)



# ----------------------------------------------------------------------------- KV

# One colour scale for every cosine view, fixed, so a colour means the same value everywhere.
# Most of the range goes to cosines near 1, where committed positions live; anything at or
# below 0 (unrelated or opposite) takes the darkest colour, its true value in the hover.
COS_SCALE = [[0.0, "#2d0a4e"], [0.5, "#3b528b"], [0.9, "#21918c"], [0.99, "#7ad151"], [1.0, "#fde725"]]
COS_TICKS = {0.0: "≤ 0 unrelated", 0.5: "0.5", 1.0: "1 unchanged"}


def _layer_values(record: dict, view: str, layer: str, which: str) -> list | None:
    """One step's cosines for one layer (or the mean over every recorded layer)."""
    if view == "drift":
        by_layer = record.get("kv") or {}
    else:
        key = "true_drift" if view == "true_drift" else "cache_vs_exact"
        by_layer = (record.get("exact") or {}).get(key) or {}
    if layer != MEAN_LAYERS:
        return (by_layer.get(layer) or {}).get(which)
    rows = [[_num(v) for v in (data or {}).get(which) or []] for data in by_layer.values()]
    rows = [r for r in rows if r]
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    # A null (nothing cached there yet) is null in every layer alike, so the plain mean keeps it.
    return np.array(rows, dtype=np.float64).mean(axis=0).tolist()


def _kv_rows(trace: Trace, steps: list[dict], layer: str, which: str, view: str):
    """Per-step rows of the chosen view plus, for "drift", the rows of reused (cached) cells."""
    P, n = prompt_len(trace), answer_length(trace)
    values = np.full((len(steps), n), NAN, dtype=np.float32)
    cached = np.full((len(steps), n), NAN, dtype=np.float32)
    for i, record in enumerate(steps):
        cos = _layer_values(record, view, layer, which) or []
        if view == "drift":
            recomputed = record.get("recomputed") or []
            cached[i] = 1.0  # reused, except where this step recomputed
            for j, position in enumerate(recomputed):
                p = int(position) - P
                if 0 <= p < n:
                    # null or absent (kv == {}): the cache held nothing there yet
                    values[i, p] = _num(cos[j] if j < len(cos) else None)
                    cached[i, p] = NAN
        else:
            for p, c in enumerate(cos[P:P + n]):
                values[i, p] = _num(c)
    return values, cached


# A cell whose two compared K/V straddle a change of the position's own input (mask → token or
# back) shows that change, not drift: the first comparison after each commit or take-back.
INPUT_CHANGES = {
    "commit": ("commit: mask → token", "#f4a582", "this position was committed (mask → token) between the two K/V "
               "compared:<br>the change is its new token's, not drift"),
    "taken back": ("taken back: token → mask", "#92c5de", "this position's token was taken back (token → mask) "
                   "between the two K/V compared:<br>the change is the mask's, not drift"),
}


def input_change_cells(trace: Trace, steps: list[dict], view: str) -> dict[str, np.ndarray]:
    """Per kind of :data:`INPUT_CHANGES`, the (step, answer position) cells of a ``drift`` or
    ``true_drift`` view whose cosine compares K/V from before and after that position's input changed.

    "drift" compares a recomputed entry with the value cached at the position's last recompute, so a
    commit shows at the position's first recompute after it; "true_drift" compares consecutive exact
    forwards, so it shows at the step after the commit. Other views mark nothing.
    """
    P, n = prompt_len(trace), answer_length(trace)
    marks = {kind: np.zeros((len(steps), n), dtype=bool) for kind in INPUT_CHANGES}
    if view not in ("drift", "true_drift"):
        return marks
    pending: list[str | None] = [None] * n  # the change not yet seen by a comparison
    for i, record in enumerate(steps):
        if view == "drift":
            compared = [int(position) - P for position in record.get("recomputed") or []]
        else:
            compared = range(n) if record.get("exact") else []
        for p in compared:
            if 0 <= p < n and pending[p]:
                marks[pending[p]][i, p] = True
                pending[p] = None
        for kind, key in (("commit", "committed"), ("taken back", "revoked")):  # revoked: after the commits
            for position, *_ in record.get(key) or []:
                if 0 <= int(position) - P < n:
                    pending[int(position) - P] = kind
    return marks


def _commit_line(trace: Trace, steps: list[dict]) -> tuple[list[float], list[float]]:
    """The step at which each answer position was committed, as a staircase: cells below it
    (later steps) hold a decoded token, cells above it are still masked."""
    commit = state_at(trace, len(steps) - 1)["commit_step"]
    x, y = [], []
    for p, s in enumerate(commit):
        y_p = (len(steps) - 0.5) if s is None else s + 0.5  # the edge between commit step and the next
        x += [p - 0.5, p + 0.5]
        y += [y_p, y_p]
    return x, y


def kv_heatmap(trace: Trace, layer: int | str = MEAN_LAYERS, which: str = "k", upto_step: int | None = None,
               view: str = "drift") -> go.Figure:
    """KV cosine per (step, answer position) for one layer (or ``"mean"``: the mean over layers)
    and K or V, on one fixed colour scale (``COS_SCALE``).

    view "drift": cosine between each recomputed entry and what the cache held (from ``kv``);
    positions reused from the cache are a flat grey layer (trace "cached"). view "true_drift":
    cosine between consecutive exact (uncached) K/V; view "cache_error": cosine between the cached
    and the exact entry; both come from ``exact`` and are NaN on steps without it. A black
    staircase (trace "committed") marks each position's commit step: below it the position holds
    a decoded token, above it is still masked. Full-refresh rows carry a "refresh" marker left of
    the grid (trace "refresh").
    """
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', not {which!r}")
    if view not in KV_VIEWS:
        raise ValueError(f"view must be one of {KV_VIEWS}, not {view!r}")
    layer = str(layer)
    names = {"drift": "KV drift", "true_drift": "True KV drift (exact)", "cache_error": "Cache vs exact"}
    where = "all layers (mean)" if layer == MEAN_LAYERS else f"layer {layer}"
    title = f"{names[view]} · {where} · {which.upper()}"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    if view == "drift":
        if not any(s.get("recomputed") is not None for s in steps):
            return message_figure(SUMMARY_MESSAGE, title)
        if layer != MEAN_LAYERS and not any(layer in (s.get("kv") or {}) for s in steps):
            return message_figure(f"layer {layer} is not in this trace", title)
    elif not any(s.get("exact") for s in steps):
        return message_figure("exact-drift data needs the setting exact_drift on", title)
    if len(steps) == 1:
        return message_figure("one step only: there is no earlier K/V to compare with", title)
    n = answer_length(trace)
    values, cached = _kv_rows(trace, steps, layer, which, view)
    changes = {kind: np.where(cells & ~np.isnan(values), values, NAN).astype(np.float32)
               for kind, cells in input_change_cells(trace, steps, view).items()}
    for layer_values in changes.values():  # each cell in one layer only: hover names what it is
        values[~np.isnan(layer_values)] = NAN
    rows, columns = np.arange(len(steps)), np.arange(n)
    gaps = {"xgap": 1 if n <= 64 else 0, "ygap": 1 if len(steps) <= 64 else 0}
    fig = go.Figure()
    if view == "drift":
        fig.add_trace(go.Heatmap(
            z=cached, x=columns, y=rows, name="cached", zmin=0, zmax=1, showscale=False,
            colorscale=[[0, "#d0d0d0"], [1, "#d0d0d0"]], hoverongaps=False,
            hovertemplate="pos %{x} · step %{y}<br>cached (reused)<extra></extra>", **gaps,
        ))
    label = {"drift": "cos to cached value", "true_drift": "cos to previous exact", "cache_error": "cos cached vs exact"}
    fig.add_trace(go.Heatmap(
        z=values, x=columns, y=rows, name=view, zmin=0.0, zmax=1.0, colorscale=COS_SCALE,
        hoverongaps=False, **gaps,
        colorbar={"title": {"text": "cosine"}, "thickness": 14, "tickvals": list(COS_TICKS),
                  "ticktext": list(COS_TICKS.values()), "tickfont": {"size": 14}},
        hovertemplate=f"pos %{{x}} · step %{{y}}<br>{label[view]} %{{z:.4f}}<extra></extra>",
    ))
    for kind, z in changes.items():
        if np.isnan(z).all():
            continue
        name, colour, why = INPUT_CHANGES[kind]
        fig.add_trace(go.Heatmap(
            z=z, x=columns, y=rows, name=name, zmin=0, zmax=1, showscale=False, showlegend=True,
            colorscale=[[0, colour], [1, colour]], hoverongaps=False, **gaps,
            hovertemplate=f"pos %{{x}} · step %{{y}}<br>{label[view]} %{{z:.4f}}<br>{why}<extra></extra>",
        ))
    line_x, line_y = _commit_line(trace, steps)
    fig.add_trace(go.Scatter(
        x=line_x, y=line_y, mode="lines", name="committed below", line={"color": "#111", "width": 2.5},
        hoverinfo="skip",
    ))
    refresh = [i for i, s in enumerate(steps) if s.get("full_refresh")]
    fig.add_trace(go.Scatter(
        x=[-1.0] * len(refresh), y=refresh, mode="markers", name="refresh", cliponaxis=False,
        marker={"symbol": "triangle-right", "size": 11, "color": "#e4572e"},
        hovertemplate="step %{y}: full refresh (every position recomputed)<extra></extra>",
    ))
    fig.update_xaxes(title_text="answer position", range=[-1.6, n - 0.5], tickmode="array", tickvals=axis_ticks(n))
    _step_axis(fig, len(steps))
    _drift_probes(fig, trace, steps)
    return styled(fig, title)


PROBE_COLUMN = 0.2  # the share of the figure's width the drift probes' column takes


def _drift_probes(fig: go.Figure, trace: Trace, steps: list[dict]) -> None:
    """drift_refresh's attention-drift probe of each step, and what it decided, in a column of its
    own right of the grid (same step axis): the cosine on x, γ as a dashed line, so a reader sees
    the drift fall towards γ and the refresh it triggers."""
    probes = [(i, s["policy"]["drift"], bool(s["policy"].get("refresh_next")))
              for i, s in enumerate(steps) if (s.get("policy") or {}).get("drift") is not None]
    if not probes:
        return
    gamma = ((trace.get("settings") or {}).get("cache_params") or {}).get("gamma")
    below = f" < γ {gamma}" if gamma is not None else ""
    fig.add_trace(go.Scatter(
        x=[d for _, d, _ in probes], y=[i for i, _, _ in probes], mode="lines+markers", xaxis="x2",
        name="attention drift probe", hoverinfo="text", line={"color": "#bbb", "width": 1},
        hovertext=[f"step {i}: attention drift cos {d:.3f}" + (f"{below} → the next step refreshes" if r else
                                                                " → keep reusing the cache") for i, d, r in probes],
        marker={"symbol": ["diamond" if r else "circle" for *_, r in probes], "size": 9,
                "color": ["#e4572e" if r else "#777" for *_, r in probes]},
    ))
    low = min([d for _, d, _ in probes] + ([float(gamma)] if gamma is not None else []))
    pad = max(1e-3, 0.15 * (1.0 - low))
    if gamma is not None:
        fig.add_trace(go.Scatter(x=[gamma, gamma], y=_cell_range(len(steps)), mode="lines", xaxis="x2",
                                 name=f"γ {gamma}", line={"color": "#e4572e", "dash": "dash", "width": 1.5},
                                 hoverinfo="skip"))
    fig.update_layout(
        xaxis={"domain": [0, 1 - PROBE_COLUMN - 0.03]},
        xaxis2={"domain": [1 - PROBE_COLUMN, 1], "anchor": "y", "range": [low - pad, 1 + pad / 3],
                "title": {"text": "attention cos"}, "nticks": 3, "tickformat": ".2f"},
    )



# ----------------------------------------------------------------------------- cache

HIT_RATE_TICKS = [0.0, 0.25, 0.5, 0.75, 1.0]


def cache_panel(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """Bars: G (positions recomputed) per step; lines: hit rate per step and cumulative (right axis)."""
    title = "Cache: recomputed positions and hit rate"
    steps = steps_upto(trace, upto_step)
    if not steps:
        return message_figure(EMPTY_MESSAGE, title)
    if (trace.get("settings") or {}).get("cache") == "none":
        return message_figure("no cache in this run: every forward recomputes every position (hit rate 0)", title)
    x = np.arange(len(steps))
    g = np.array([int(s.get("g") or 0) for s in steps])
    reads = np.array([int(s.get("reads") or 0) for s in steps])
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
    fig.update_layout(xaxis={"title": {"text": "step"}, "range": _cell_range(len(steps)), "autorange": False,
                             "tickmode": "array", "tickvals": axis_ticks(len(steps)), "domain": [0, 0.92]},
                      yaxis={"title": {"text": "G (positions)"}, "rangemode": "tozero"},
                      yaxis2={"title": {"text": "hit rate"}, "overlaying": "y", "side": "right", "range": [0, 1.12],
                              "tickmode": "array", "tickvals": HIT_RATE_TICKS, "tickformat": ".0%", "showgrid": False})
    return styled(fig, title)

