"""The Tune tab's figures: a sweep's accuracy against speed (with its table rows) and the cost
model's throughput against concurrent requests. Report or rows in, plotly figure out."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from dllm_local.experiments.frontier import AUP_CUT, policy_curves

from .figure_style import message_figure, styled


# ----------------------------------------------------------------------------- tuning

def wilson_interval(correct: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share ``correct`` of ``n`` (sound at 0% and 100%)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (correct + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (correct * (1 - correct) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def _point_label(point: dict) -> str:
    short = {"threshold": "τ", "block_size": "B"}
    return " · ".join(f"{short.get(k, k)} {v}" for k, v in point.items())


# Label placement works in pixels of the plot area, which the page sizes to its column: a width
# below the plot's at 1280 px keeps the estimate on the safe side.
PLOT_PX = (1000, 340)
LABEL_PX = (7.8, 19)  # per character at 14 px, and the line's height
MARKER_PX = 9
# (where, the box's left and bottom edges relative to the point, in label widths/heights and marker
# radii): the first place that fits wins, so most labels sit above their point.
_PLACES = [("top center", (-0.5, 0), (0, 1)), ("bottom center", (-0.5, 0), (-1, -1)),
           ("middle right", (0, 1), (-0.5, 0)), ("middle left", (-1, -1), (-0.5, 0)),
           ("top right", (0, 0), (0, 1)), ("top left", (-1, 0), (0, 1)),
           ("bottom right", (0, 0), (-1, -1)), ("bottom left", (-1, 0), (-1, -1))]
_X_ANCHOR, _Y_ANCHOR = {-0.5: "center", 0: "left", -1: "right"}, {-0.5: "middle", 0: "bottom", -1: "top"}


def _label(x: float, y: float, text: str, place: str) -> dict:
    """An annotation for a label at a place of :data:`_PLACES`: on a white ground, so that error bars
    and the frontier line do not cross its letters."""
    (wx, rx), (hy, ry) = next((w, h) for name, w, h in _PLACES if name == place)
    return {"x": x, "y": y, "text": text, "showarrow": False, "font": {"size": 14},
            "xanchor": _X_ANCHOR[wx], "yanchor": _Y_ANCHOR[hy], "xshift": rx * MARKER_PX, "yshift": ry * MARKER_PX,
            "bgcolor": "rgba(255,255,255,0.85)", "borderpad": 0}


def place_labels(xs: list[float], ys: list[float], labels: list[str], x_range: list[float],
                 y_range: list[float]) -> list[str | None]:
    """A place of :data:`_PLACES` for each point's label such that no two labels overlap, none covers a marker
    and all stay inside the plot area; None where no place fits (the label is then hover-only)."""
    (width, height), (char, line), r = PLOT_PX, LABEL_PX, MARKER_PX

    def px(x: float, y: float) -> tuple[float, float]:
        return ((x - x_range[0]) / (x_range[1] - x_range[0]) * width,
                (y - y_range[0]) / (y_range[1] - y_range[0]) * height)

    centres = [px(x, y) for x, y in zip(xs, ys)]
    taken = [(cx - r, cy - r, cx + r, cy + r) for cx, cy in centres]  # the markers, then each placed label

    def free(box: tuple[float, float, float, float]) -> bool:
        inside = box[0] >= 0 and box[1] >= 0 and box[2] <= width and box[3] <= height
        return inside and not any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in taken)

    places: list[str | None] = []
    for (cx, cy), text in zip(centres, labels):
        w, h = char * len(text) + 4, line
        places.append(None)
        for name, (wx, rx), (hy, ry) in _PLACES:
            box = (cx + wx * w + rx * r, cy + hy * h + ry * r)
            box = (*box, box[0] + w, box[1] + h)
            if free(box):
                taken.append(box)
                places[-1] = name
                break
    return places


def sweep_figure(report: dict) -> go.Figure:
    """Accuracy (with its 95% interval over each point's n problems) against answer tokens/s for
    every sweep point, each labelled with its knobs, and every added result (an lm-eval run,
    another sweep) as a diamond labelled with its source; the Pareto frontier joined by a line.
    The axes zoom to the data; a label that would overlap another or leave the plot is shown on
    hover only (the title says so)."""
    rows = report.get("rows") or []
    title = "Sweep: accuracy vs speed (red: Pareto frontier)"
    if not rows:
        return message_figure("no sweep points yet", title)
    n = int(report.get("problems") or 0)
    accuracy = [r["accuracy"] for r in rows]
    speed = [r["model_tok_s"] for r in rows]
    low, high = zip(*(wilson_interval(a, int(r.get("n") or n)) for a, r in zip(accuracy, rows)))
    span = max(0.05, max(high) - min(low))
    y_range = [max(-0.02, min(low) - 0.1 * span), min(1.05, max(high) + 0.15 * span)]
    x_span = max(max(speed) - min(speed), 0.1 * max(speed), 1e-6)
    x_range = [min(speed) - 0.08 * x_span, max(speed) + 0.08 * x_span]
    labels = [" · ".join(filter(None, [r.get("label"), _point_label(r["point"])])) for r in rows]
    # The frontier's labels are placed first: they are the ones a reader looks for.
    order = sorted(range(len(rows)), key=lambda i: not rows[i]["pareto"])
    placed = place_labels([speed[i] for i in order], [accuracy[i] for i in order], [labels[i] for i in order],
                          x_range, y_range)
    places = dict(zip(order, placed))
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=speed, y=accuracy, mode="markers", name="points", hovertext=labels,
        error_y={"type": "data", "symmetric": False, "array": [h - a for h, a in zip(high, accuracy)],
                 "arrayminus": [a - lo for a, lo in zip(accuracy, low)], "color": "#aaa", "thickness": 1.5},
        marker={"size": 12, "color": ["#e4572e" if r["pareto"] else "#888" for r in rows],
                "symbol": ["diamond" if r.get("label") else "circle" for r in rows]},
        hovertemplate="%{hovertext}<br>%{x:.1f} tok/s · accuracy %{y:.0%}<extra></extra>",
    ))
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["model_tok_s"])
    fig.add_trace(go.Scatter(x=[r["model_tok_s"] for r in front], y=[r["accuracy"] for r in front], mode="lines",
                             name="Pareto frontier", line={"color": "#e4572e", "width": 2}, hoverinfo="skip"))
    for i, place in places.items():
        if place:
            fig.add_annotation(**_label(speed[i], accuracy[i], labels[i], place))
    fig.update_xaxes(title="answer tokens / s (model time, one pass over the problems: speed varies run to run)",
                     range=x_range)
    sizes = sorted({int(r.get("n") or n) for r in rows})
    fig.update_yaxes(title=f"accuracy (n = {', '.join(map(str, sizes))}, bars: 95% interval)", tickformat=".0%",
                     range=y_range)
    hidden = sum(place is None for place in placed)
    if hidden:
        title += f" · {hidden} crowded label{'s' if hidden > 1 else ''}: hover the point"
    return styled(fig, title, height=420)


PALETTE = ("#2a6fdb", "#e4572e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")  # one colour per policy


def aup_figure(report: dict) -> go.Figure:
    """Each policy's curve of accuracy against content tokens per forward (its points that no other
    of its points beats on both), named with its AUP: the area under the curve, accuracy weighted
    down where it falls below the best (d3LLM's accuracy under parallelism). Points more than 5
    below the policy's best are drawn hollow on a dotted line: the AUP does not count them."""
    title = (f"Accuracy under parallelism (AUP in the legend) · hollow: more than {AUP_CUT:g} points below the "
             "policy's best, not counted")
    curves = policy_curves(report.get("rows") or [])
    if not curves:
        return message_figure("no sweep points yet", title)
    fig = go.Figure()
    for k, (policy, curve) in enumerate(curves.items()):
        colour = PALETTE[k % len(PALETTE)]
        x, y, counted = curve["tau_content"], [a / 100 for a in curve["accuracy"]], curve["counted"]
        hover = "%{x:.2f} content tokens / forward · accuracy %{y:.1%}"
        if counted < len(x):  # drawn first, under the counted part: its first point is the last counted one
            fig.add_trace(go.Scatter(
                x=x[counted - 1:], y=y[counted - 1:], mode="lines+markers", legendgroup=policy, showlegend=False,
                line={"color": colour, "dash": "dot"},
                marker={"size": 10, "color": "white", "line": {"color": colour, "width": 2}},
                hovertemplate=hover + "<br>not counted in the AUP<extra></extra>"))
        fig.add_trace(go.Scatter(x=x[:counted], y=y[:counted], mode="lines+markers", showlegend=True,
                                 name=f"{policy}: AUP {curve['aup']:.1f}", legendgroup=policy,
                                 line={"color": colour}, marker={"size": 11, "color": colour},
                                 hovertemplate=hover + "<extra></extra>"))
    fig.update_xaxes(title="content tokens per forward (end-of-text padding not counted)", rangemode="tozero")
    fig.update_yaxes(title="accuracy", tickformat=".0%")
    styled(fig, title, height=380)
    fig.update_layout(legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01})
    return fig


SWEEP_TABLE_HEADERS = ["source", "knobs", "accuracy", "tok/s", "NFE", "content τ", "pareto"]


def percent(share: float) -> str:
    """A share as the chart's axis shows it: 0.9 → "90%", 0.925 → "92.5%"."""
    return f"{100 * share:.1f}".rstrip("0").rstrip(".") + "%"


def sweep_table(report: dict) -> list[list]:
    """Rows for the sweep table (:data:`SWEEP_TABLE_HEADERS`): one per point, where it came from
    and its knobs first, whatever knobs the sweep or the added report varied."""
    return [[r.get("label") or "sweep", _point_label(r["point"]), percent(r["accuracy"]), round(r["model_tok_s"], 1),
             round(r["nfe"], 1), round(r["tau_content"], 2) if "tau_content" in r else "", "yes" if r["pareto"] else ""]
            for r in report.get("rows") or []]



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
