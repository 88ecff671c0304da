"""The Tune tab's AUP chart and sentence: each policy's accuracy against content tokens per forward,
the area its AUP measures shaded, every point accounted for. Report in, plotly figure or text out."""
from __future__ import annotations

import plotly.graph_objects as go

from dllm_local.analysis.frontier import AUP_ALPHA, AUP_CUT, PARALLELISM, aup_weight, policy_curves, policy_of

from ..parts.figure_style import message_figure, styled
from .figures import row_label

PALETTE = ("#2a6fdb", "#e4572e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")  # one colour per policy
BEATEN = "#999999"

# What an AUP is a number of, and the formula (frontier.aup), as the chart and the status line say them.
AUP_UNIT = "% × content tokens per forward: 100 = one token per forward at 100% accuracy"
AUP_FORMULA = (f"AUP = ρ₁y₁ + Σᵢ₌₂ (ρᵢ − ρᵢ₋₁)·(yᵢW(yᵢ) + yᵢ₋₁W(yᵢ₋₁))/2,   W(y) = min(e<sup>−{AUP_ALPHA:g}(1 − y/y_max)</sup>, 1)"
               f"   (y: accuracy in %, ρ: content tokens per forward, y_max: the best accuracy of all points;"
               f"<br>the points within {AUP_CUT:g} of the policy's best; d3LLM's accuracy under parallelism)")


def _tint(colour: str, alpha: float) -> str:
    """"#2a6fdb" at ``alpha`` as rgba: the fill alone see-through, for areas that overlap."""
    return f"rgba({int(colour[1:3], 16)},{int(colour[3:5], 16)},{int(colour[5:7], 16)},{alpha})"


def aup_meaning(aup: float) -> str:
    """"≈ 5.4 tokens / forward at 100%": an AUP read as the parallelism it equals at full accuracy."""
    return f"≈ {aup / 100:.1f} tokens / forward at 100%"


def aup_line(report: dict) -> str:
    """Each policy's accuracy under parallelism, with its unit and what it equals, for the status line."""
    curves = report.get("policies") or {}
    if not curves:
        return ""
    each = "; ".join(f"{p} {c['aup']:.1f} ({aup_meaning(c['aup'])})" for p, c in curves.items())
    return f"AUP (area under accuracy against content tokens per forward, in {AUP_UNIT}): {each}."


def aup_area(curve: dict, y_max: float) -> tuple[list[float], list[float]]:
    """The region whose area is the curve's AUP (accuracy in %): the rectangle ρ₁ × y₁, then the
    trapezoids under the weighted accuracies yW(y) of the counted points, as a closed outline."""
    rho, y = curve["tau_content"][:curve["counted"]], curve["accuracy"][:curve["counted"]]
    xs, ys = [0.0, 0.0, rho[0]], [0.0, y[0], y[0]]
    for r, a in zip(rho, y):
        xs.append(r)
        ys.append(a * aup_weight(a, y_max))
    return xs + [rho[-1], 0.0], ys + [0.0, 0.0]


def point_kinds(rows: list[dict], curves: dict[str, dict]) -> list[str]:
    """What the chart does with each row: "counted" (on its policy's curve, in the AUP), "cut" (on
    the curve, more than AUP_CUT below the policy's best), "beaten" (another point of its policy
    is as good on accuracy and content τ and better on one) or "undrawn" (no content τ)."""
    kinds = []
    for row in rows:
        tau = row.get(PARALLELISM)
        if not isinstance(tau, (int, float)) or tau <= 0:
            kinds.append("undrawn")
            continue
        curve = curves[policy_of(row)]
        where = list(zip(curve["tau_content"], curve["accuracy"]))
        spot = (tau, row["accuracy"] * 100)  # as policy_curves computes it: equal floats, not near ones
        kinds.append("beaten" if spot not in where else "counted" if where.index(spot) < curve["counted"] else "cut")
    return kinds


def points_note(kinds: list[str], curves: dict[str, dict]) -> str:
    """Which points the chart draws how, in words: every row is one of them."""
    parts = [f"{kinds.count('counted')} of {len(kinds)} settings make up the curve{'s' if len(curves) > 1 else ''}"]
    hidden = sum(len(c["tau_content"]) - len(set(zip(c["tau_content"], c["accuracy"]))) for c in curves.values())
    if hidden:
        parts[0] += f" ({hidden} on the same spot as another: hover)"
    if kinds.count("beaten"):
        parts.append(f"{kinds.count('beaten')} (grey) are beaten by a point of their policy: as good on accuracy "
                     "and tokens per forward, better on one")
    if kinds.count("cut"):
        parts.append(f"{kinds.count('cut')} (hollow) are more than {AUP_CUT:g} points below the policy's best: "
                     "not counted")
    if kinds.count("undrawn"):
        parts.append(f"{kinds.count('undrawn')} have no content τ: not drawn")
    return "; ".join(parts)


def aup_figure(report: dict) -> go.Figure:
    """Each policy's curve of accuracy against content tokens per forward (its points that no other
    of its points beats: as good on both, better on one), its AUP shaded beneath it and named in the legend with its unit;
    points more than 5 below the policy's best are hollow on a dotted line (not counted), the
    points a curve point beats grey, and the subtitle counts each kind."""
    title = f"Accuracy under parallelism (AUP): the shaded area, in {AUP_UNIT}"
    rows = report.get("rows") or []
    curves = policy_curves(rows)
    if not curves:
        return message_figure("no sweep points with a content τ yet", title)
    y_max = max(max(c["accuracy"]) for c in curves.values())  # the best of every row with a content τ
    kinds = point_kinds(rows, curves)
    fig = go.Figure()
    beaten = [i for i, kind in enumerate(kinds) if kind == "beaten"]
    if beaten:
        fig.add_trace(go.Scatter(
            x=[rows[i][PARALLELISM] for i in beaten], y=[rows[i]["accuracy"] for i in beaten], mode="markers",
            name=f"{len(beaten)} beaten", marker={"size": 9, "color": BEATEN},
            hovertext=[f"{policy_of(rows[i])} · {row_label(rows[i])}" for i in beaten],
            hovertemplate="%{hovertext}<br>%{x:.2f} content tokens / forward · accuracy %{y:.1%}<br>beaten by a point "
                          "of its policy (as good on both, better on one): not on its curve<extra></extra>"))
    for k, (policy, curve) in enumerate(curves.items()):
        colour, counted = PALETTE[k % len(PALETTE)], curve["counted"]
        x, y = curve["tau_content"], [a / 100 for a in curve["accuracy"]]
        # every setting at a curve's point: several settings can share one spot
        here = [" / ".join(row_label(rows[i]) for i, kind in enumerate(kinds) if kind in ("counted", "cut")
                           and policy_of(rows[i]) == policy and (rows[i][PARALLELISM], rows[i]["accuracy"] * 100) == spot)
                for spot in zip(x, curve["accuracy"])]
        hover = "%{hovertext}<br>%{x:.2f} content tokens / forward · accuracy %{y:.1%}"
        area_x, area_y = aup_area(curve, y_max)
        fig.add_trace(go.Scatter(x=area_x, y=[a / 100 for a in area_y], mode="lines", fill="toself",
                                 fillcolor=_tint(colour, 0.18), line={"width": 0}, legendgroup=policy,
                                 showlegend=False, hoverinfo="skip", name=f"{policy}: AUP area"))
        if counted < len(x):  # drawn under the counted part: its first point is the last counted one
            fig.add_trace(go.Scatter(
                x=x[counted - 1:], y=y[counted - 1:], hovertext=here[counted - 1:], mode="lines+markers",
                legendgroup=policy, showlegend=False, line={"color": colour, "dash": "dot"},
                marker={"size": 11, "color": "white", "line": {"color": colour, "width": 2}},
                hovertemplate=hover + "<br>not counted in the AUP<extra></extra>"))
        fig.add_trace(go.Scatter(x=x[:counted], y=y[:counted], hovertext=here[:counted], mode="lines+markers",
                                 name=f"{policy}: AUP {curve['aup']:.1f}<br>{aup_meaning(curve['aup'])}",
                                 legendgroup=policy, showlegend=True, line={"color": colour},
                                 marker={"size": 12, "color": colour},
                                 hovertemplate=hover + "<extra></extra>"))
    fig.update_xaxes(title="ρ: content tokens per forward (end-of-text padding not counted)", rangemode="tozero")
    fig.update_yaxes(title="y: accuracy", tickformat=".0%", range=[0, 1.05])
    fig.add_annotation(text=AUP_FORMULA, xref="paper", yref="paper", x=0, y=-0.2, xanchor="left", yanchor="top",
                       showarrow=False, align="left", font={"size": 14})
    styled(fig, title, height=500, legend_below=False)
    fig.update_layout(title={"subtitle": {"text": points_note(kinds, curves), "font": {"size": 15}}},
                      margin={"t": 80, "b": 120},
                      legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01})
    return fig
