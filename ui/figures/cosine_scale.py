"""The one colour scale of every KV cosine view, spent on the cosines that matter: the nines of a
cosine near 1 (0.9, 0.99, 0.999, 0.9999) each get as much of the colour bar as the whole range from
0 to 0.9, on a bar evenly spaced in nines, -log10(1 - cosine)."""
from __future__ import annotations

import math

import plotly.graph_objects as go

NINES = 4  # the bar's top: cosines from 1 - 1e-4 up share the brightest colour
# the colour at 0, 1, 2, 3 and 4 nines (cosine 0, 0.9, 0.99, 0.999, 0.9999): dark, changed; yellow, the same
PALETTE = ("#2d0a4e", "#3b528b", "#21918c", "#7ad151", "#fde725")
TICKS = {0: "≤ 0 unrelated", 1: "0.9", 2: "0.99", 3: "0.999", 4: "≥ 0.9999 same"}
_STOPS_PER_NINE = 10  # the cosine scale follows the bar's colours this closely between ticks


def nines(cosine: float) -> float:
    """A cosine's place on the bar: -log10(1 - cosine), from 0 (cosine 0 or below) to NINES."""
    if cosine >= 1.0:
        return float(NINES)
    return min(float(NINES), max(0.0, -math.log10(1.0 - cosine)))


def colour_at(place: float) -> str:
    """The bar's colour ``place`` nines up, between the palette's colours."""
    place = min(float(NINES), max(0.0, place))
    i = min(int(place), NINES - 1)
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in (PALETTE[i], PALETTE[i + 1]))
    f = place - i
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


# The heatmaps keep the cosine itself as z (the hover and the data stay true) on a plotly colour
# scale from 0 to 1 whose stops sit at the cosines of the bar's places, so a cell's colour is the
# bar's colour at its cosine; plotly's own colour bar would be linear in cosine, so the bar is drawn
# by :func:`colour_bar` in nines instead.
COS_SCALE = [[0.0, PALETTE[0]]] + [
    [1.0 - 10.0 ** (-k / _STOPS_PER_NINE), colour_at(k / _STOPS_PER_NINE)]
    for k in range(1, NINES * _STOPS_PER_NINE + 1)] + [[1.0, PALETTE[-1]]]


def colour_bar(title: str = "cosine") -> go.Scatter:
    """A trace that draws nothing but the cosine colour bar, in nines, ticked with the cosines."""
    scale = [[k / (NINES * _STOPS_PER_NINE), colour_at(k / _STOPS_PER_NINE)] for k in range(NINES * _STOPS_PER_NINE + 1)]
    return go.Scatter(
        x=[None], y=[None], mode="markers", name="cosine scale", showlegend=False, hoverinfo="skip",
        marker={"color": [0.0], "cmin": 0.0, "cmax": float(NINES), "colorscale": scale, "showscale": True,
                "colorbar": {"title": {"text": title}, "thickness": 14, "tickvals": list(TICKS),
                             "ticktext": list(TICKS.values()), "tickfont": {"size": 14}}},
    )
