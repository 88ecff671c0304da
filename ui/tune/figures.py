"""The Tune tab's figures: a sweep's accuracy against speed (with its table rows) and the cost
model's throughput against concurrent requests. Report or rows in, plotly figure out."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from ..parts.figure_style import message_figure, styled
from .labels import Canvas, annotation, place_labels


# ----------------------------------------------------------------------------- tuning

def wilson_interval(correct: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share ``correct`` of ``n`` (sound at 0% and 100%)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (correct + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (correct * (1 - correct) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def point_label(point: dict) -> str:
    """A point's knobs, short: {"threshold": 0.9, "block_size": 32} -> "τ 0.9 · B 32"."""
    short = {"threshold": "τ", "block_size": "B"}
    return " · ".join(f"{short.get(k, k)} {v}" for k, v in point.items())


def row_label(row: dict) -> str:
    """A row's source (for an added report) and knobs."""
    return " · ".join(filter(None, [row.get("label"), point_label(row["point"])]))


def frontier_keys(rows: list[dict]) -> dict[int, int]:
    """Row index -> its number on the chart and in the table: the Pareto points, slowest first."""
    front = sorted((i for i, r in enumerate(rows) if r.get("pareto")), key=lambda i: (rows[i]["model_tok_s"], i))
    return {i: k for k, i in enumerate(front, start=1)}


FRONTIER, BEATEN, KEY_SIZE = "#e4572e", "#999999", 18


def sweep_figure(report: dict) -> go.Figure:
    """Accuracy (with its 95% interval over each point's n problems) against answer tokens/s. The
    Pareto points are red and numbered, joined by a line, their knobs in the key on the right;
    the points they beat are grey, their knobs on hover and in the table. An added result (an
    lm-eval run, another sweep) is a diamond.

    Only the frontier is labelled, by number: full labels on every point collide with each other,
    the error bars and the line as soon as a dozen points share a corner, worse at a lecture's font
    scale; a number needs a few pixels beside its point, found clear of every marker, bar and line
    (:mod:`ui.tune.labels`), and the key, outside the plot, crosses nothing."""
    rows = report.get("rows") or []
    # The frontier is of accuracy and forwards (``frontier.pareto``): the x axis's tokens/s is measured, noisy.
    title = ("Sweep: accuracy vs speed · red, numbered: the frontier (no point as accurate in fewer forwards) · "
             "grey: beaten (hover: knobs)")
    if not rows:
        return message_figure("no sweep points yet", title)
    n = int(report.get("problems") or 0)
    accuracy = [r["accuracy"] for r in rows]
    speed = [r["model_tok_s"] for r in rows]
    low, high = zip(*(wilson_interval(a, int(r.get("n") or n)) for a, r in zip(accuracy, rows)))
    span = max(0.05, max(high) - min(low))
    y_range = [max(-0.02, min(low) - 0.1 * span), min(1.05, max(high) + 0.15 * span)]
    x_span = max(max(speed) - min(speed), 0.1 * max(speed), 1e-6)
    x_range = [min(speed) - 0.08 * x_span, max(speed) + 0.12 * x_span]
    labels = [row_label(r) for r in rows]
    keys = frontier_keys(rows)
    front = list(keys)  # slowest first: the line's order
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[speed[i] for i in front], y=[accuracy[i] for i in front], mode="lines",
                             name="Pareto frontier", line={"color": FRONTIER, "width": 2}, hoverinfo="skip"))

    def points(members: list[int], name: str, colour: str, **trace) -> go.Scatter:
        return go.Scatter(
            x=[speed[i] for i in members], y=[accuracy[i] for i in members], mode="markers", name=name,
            hovertext=[labels[i] for i in members],
            error_y={"type": "data", "symmetric": False, "array": [high[i] - accuracy[i] for i in members],
                     "arrayminus": [accuracy[i] - low[i] for i in members], "color": colour, "thickness": 1.5},
            marker={"size": 14, "color": colour, "symbol": ["diamond" if rows[i].get("label") else "circle"
                                                             for i in members]},
            hovertemplate="%{hovertext}<br>%{x:.1f} tok/s · accuracy %{y:.0%}<extra></extra>", **trace)

    beaten = [i for i in range(len(rows)) if i not in keys]
    if beaten:
        fig.add_trace(points(beaten, f"{len(beaten)} beaten: as accurate or more in fewer forwards, or more accurate in as few · hover", BEATEN))
    for i, k in keys.items():
        fig.add_trace(points([i], f"{k}  {labels[i]}", FRONTIER, legendgroup="front"))
    canvas = Canvas(x_range, y_range)
    places = place_labels(canvas, [(speed[i], accuracy[i]) for i in front], [str(k) for k in keys.values()],
                          KEY_SIZE, bars=[(speed[i], low[i], high[i]) for i in range(len(rows))],
                          lines=list(zip([(speed[i], accuracy[i]) for i in front],
                                         [(speed[i], accuracy[i]) for i in front[1:]])),
                          others=[(speed[i], accuracy[i]) for i in beaten])
    for i, place in zip(front, places):
        # A number with no free side still goes top right: the key must name every red point.
        fig.add_annotation(**annotation(speed[i], accuracy[i], str(keys[i]), place or "top right", KEY_SIZE,
                                        FRONTIER))
    fig.update_xaxes(title="answer tokens / s (model time, one pass over the problems: speed varies run to run)",
                     range=x_range)
    sizes = sorted({int(r.get("n") or n) for r in rows})
    fig.update_yaxes(title=f"accuracy (n = {', '.join(map(str, sizes))}, bars: 95% interval)", tickformat=".0%",
                     range=y_range)
    styled(fig, title, height=420, legend_below=False)
    fig.update_layout(legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01,
                              "title": {"text": "Pareto points"}})
    return fig


SWEEP_TABLE_HEADERS = ["source", "knobs", "accuracy", "tok/s", "NFE", "content τ", "Pareto #"]


def percent(share: float) -> str:
    """A share as the chart's axis shows it: 0.9 → "90%", 0.925 → "92.5%"."""
    return f"{100 * share:.1f}".rstrip("0").rstrip(".") + "%"


def sweep_table(report: dict) -> list[list]:
    """Rows for the sweep table (:data:`SWEEP_TABLE_HEADERS`): one per point, where it came from
    and its knobs first, whatever knobs the sweep or the added report varied; a Pareto point's
    number as the chart shows it."""
    rows = report.get("rows") or []
    keys = frontier_keys(rows)
    return [[r.get("label") or "sweep", point_label(r["point"]), percent(r["accuracy"]), round(r["model_tok_s"], 1),
             round(r["nfe"], 1), round(r["tau_content"], 2) if "tau_content" in r else "", keys.get(i, "")]
            for i, r in enumerate(rows)]


# ----------------------------------------------------------------------------- concurrency

_DIFFUSION_COLOUR, _AR_COLOUR = "#e4572e", "#2a6fdb"


def _requests(value: float) -> str:
    """A count of requests as the write-up says it ("about 9"), a decimal kept below 5."""
    return f"{value:.0f}" if value >= 5 else f"{value:.1f}"


def _si(value: float) -> str:
    """20, 500, 2k, 50k, 1M: tick labels short enough to read from afar."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def concurrency_line(crossovers: dict) -> str:
    """The two turning points of :func:`concurrency_figure` in one sentence, for under the plot."""
    def about(value: float) -> str:
        rounded = _requests(value)
        return f"≈ {rounded}" + ("" if rounded == f"{value:.1f}" else f" ({value:.1f})")

    saturates, overtakes = crossovers["diffusion_saturates"], crossovers["ar_overtakes"]
    first = f"Diffusion saturates at {about(saturates)} concurrent requests"
    if crossovers.get("ar_leads_until", 0) > 0:  # a mixture of experts: one AR token reads only its own experts
        first = f"AR leads below {about(crossovers['ar_leads_until'])} requests; {first[0].lower()}{first[1:]}"
    if math.isinf(overtakes):
        return f"{first}; AR never overtakes it (τ ≥ G: diffusion's ceiling is not below AR's)."
    if overtakes <= 0:
        return f"{first}; AR is ahead at every concurrency (τ ≤ 1: no more tokens per forward than AR)."
    return f"{first}; AR overtakes at {about(overtakes)}."


def concurrency_figure(rows: list[dict], crossovers: dict, title: str = "Throughput against concurrent requests",
                       height: int = 420) -> go.Figure:
    """Tokens/s of all requests together against concurrent requests, diffusion and AR, from the
    rows of ``costmodel.concurrency_curve`` and the points of ``costmodel.concurrency_crossovers``.

    Both axes are logarithmic (x in powers of two): at low concurrency both lines rise with slope
    one, τ apart; diffusion flattens first, and the vertical markers name where it saturates and
    where AR overtakes (and, in grey, where AR saturates too).
    """
    if not rows:
        return message_figure("no concurrency levels", title)
    xs = [r["concurrency"] for r in rows]
    fig = go.Figure()
    for key, name, colour in (("diffusion", "diffusion", _DIFFUSION_COLOUR), ("ar", "autoregressive", _AR_COLOUR)):
        fig.add_trace(go.Scatter(
            x=xs, y=[r[f"{key}_tokens_per_s"] for r in rows], mode="lines", name=name,
            line={"color": colour, "width": 4},
            customdata=[[r[f"{key}_ms_per_token"], r[f"{key}_bound"]] for r in rows],
            hovertemplate=(f"{name}<br>%{{x}} requests: %{{y:,.0f}} tokens/s<br>"
                           "%{customdata[0]:.2f} ms per token per request (%{customdata[1]}-bound)<extra></extra>"),
        ))
    y_all = [r[f"{k}_tokens_per_s"] for r in rows for k in ("diffusion", "ar")]
    low, high = min(y_all), max(y_all)
    # Labels right of their markers, where the curves are not: both rise to the right, so the top
    # left and the bottom right are empty. (x, label, colour, height on the plot)
    markers = [(crossovers["diffusion_saturates"], f"diffusion saturates ≈ {_requests(crossovers['diffusion_saturates'])}",
                _DIFFUSION_COLOUR, 0.97),
               (crossovers["ar_overtakes"], f"AR overtakes ≈ {_requests(crossovers['ar_overtakes'])}", _AR_COLOUR, 0.06),
               (crossovers.get("ar_saturates"), f"AR saturates ≈ {_requests(crossovers.get('ar_saturates') or 0)}",
                "#777777", 0.22)]
    for x, label, colour, y in markers:
        if x is None or not min(xs) <= x <= max(xs):  # inf (never) and 0 (always) get no marker
            continue
        fig.add_trace(go.Scatter(x=[x, x], y=[low, high], mode="lines", showlegend=False, hoverinfo="skip",
                                 line={"color": colour, "width": 2, "dash": "dash"}))
        # Annotations on a log axis are placed at log10 of the value.
        fig.add_annotation(x=math.log10(x), y=y, xref="x", yref="paper", text=f"<b>{label}</b>", showarrow=False,
                           xanchor="left", xshift=4, font={"size": 16, "color": colour},
                           bgcolor="rgba(255,255,255,0.85)")
    top = max(xs)
    ticks = [2**k for k in range(int(math.log2(top)) + 1)]
    fig.update_xaxes(type="log", title="concurrent requests (B)", tickvals=ticks, ticktext=[str(t) for t in ticks])
    # 1-2-5 ticks: plotly's own on a short log range label every digit and crowd the axis.
    y_ticks = [m * 10**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    fig.update_yaxes(type="log", title="tokens / s (all requests)", tickvals=y_ticks, ticktext=[_si(v) for v in y_ticks])
    fig = styled(fig, title, height=height)
    fig.update_layout(legend={"font": {"size": 15}})
    return fig
