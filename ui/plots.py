"""Pure views of a decoding trace: trace dict in, plotly figure (or HTML / dict) out.

The page imports this module, so it must stay torch-free: stdlib, plotly and html only.
A trace is the plain dict of ``dllm_local.trace.Trace.to_dict()`` (or its JSON). Plots show the
answer region only: x = answer position ``0..gen_length-1`` = absolute position - len(prompt_ids).
``upto_step`` everywhere is a 0-based step index (inclusive); ``None`` means every recorded step,
so a live page can redraw the same trace as it grows.
"""
from __future__ import annotations

import html
import re
from typing import Any

import numpy as np
import plotly.graph_objects as go

__all__ = [
    "CAPTIONS", "state_at", "token_grid_html", "confidence_heatmap", "kv_heatmap",
    "cache_panel", "numbers", "numbers_html", "compare",
]

Trace = dict[str, Any]
NAN = float("nan")
HEIGHT = 330
KV_VIEWS = ("drift", "true_drift", "cache_error")
SUMMARY_MESSAGE = "per-position KV data needs trace level 'full'"
EMPTY_MESSAGE = "no steps yet"

CAPTIONS: dict[str, str] = {
    "token_grid": "Each box is one answer position: colour says when (or how confidently) it was committed; "
                  "outlined boxes were committed in this step, grey boxes are still masked.",
    "confidence": "Each row is one forward: colour is the model's confidence at still-masked positions, "
                  "x marks a commit; a policy that commits early on bright cells saves steps.",
    "kv": "Bright cells: the position's K/V barely moved since it was last computed; grey: reused from cache; "
          "refresh rows show how stale the cache had become.",
    "cache": "Bars: positions recomputed per forward (G); lines: share of K/V read from cache, per step and "
             "cumulative; fewer recomputes at a high hit rate is where the speedup comes from.",
}


# ----------------------------------------------------------------------------- helpers

def _steps(trace: Trace, upto_step: int | None = None) -> list[dict]:
    steps = trace.get("steps") or []
    if upto_step is None:
        return list(steps)
    return list(steps[: max(0, int(upto_step) + 1)])


def _prompt_len(trace: Trace) -> int:
    return len(trace.get("prompt_ids") or [])


def _gen_length(trace: Trace) -> int:
    return int(trace.get("gen_length") or (trace.get("settings") or {}).get("gen_length") or 0)


def _num(value: Any) -> float:
    """None (JSON null: nothing recorded) becomes NaN so plotly leaves a gap."""
    return NAN if value is None else float(value)


def _style(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    # A white style set directly: applying a named template costs ~20 ms per figure per redraw.
    fig.update_xaxes(gridcolor="#ebebeb", linecolor="#cccccc")
    fig.update_yaxes(gridcolor="#ebebeb", linecolor="#cccccc")
    fig.update_layout(
        template=None, plot_bgcolor="white", paper_bgcolor="white", font={"color": "#2a3f5f"},
        height=height, title={"text": title, "font": {"size": 14}, "x": 0.01},
        margin={"l": 55, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
    )
    return fig


def _message_figure(message: str, title: str = "") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _style(fig, title)


def _step_axis(fig: go.Figure, n_steps: int, **kwargs) -> None:
    # Time runs downwards, like reading the decode from top to bottom.
    fig.update_yaxes(title_text="step", autorange="reversed", zeroline=False,
                     dtick=1 if n_steps <= 24 else None, **kwargs)


def _token_text(trace: Trace, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return (trace.get("vocab") or {}).get(str(token_id), f"#{token_id}")


def _visible(text: str) -> str:
    """Whitespace made visible so a token that is a space or newline still shows up."""
    if text == "":
        return "∅"
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


_SPECIAL = re.compile(r"\s*(<\|[^|]*\|>|</s>|<eos>|<pad>)\s*")


def _attr(text: str) -> str:
    """Escape for a double-quoted attribute; apostrophes stay readable in the hover text."""
    return html.escape(text, quote=False).replace('"', "&quot;")


def _is_end_token(trace: Trace, token_id: int | None) -> bool:
    if token_id is None:
        return False
    if token_id in ((trace.get("model") or {}).get("stop_ids") or []):
        return True
    text = _token_text(trace, token_id)
    return bool(_SPECIAL.fullmatch(text)) and any(w in text.lower() for w in ("end", "eot", "eos", "pad", "/s"))


def _interp(stops: list[tuple[int, int, int]], t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = stops[i], stops[i + 1]
    return tuple(round(a[k] + (b[k] - a[k]) * f) for k in range(3))  # type: ignore[return-value]


# Light -> dark blue for "when" (sequential), red -> yellow -> green for "how sure".
_STEP_STOPS = [(222, 235, 247), (158, 202, 225), (66, 146, 198), (8, 81, 156), (8, 48, 107)]
_CONF_STOPS = [(215, 48, 39), (252, 141, 89), (254, 224, 139), (145, 207, 96), (26, 152, 80)]


def _css(rgb: tuple[int, int, int]) -> str:
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def _text_colour(rgb: tuple[int, int, int]) -> str:
    luminance = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return "#fff" if luminance < 140 else "#111"


# ----------------------------------------------------------------------------- state

def state_at(trace: Trace, step: int) -> dict:
    """The answer region as it stood after step ``step`` (inclusive; -1 = before any step).

    Returns ``ids`` (token id or None while masked), ``commit_step`` (step that committed each
    position, or None), ``confidence`` (confidence at commit, or None), ``step`` (the step shown,
    clamped to the recorded range) and ``masked`` (count of still-masked positions).
    """
    P, n = _prompt_len(trace), _gen_length(trace)
    steps = trace.get("steps") or []
    step = max(-1, min(int(step), len(steps) - 1))
    ids: list[int | None] = [None] * n
    commit_step: list[int | None] = [None] * n
    confidence: list[float | None] = [None] * n
    for index, record in enumerate(steps[: step + 1]):
        for position, token, conf in record.get("committed") or []:
            p = int(position) - P
            if 0 <= p < n:
                ids[p], commit_step[p], confidence[p] = int(token), index, float(conf)
    return {"ids": ids, "commit_step": commit_step, "confidence": confidence, "step": step,
            "masked": sum(t is None for t in ids)}


# ----------------------------------------------------------------------------- token grid

def token_grid_html(trace: Trace, step: int, color_by: str = "step") -> str:
    """HTML boxes for the answer region after ``step``; ``color_by`` is "step" or "confidence"."""
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', not {color_by!r}")
    state = state_at(trace, step)
    shown = state["step"]
    last = max(1, len(trace.get("steps") or []) - 1)  # palette spans the whole run: stable colours while scrubbing
    box = ("display:inline-block;margin:2px;padding:1px 5px;border-radius:4px;font-family:ui-monospace,monospace;"
           "font-size:13px;white-space:pre;min-width:1.2em;text-align:center;")
    boxes = []
    for p, (token, s, conf) in enumerate(zip(state["ids"], state["commit_step"], state["confidence"])):
        if token is None:
            title = f"pos {p} · masked"
            boxes.append(f'<span class="dl-tok dl-masked" title="{_attr(title)}" '
                         f'style="{box}background:#e5e5e5;color:#888;">▢</span>')
            continue
        vis = _visible(_token_text(trace, token))
        rgb = _interp(_CONF_STOPS, conf) if color_by == "confidence" else _interp(_STEP_STOPS, 0.1 + 0.9 * s / last)
        style = f"{box}background:{_css(rgb)};color:{_text_colour(rgb)};"
        classes = ["dl-tok"]
        if s == shown:
            style += "outline:2px solid #e4572e;outline-offset:-1px;"
            classes.append("dl-new")
        if _is_end_token(trace, token):
            style += "opacity:0.35;"
            classes.append("dl-end")
        title = f"pos {p} · token '{vis}' · step {s} · confidence {conf:.2f}"
        boxes.append(f'<span class="{" ".join(classes)}" title="{_attr(title)}" style="{style}">'
                     f"{html.escape(vis)}</span>")
    swatch = "display:inline-block;width:1.1em;height:0.9em;border-radius:3px;vertical-align:middle;margin:0 3px;"
    if color_by == "confidence":
        scale = (f'<span style="{swatch}background:{_css(_CONF_STOPS[0])}"></span>low → high confidence at commit'
                 f'<span style="{swatch}background:{_css(_CONF_STOPS[-1])}"></span>')
    else:
        scale = (f'<span style="{swatch}background:{_css(_interp(_STEP_STOPS, 0.1))}"></span>step 0 → step {last}'
                 f'<span style="{swatch}background:{_css(_interp(_STEP_STOPS, 1.0))}"></span>')
    committed = len(state["ids"]) - state["masked"]
    where = "before any step" if shown < 0 else f"after step {shown}"
    legend = (f'<div class="dl-legend" style="font-size:12px;color:#555;margin-top:4px;">'
              f"{where} · {committed}/{len(state['ids'])} committed · {scale} · "
              f'<span style="{swatch}outline:2px solid #e4572e;"></span>committed this step · '
              f'<span style="{swatch}background:#e5e5e5;"></span>masked · faded: end of text</div>')
    return f'<div class="dl-grid" style="line-height:1.9;">{"".join(boxes)}</div>{legend}'


# ----------------------------------------------------------------------------- confidence

def confidence_heatmap(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """y = step, x = answer position, z = confidence at still-masked positions scored that step.

    Cells that were not scored (already committed, or outside the forward) are NaN; an "x" marks
    each commit at (position, step of commit).
    """
    title = "Confidence at masked positions"
    steps = _steps(trace, upto_step)
    if not steps:
        return _message_figure(EMPTY_MESSAGE, title)
    P, n = _prompt_len(trace), _gen_length(trace)
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
            ctext.append(f"commit '{html.escape(_visible(_token_text(trace, token)))}' · confidence {conf:.3f}")
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
    fig.update_xaxes(title_text="answer position", range=[-0.5, n - 0.5])
    _step_axis(fig, len(steps))
    return _style(fig, title)


# ----------------------------------------------------------------------------- KV

def _kv_rows(trace: Trace, steps: list[dict], layer: str, which: str, view: str):
    """Per-step rows of the chosen view plus, for "drift", the rows of reused (cached) cells."""
    P, n = _prompt_len(trace), _gen_length(trace)
    values = np.full((len(steps), n), NAN, dtype=np.float32)
    cached = np.full((len(steps), n), NAN, dtype=np.float32)
    for i, record in enumerate(steps):
        if view == "drift":
            recomputed = record.get("recomputed") or []
            cos = ((record.get("kv") or {}).get(layer) or {}).get(which) or []
            cached[i] = 1.0  # reused, except where this step recomputed
            for j, position in enumerate(recomputed):
                p = int(position) - P
                if 0 <= p < n:
                    # null or absent (kv == {}): the cache held nothing there yet
                    values[i, p] = _num(cos[j] if j < len(cos) else None)
                    cached[i, p] = NAN
        else:
            exact = record.get("exact") or {}
            key = "true_drift" if view == "true_drift" else "cache_vs_exact"
            cos = ((exact.get(key) or {}).get(layer) or {}).get(which) or []
            for p, c in enumerate(cos[P:P + n]):
                values[i, p] = _num(c)
    return values, cached


def kv_heatmap(trace: Trace, layer: int | str = 0, which: str = "k", upto_step: int | None = None,
               view: str = "drift") -> go.Figure:
    """KV cosine per (step, answer position) for one layer and K or V.

    view "drift": cosine between each recomputed entry and what the cache held (from ``kv``);
    positions reused from the cache are a flat grey layer (trace "cached"). view "true_drift":
    cosine between consecutive exact (uncached) K/V; view "cache_error": cosine between the cached
    and the exact entry; both come from ``exact`` and are NaN on steps without it. Full-refresh
    rows carry a "refresh" marker left of the grid (trace "refresh").
    """
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', not {which!r}")
    if view not in KV_VIEWS:
        raise ValueError(f"view must be one of {KV_VIEWS}, not {view!r}")
    layer = str(layer)
    names = {"drift": "KV drift", "true_drift": "True KV drift (exact)", "cache_error": "Cache vs exact"}
    title = f"{names[view]} · layer {layer} · {which.upper()}"
    steps = _steps(trace, upto_step)
    if not steps:
        return _message_figure(EMPTY_MESSAGE, title)
    if view == "drift":
        if not any(s.get("recomputed") is not None for s in steps):
            return _message_figure(SUMMARY_MESSAGE, title)
        if not any(layer in (s.get("kv") or {}) for s in steps):
            return _message_figure(f"layer {layer} is not in this trace", title)
    elif not any(s.get("exact") for s in steps):
        return _message_figure("exact-drift data needs the setting exact_drift on", title)
    n = _gen_length(trace)
    values, cached = _kv_rows(trace, steps, layer, which, view)
    data = values[np.isfinite(values)]
    # Cosines live near 1 and can dip below 0: start at 0.9 at most so small moves stay visible.
    zmin = max(-1.0, min(0.9, float(data.min()))) if data.size else 0.9
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
        z=values, x=columns, y=rows, name=view, zmin=zmin, zmax=1.0, colorscale="Viridis",
        hoverongaps=False, colorbar={"title": {"text": "cos"}, "thickness": 12},
        hovertemplate=f"pos %{{x}} · step %{{y}}<br>{label[view]} %{{z:.4f}}<extra></extra>", **gaps,
    ))
    refresh = [i for i, s in enumerate(steps) if s.get("full_refresh")]
    fig.add_trace(go.Scatter(
        x=[-1.0] * len(refresh), y=refresh, mode="markers", name="refresh", cliponaxis=False,
        marker={"symbol": "triangle-right", "size": 9, "color": "#e4572e"},
        hovertemplate="step %{y}: full refresh (every position recomputed)<extra></extra>",
    ))
    fig.update_xaxes(title_text="answer position", range=[-1.6, n - 0.5])
    _step_axis(fig, len(steps))
    return _style(fig, title)


# ----------------------------------------------------------------------------- cache

def cache_panel(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """Bars: G (positions recomputed) per step; lines: hit rate per step and cumulative (right axis)."""
    title = "Cache: recomputed positions and hit rate"
    steps = _steps(trace, upto_step)
    if not steps:
        return _message_figure(EMPTY_MESSAGE, title)
    x = np.arange(len(steps))
    g = np.array([int(s.get("g") or 0) for s in steps])
    reads = np.array([int(s.get("reads") or 0) for s in steps])
    seen = g + reads
    rate = np.divide(reads, seen, out=np.zeros(len(steps)), where=seen > 0)
    total_seen = np.cumsum(seen)
    cumulative = np.divide(np.cumsum(reads), total_seen, out=np.zeros(len(steps)), where=total_seen > 0)
    refresh = np.array([bool(s.get("full_refresh")) for s in steps])
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=x, y=g, name="G (recomputed)", marker_color=np.where(refresh, "#6a8fbf", "#a6c4e6"),
        customdata=np.where(refresh, "full refresh", "partial"),
        hovertemplate="step %{x}: G %{y} (%{customdata})<extra></extra>",
    ))
    # hit rates on a right-hand axis laid over the G axis (make_subplots cost a redraw 15 ms)
    fig.add_trace(go.Scatter(x=x, y=rate, name="hit rate", mode="lines+markers", line={"color": "#e4572e"},
                             yaxis="y2", hovertemplate="step %{x}: hit rate %{y:.0%}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=cumulative, name="cumulative", mode="lines", yaxis="y2",
                             line={"color": "#333", "dash": "dot"},
                             hovertemplate="up to step %{x}: %{y:.0%}<extra></extra>"))
    # the plot area leaves the right-hand axis room for its ticks and title, as make_subplots did
    fig.update_layout(xaxis={"title": {"text": "step"}, "dtick": 1 if len(steps) <= 24 else None, "domain": [0, 0.92]},
                      yaxis={"title": {"text": "G (positions)"}, "rangemode": "tozero"},
                      yaxis2={"title": {"text": "hit rate"}, "overlaying": "y", "side": "right", "range": [0, 1.02],
                              "tickformat": ".0%", "showgrid": False})
    return _style(fig, title)


# ----------------------------------------------------------------------------- numbers

def numbers(trace: Trace, upto_step: int | None = None) -> dict:
    """Headline numbers of the run up to ``upto_step``: a finished run's own ``stats`` when the
    view covers the whole run, else running values from the step records seen so far.

    Keys:
      steps            forwards recorded (rows of the trace) up to this point
      nfe              model forwards, verification included (sum of ``forwards``)
      committed        answer tokens committed so far (net of tokens taken back to mask)
      revisions        committed tokens taken back to mask so far (policies that revise)
      gen_length       size of the answer region
      tau              tokens committed per forward (committed / nfe)
      content_tau      content tokens (before the first EOS/EOT) per forward; None until finished
      content_tokens   content tokens; None until finished
      model_s          seconds inside the model (sum of ``model_ms``)
      other_s          seconds outside it: policies, sampling, bookkeeping (sum of ``other_ms``)
      exact_s          seconds of the exact-drift diagnostic, kept apart from both
      tokens_per_s     committed tokens per second of model time
      wall_s           stats.wall_s once finished, else model_s + other_s
      other_share      other_s / (model_s + other_s): the share of time the model is not running
      mean_g           mean positions recomputed per forward (G)
      hit_rate         cumulative cache hit rate: reads / (reads + G)
      finished         True when the whole recorded run is covered and its final stats exist
    """
    steps = _steps(trace, upto_step)
    stats = trace.get("stats") or {}
    finished = (len(steps) == len(trace.get("steps") or []) and bool(trace.get("final_ids"))
                and float(stats.get("wall_s") or 0.0) > 0)
    revisions = sum(len(s.get("revoked") or []) for s in steps)
    committed = sum(len(s.get("committed") or []) for s in steps) - revisions
    values = _final_numbers(stats) if finished else _running_numbers(steps, committed)
    busy = values["model_s"] + values["other_s"]
    return {"steps": len(steps), "committed": committed, "revisions": revisions, "gen_length": _gen_length(trace), **values,
            "other_share": values["other_s"] / busy if busy else 0.0, "finished": finished}


def _final_numbers(stats: dict) -> dict:
    return {"nfe": stats["nfe"], "tau": stats["tokens_per_forward"], "content_tau": stats["content_tokens_per_forward"],
            "content_tokens": stats["content_tokens"], "model_s": stats["model_s"], "other_s": stats["other_s"],
            "exact_s": stats["exact_s"], "tokens_per_s": stats["tokens_per_s"], "wall_s": stats["wall_s"],
            "mean_g": stats["mean_g"], "hit_rate": stats["cache_hit_rate"]}


def _running_numbers(steps: list[dict], committed: int) -> dict:
    """What the final stats say, for the records so far (content tokens are known only at the end)."""
    nfe = sum(int(s.get("forwards") or 0) for s in steps)
    model_s = sum(float(s.get("model_ms") or 0.0) for s in steps) / 1e3
    other_s = sum(float(s.get("other_ms") or 0.0) for s in steps) / 1e3
    g = sum(int(s.get("g") or 0) for s in steps)
    reads = sum(int(s.get("reads") or 0) for s in steps)
    return {"nfe": nfe, "tau": committed / nfe if nfe else 0.0, "content_tau": None, "content_tokens": None,
            "model_s": model_s, "other_s": other_s, "exact_s": sum(float(s.get("exact_ms") or 0.0) for s in steps) / 1e3,
            "tokens_per_s": committed / model_s if model_s else 0.0, "wall_s": model_s + other_s,
            "mean_g": g / len(steps) if steps else 0.0, "hit_rate": reads / (reads + g) if reads + g else 0.0}


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "—"
    return format(value, spec)


def numbers_html(nums: dict) -> str:
    """Compact cards of :func:`numbers`, each with its unit."""
    cards = [
        ("NFE", _fmt(nums.get("nfe"), "d"), "forwards"),
        ("committed", f"{_fmt(nums.get('committed'), 'd')}/{_fmt(nums.get('gen_length'), 'd')}", "tokens"),
        ("τ", _fmt(nums.get("tau"), ".2f"), "tokens / forward"),
        ("content τ", _fmt(nums.get("content_tau"), ".2f"), "content tokens / forward"),
        ("speed", _fmt(nums.get("tokens_per_s"), ".1f"), "tokens / s (model time)"),
        ("model", _fmt(None if nums.get("model_s") is None else nums["model_s"] * 1e3, ".0f"), "ms"),
        ("wall", _fmt(nums.get("wall_s"), ".2f"), "s" if nums.get("finished") else "s (model + other, so far)"),
        ("outside model", _fmt(nums.get("other_share"), ".0%"), "of time"),
        ("mean G", _fmt(nums.get("mean_g"), ".1f"), "positions / forward"),
        ("cache hits", _fmt(nums.get("hit_rate"), ".0%"), "cumulative"),
    ]
    if nums.get("revisions"):
        cards.insert(2, ("revisions", _fmt(nums["revisions"], "d"), "tokens taken back"))
    card = ("display:inline-block;margin:3px;padding:4px 8px;border:1px solid #ddd;border-radius:6px;"
            "min-width:6.5em;vertical-align:top;background:#fafafa;")
    body = "".join(
        f'<div class="dl-card" style="{card}"><div style="font-size:11px;color:#666;">{html.escape(label)}</div>'
        f'<div style="font-size:17px;font-weight:600;">{html.escape(value)}</div>'
        f'<div style="font-size:10px;color:#888;">{html.escape(unit)}</div></div>'
        for label, value, unit in cards
    )
    return f'<div class="dl-numbers">{body}</div>'


# ----------------------------------------------------------------------------- compare

def compare(trace_a: Trace, trace_b: Trace) -> dict:
    """How run b compares with run a (e.g. a = no cache, b = cached).

    Keys: ``speedup_wall`` and ``speedup_model`` (a's time / b's time: >1 means b is faster; None
    when b's time is 0), ``nfe_a``/``nfe_b``, ``tau_a``/``tau_b``, ``agreement`` (fraction of answer
    positions with equal final ids; positions only one run has count as different) and
    ``first_difference`` (first differing answer position, None when identical).
    """
    na, nb = numbers(trace_a), numbers(trace_b)
    ids_a, ids_b = list(trace_a.get("final_ids") or []), list(trace_b.get("final_ids") or [])
    length = max(len(ids_a), len(ids_b))
    same = sum(x == y for x, y in zip(ids_a, ids_b))
    first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), None)
    if first is None and len(ids_a) != len(ids_b):
        first = min(len(ids_a), len(ids_b))
    return {
        "speedup_wall": na["wall_s"] / nb["wall_s"] if nb["wall_s"] else None,
        "speedup_model": na["model_s"] / nb["model_s"] if nb["model_s"] else None,
        "nfe_a": na["nfe"], "nfe_b": nb["nfe"],
        "tau_a": na["tau"], "tau_b": nb["tau"],
        "agreement": same / length if length else 1.0,
        "first_difference": first,
    }


def compare_html(result: dict) -> str:
    """The :func:`compare` numbers as one small table."""
    def f(value: Any, spec: str) -> str:
        return _fmt(value, spec)

    rows = [
        ("speedup (wall)", f(result["speedup_wall"], ".2f") + "×"),
        ("speedup (model time)", f(result["speedup_model"], ".2f") + "×"),
        ("NFE A / B", f"{f(result['nfe_a'], 'd')} / {f(result['nfe_b'], 'd')}"),
        ("τ A / B", f"{f(result['tau_a'], '.2f')} / {f(result['tau_b'], '.2f')}"),
        ("token agreement", f(result["agreement"], ".1%")),
        ("first difference", "none" if result["first_difference"] is None else f"answer position {result['first_difference']}"),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>" for k, v in rows)
    return f'<table class="dl-compare">{body}</table>'


REQUIRED_KEYS = ("schema_version", "settings", "prompt_ids", "gen_length", "steps", "final_ids", "vocab", "stats")
SCHEMA_VERSION = 1


def check_trace(trace: Any) -> None:
    """Raise ValueError unless ``trace`` looks like an exported trace this page can replay."""
    if not isinstance(trace, dict):
        raise ValueError("not a trace: expected a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in trace]
    if missing:
        raise ValueError(f"not a trace: missing {', '.join(missing)}")
    if trace["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"trace schema version {trace['schema_version']} is not supported (this page reads {SCHEMA_VERSION})")
    if not trace["steps"]:
        raise ValueError("the trace has no steps")


# ----------------------------------------------------------------------------- tuning

def sweep_figure(report: dict) -> go.Figure:
    """Accuracy against tokens/s for every sweep point, the Pareto frontier joined by a line."""
    rows = report.get("rows") or []
    if not rows:
        return _message_figure("no sweep points yet", "Sweep: accuracy vs speed")
    label = [", ".join(f"{k}={v}" for k, v in r["point"].items()) for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r["model_tok_s"] for r in rows], y=[r["accuracy"] for r in rows], mode="markers", name="points",
        text=label, marker={"size": 10, "color": ["#e4572e" if r["pareto"] else "#888" for r in rows]},
        hovertemplate="%{text}<br>%{x:.1f} tok/s · accuracy %{y:.0%}<extra></extra>",
    ))
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["model_tok_s"])
    fig.add_trace(go.Scatter(x=[r["model_tok_s"] for r in front], y=[r["accuracy"] for r in front], mode="lines",
                             name="Pareto frontier", line={"color": "#e4572e", "dash": "dot"}, hoverinfo="skip"))
    fig.update_xaxes(title="content tokens / s (model time)")
    fig.update_yaxes(title="accuracy", tickformat=".0%", range=[-0.02, 1.02])
    return _style(fig, "Sweep: accuracy vs speed (red: Pareto frontier)")


def sweep_table(report: dict) -> list[list]:
    """Rows for the sweep table: one per point, knob values first."""
    rows = report.get("rows") or []
    axes = list(report.get("axes", {}))
    return [[r["point"][a] for a in axes] + [round(r["accuracy"], 4), round(r["model_tok_s"], 1), round(r["nfe"], 1),
                                             "yes" if r["pareto"] else ""] for r in rows]


def cost_table_html(rows: list[dict], device: str) -> str:
    """The cost-model rows as a table: predicted floor next to the measured step time."""
    head = ("<tr><th>strategy</th><th>G</th><th>step floor</th><th>bound</th><th>measured step</th>"
            "<th>speedup vs AR ≈ τ</th><th>compute-bound ratio ≈ τ/G</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['strategy'])}</td><td>{r['g']:.0f}</td><td>{r['floor_ms']:.3f} ms</td>"
        f"<td>{r['bound']}</td><td>{_fmt(r['measured_ms'], '.2f')}{' ms' if r['measured_ms'] is not None else ''}</td>"
        f"<td>{_fmt(r['speedup_low_batch'], '.2f')}</td><td>{_fmt(r['ratio_compute_bound'], '.3f')}</td></tr>"
        for r in rows
    )
    return (f'<div style="font-size:12px;color:#555;">Cost model on {html.escape(device)}: step floor = '
            f"max(weight bytes / bandwidth, G × 2 · params / FLOP rate)</div>"
            f'<table class="dl-cost" style="font-size:12px;">{head}{body}</table>')
