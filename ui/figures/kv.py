"""The KV panel: per (step, answer position), the cosine between a position's K or V and a
reference (what the cache held, the previous exact forward, or the exact value), with the cells
where the position's own input changed, each commit's staircase, refreshes and drift probes."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from dllm_local.trace import KV_VIEWS

from ..block.parts import EXACT_WORDS, is_block_trace, sequence_end
from ..canvas.parts import is_canvas
from ..parts.figure_style import message_figure, styled
from ..parts.replay import MEAN_LAYERS, Trace, answer_length, prompt_len, state_at, steps_upto
from ..parts.trace_parts import per_position, setting
from .axes import EMPTY_MESSAGE, NAN, cell_gaps, cell_range, mark_column, mark_size, num, position_axis, step_axis
from .canvas_kv import canvas_kv_heatmap
from .cosine_scale import COS_SCALE, colour_bar
from .stored import exact_layer, stored_steps

# Each KV view in words: its plot's title and its choice on the page (the identifiers stay the values).
VIEW_NAMES = {"drift": "KV drift", "true_drift": "True KV drift (exact)", "cache_error": "Cache vs exact"}
SUMMARY_MESSAGE = "per-position KV data needs trace level 'full'"
CAPTION = ("Each cell compares one position's K or V with a reference, on one colour scale spent on cosines near 1, "
           "in nines (0.9, 0.99, 0.999): yellow, the same; dark, changed. White cells: nothing to compare with (the first "
           "forward, an entry the cache evicted, no earlier exact forward). Drift: against what the cache held (grey cells were reused, not recomputed); "
           "true drift: the exact K/V against the previous step's; cache vs exact: the cached K/V against a full "
           "uncached forward. Below the black staircase a position holds a decoded token, above it it is still "
           "masked; ▶ marks a full refresh. Reusing an entry is exact only where cache vs exact stays yellow: the "
           "verdict under the panel gives this run's mean and least cosine of the reused entries by kind (prompt, "
           "decoded, masked) and whether each kind is close to exact.")
# A block-diffusion model's KV view says what its stored blocks are, beside the rest.
BLOCK_CAPTION = CAPTION + (" Block diffusion: a finished block's K/V are written once, by a store forward counted apart "
                           f"from NFE, and drawn from then on at cosine 1.0 ({EXACT_WORDS}), read from the run's "
                           "stored spans.")

def _layer_values(record: dict, view: str, layer: str, which: str) -> list | None:
    """One step's cosines for one layer (or the mean over every recorded layer)."""
    if view == "drift":
        by_layer = record.get("kv") or {}
    else:
        key = "true_drift" if view == "true_drift" else "cache_vs_exact"
        by_layer = (record.get("exact") or {}).get(key) or {}
    if layer != MEAN_LAYERS:
        return per_position(by_layer.get(layer), which)
    rows = [[num(v) for v in per_position(data, which) or []] for data in by_layer.values()]
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
        end = sequence_end(trace, record)  # a block step's later blocks are not in its sequence: nothing there
        if view == "drift":
            recomputed = record.get("recomputed") or []
            cached[i, :n if end is None else max(0, end - P)] = 1.0  # reused, except where this step recomputed
            for j, position in enumerate(recomputed):
                p = int(position) - P
                if 0 <= p < n:
                    # null or absent (kv == {}): the cache held nothing there yet
                    values[i, p] = num(cos[j] if j < len(cos) else None)
                    cached[i, p] = NAN
        else:
            for p, c in enumerate(cos[P:P + n if end is None else min(P + n, end)]):
                values[i, p] = num(c)
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
    if is_canvas(trace):  # a decoder over a canvas and an encoder's exact cache: views of their own
        return canvas_kv_heatmap(trace, str(layer), which, upto_step, view)
    layer = str(layer)
    where = "all layers (mean)" if layer == MEAN_LAYERS else f"layer {layer}"
    title = f"{VIEW_NAMES[view]} · {where} · {which.upper()}"
    steps = steps_upto(trace, upto_step)
    if not steps:  # names no layer: it shows none (the page draws this before any run, whatever its Layer box says)
        return message_figure(EMPTY_MESSAGE, f"{VIEW_NAMES[view]} · {which.upper()}")
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
    stored = stored_steps(trace, steps)  # exact by construction: drawn so, whatever was measured there
    for layer_values in changes.values():  # each cell in one layer only: hover names what it is
        values[~np.isnan(layer_values)] = NAN
        layer_values[~np.isnan(stored)] = NAN
    values[~np.isnan(stored)] = cached[~np.isnan(stored)] = NAN
    rows, columns = np.arange(len(steps)), np.arange(n)
    gaps = cell_gaps(n, len(steps))
    fig = go.Figure()
    if view == "drift":
        fig.add_trace(go.Heatmap(
            z=cached, x=columns, y=rows, name="cached", zmin=0, zmax=1, showscale=False,
            colorscale=[[0, "#d0d0d0"], [1, "#d0d0d0"]], hoverongaps=False,
            hovertemplate="pos %{x} · step %{y}<br>cached (reused)<extra></extra>", **gaps,
        ))
    label = {"drift": "cos to cached value", "true_drift": "cos to previous exact", "cache_error": "cos cached vs exact"}
    fig.add_trace(go.Heatmap(
        z=values, x=columns, y=rows, name=view, zmin=0.0, zmax=1.0, colorscale=COS_SCALE, showscale=False,
        hoverongaps=False, **gaps,
        hovertemplate=f"pos %{{x}} · step %{{y}}<br>{label[view]} %{{z:.4f}}<extra></extra>",
    ))
    if not np.isnan(stored).all():
        fig.add_trace(exact_layer(stored, gaps))
    fig.add_trace(colour_bar())
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
    white = WHITE_CELLS[view] + (LATER_BLOCKS if is_block_trace(trace) else "")
    _nothing_to_compare(fig, white, values, cached, stored, *changes.values())
    refresh = [i for i, s in enumerate(steps) if s.get("full_refresh")]
    fig.add_trace(go.Scatter(
        x=[0] * len(refresh), y=refresh, xaxis=mark_column(fig), mode="markers", name="refresh", cliponaxis=False,
        marker={"symbol": "triangle-right", "size": mark_size(11, None, len(steps), share=0.9), "color": "#e4572e"},
        hovertemplate="step %{y}: full refresh (every position recomputed)<extra></extra>",
    ))
    position_axis(fig, n)
    step_axis(fig, len(steps))
    _drift_probes(fig, trace, steps)
    return styled(fig, title)


# Why a cell is left white (NaN in every layer), by view: said in the legend where such cells occur.
WHITE_CELLS = {"drift": "white: nothing cached (first forward, evicted)", "true_drift": "white: no earlier exact K/V",
               "cache_error": "white: no exact K/V this step"}


LATER_BLOCKS = "; a later block: not in the sequence yet"  # said too on a block-diffusion run


def _nothing_to_compare(fig: go.Figure, name: str, *layers: np.ndarray) -> None:
    """A legend entry for the cells left white, where there are any: a white square outlined, as
    the cells look, named with why they are white."""
    white = np.ones(layers[0].shape, dtype=bool)
    for layer_values in layers:
        white &= np.isnan(layer_values)
    if white.any():
        fig.add_trace(go.Scatter(
            x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
            marker={"symbol": "square", "size": 12, "color": "#ffffff", "line": {"color": "#888", "width": 1}},
        ))


PROBE_COLUMN = 0.2  # the share of the figure's width the drift probes' column takes


def _drift_probes(fig: go.Figure, trace: Trace, steps: list[dict]) -> None:
    """drift_refresh's attention-drift probe of each step, and what it decided, in a column of its
    own right of the grid (same step axis): the cosine on x, γ as a dashed line, so a reader sees
    the drift fall towards γ and the refresh it triggers."""
    probes = [(i, s["policy"]["drift"], bool(s["policy"].get("refresh_next")))
              for i, s in enumerate(steps) if (s.get("policy") or {}).get("drift") is not None]
    if not probes:
        return
    gamma = setting(trace, "gamma", float, "cache_params")
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
        fig.add_trace(go.Scatter(x=[gamma, gamma], y=cell_range(len(steps)), mode="lines", xaxis="x2",
                                 name=f"γ {gamma}", line={"color": "#e4572e", "dash": "dash", "width": 1.5},
                                 hoverinfo="skip"))
    fig.update_layout(
        xaxis={"domain": [fig.layout.xaxis.domain[0] if fig.layout.xaxis.domain else 0, 1 - PROBE_COLUMN - 0.03]},
        xaxis2={"domain": [1 - PROBE_COLUMN, 1], "anchor": "y", "range": [low - pad, 1 + pad / 3],
                "title": {"text": "attention cos"}, "nticks": 3, "tickformat": ".2f"},
    )
