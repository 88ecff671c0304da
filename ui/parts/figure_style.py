"""The one look of every figure on the page: white, large type, read from the back of a hall; and
the same figure on the screen it is shown on (``on_screen``: a font scale, the dark projector theme)."""
from __future__ import annotations

import plotly.graph_objects as go

HEIGHT = 330


def styled(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    # A white style set directly: applying a named template costs ~20 ms per figure per redraw.
    # 14 px and up everywhere: the page is read from the back of a lecture hall.
    fig.update_xaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_yaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_layout(
        template=None, plot_bgcolor="white", paper_bgcolor="white", font={"color": "#2a3f5f", "size": 14},
        height=height, title={"text": title, "font": {"size": 17}, "x": 0.01},
        margin={"l": 55, "r": 20, "t": 40, "b": 40},
        # Below the axes, not above: in a narrow panel (presenter view) a legend that wraps above
        # the axes runs over the title; below, plotly's margin grows to fit it.
        legend={"orientation": "h", "yanchor": "top", "y": -0.38, "xanchor": "left", "x": 0.0},
    )
    return fig


def message_figure(message: str, title: str = "") -> go.Figure:
    """Empty axes are never shown: a view with nothing to draw says why in words."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 16, "color": "#555"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return styled(fig, title)


# The dark projector theme: light text on a dark ground (≥ 4.5:1 for every text), data colours kept.
DARK = {"paper": "#14171c", "text": "#ececec", "grid": "#394049", "line": "#6b7280"}
_FONT_KEYS = ("font", "tickfont", "title_font", "textfont", "insidetextfont", "outsidetextfont")


def _luminance(colour: str) -> float | None:
    """Relative luminance (WCAG) of a #rgb, #rrggbb, rgb()/rgba() or white/black colour; None if unread."""
    c = colour.strip().lower()
    named = {"white": "#ffffff", "black": "#000000"}
    c = named.get(c, c)
    if c.startswith("#") and len(c) in (4, 7):
        c = c if len(c) == 7 else "#" + "".join(ch * 2 for ch in c[1:])
        rgb = [int(c[i:i + 2], 16) for i in (1, 3, 5)]
    elif c.startswith("rgb"):
        rgb = [float(v) for v in c[c.index("(") + 1 : c.index(")")].split(",")[:3]]
    else:
        return None
    linear = [(v / 255) / 12.92 if v / 255 <= 0.04045 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _restyle(node: object, scale: float, dark: bool, key: str = "") -> object:
    if isinstance(node, dict):
        out = {k: _restyle(v, scale, dark, k) for k, v in node.items()}
        if key in _FONT_KEYS:
            if "size" in out and isinstance(out["size"], (int, float)):
                out["size"] = out["size"] * scale
            if dark and isinstance(out.get("color"), str) and (_luminance(out["color"]) or 0) < 0.35:
                out["color"] = DARK["text"]  # dark text turned light; light text (on a dark mark) kept
        if dark:
            for name in ("paper_bgcolor", "plot_bgcolor", "bgcolor"):
                if isinstance(out.get(name), str) and (_luminance(out[name]) or 0) > 0.6:
                    out[name] = DARK["paper"]
            for name in ("gridcolor", "zerolinecolor"):
                if name in out:
                    out[name] = DARK["grid"]
            if "linecolor" in out:
                out["linecolor"] = DARK["line"]
        return out
    if isinstance(node, list):
        return [_restyle(v, scale, dark, key) for v in node]
    return node


def on_screen(fig: go.Figure, font_scale: float = 1.0, theme: str = "light") -> go.Figure:
    """``fig`` as the page shows it: every text ``font_scale`` times larger and, on the dark
    theme, a dark ground with light text. A new figure; the data and its colours are unchanged."""
    if font_scale == 1.0 and theme != "dark":
        return fig
    spec = fig.to_plotly_json()
    layout = spec.setdefault("layout", {})
    layout.setdefault("font", {}).setdefault("size", 12)  # plotly's default, so that it scales too
    if theme == "dark":
        layout["font"].setdefault("color", "#2a3f5f")
    restyled = _restyle(spec, float(font_scale), theme == "dark")
    for name, axis in restyled["layout"].items():  # larger ticks must push the margins, not the titles
        if name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict):
            axis["automargin"] = True
    legend = restyled["layout"].get("legend") or {}
    if isinstance(legend.get("y"), (int, float)) and legend["y"] < 0:  # under taller ticks and axis titles
        legend["y"] = legend["y"] * font_scale * (1.4 if font_scale > 1 else 1.0)
    margin = restyled["layout"].get("margin") or {}
    restyled["layout"]["margin"] = {k: v * font_scale if isinstance(v, (int, float)) else v for k, v in margin.items()}
    if "height" in restyled["layout"]:
        restyled["layout"]["height"] = restyled["layout"]["height"] * (1 + 0.4 * (font_scale - 1))
    return go.Figure(restyled)
