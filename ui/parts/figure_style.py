"""The one look of every figure on the page: white, large type, read from the back of a hall; and
the same figure on the screen it is shown on (``on_screen``: a font scale, the dark projector theme)."""
from __future__ import annotations

import plotly.graph_objects as go

HEIGHT = 330
TITLE_SIZE = 17
# Type at a larger font scale is for a projector, whose plot panel is about 440 px wide (presenter
# view at 1280×720): a title longer than that is broken into lines; an average glyph is ~0.55 em.
PANEL_WIDTH, GLYPH_EM = 440, 0.55


# A legend entry's line at 14 px type, and what the x axis's ticks and title take below the plot.
LEGEND_ROW, AXIS_BELOW = 21, 48
_NO_LEGEND = {"heatmap", "contour", "histogram2d", "histogram2dcontour"}  # plotly shows none by default


def legend_entries(fig: go.Figure) -> int:
    """The entries plotly's legend shows for ``fig`` (0 where it shows none)."""
    if fig.layout.showlegend is False:
        return 0
    shown = [t for t in fig.data if t.showlegend or (t.showlegend is None and t.type not in _NO_LEGEND)]
    explicit = fig.layout.showlegend or any(t.showlegend for t in shown)
    return len(shown) if len(shown) > 1 or explicit else 0


def styled(fig: go.Figure, title: str, height: int = HEIGHT, legend_below: bool = True) -> go.Figure:
    """``fig`` in the page's look, ``height`` px for its plot and axes; ``legend_below``: its legend
    one entry a line at the figure's foot, the figure that much taller (else the caller places it)."""
    # A white style set directly: applying a named template costs ~20 ms per figure per redraw.
    # 14 px and up everywhere: the page is read from the back of a lecture hall.
    fig.update_xaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_yaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_layout(template=None, plot_bgcolor="white", paper_bgcolor="white", font={"color": "#2a3f5f", "size": 14},
                      height=height,
                      # hung from the top: a title broken into lines grows down into the margin kept for it
                      title={"text": title, "font": {"size": TITLE_SIZE}, "x": 0.01, "yref": "container", "y": 1,
                             "yanchor": "top", "pad": {"t": 10}},
                      margin={"l": 55, "r": 20, "t": 40, "b": 40})
    rows = legend_entries(fig) if legend_below else 0
    if rows:
        # One entry a line at the figure's foot, in a bottom margin kept for it below the x axis's
        # ticks and title: in a narrow panel (presenter view) a legend that wraps beside the axis
        # title, or above the axes, runs over them; a line each has a height known in advance.
        fig.update_layout(height=height + rows * LEGEND_ROW, margin={"b": AXIS_BELOW + rows * LEGEND_ROW},
                          legend={"orientation": "v", "yref": "container", "y": 0, "yanchor": "bottom",
                                  "xanchor": "left", "x": 0.0})
    if not legend_below:  # a wide figure of its own tab (Tune), not a presenter's panel
        return fig
    # The words fitted on the layout and the traces' names alone: the whole figure's JSON would copy
    # its data (a heatmap's cells) at every redraw.
    spec = {"layout": fig.layout.to_plotly_json(),
            "data": [{"name": t.name, "showlegend": t.showlegend, "type": t.type} for t in fig.data]}
    fit_words(spec)
    fig.update_layout({key: value for key, value in spec["layout"].items()
                       if key in ("title", "margin", "height") or key.startswith(("xaxis", "yaxis"))})
    for trace, fitted in zip(fig.data, spec["data"]):
        if trace.name != fitted["name"]:
            trace.name = fitted["name"]
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


def wrapped(text: str, chars: int) -> str:
    """``text`` broken at spaces into lines of at most ``chars`` characters (a longer word alone on
    its line), joined by plotly's ``<br>``; text with markup of its own is left as it is."""
    plain = text.replace("<br>", " ")  # its own breaks are made again at the new width
    if len(plain) <= chars or "<" in plain:
        return text if "<" in plain else plain
    lines: list[str] = []
    for word in plain.split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def fit_words(spec: dict) -> None:
    """The words of a figure's spec (``to_plotly_json`` form, its sizes final) fitted to a
    presenter's panel: the title broken into lines within its width (the top margin a line taller
    for each added), legend entries likewise (the foot taller), each axis title within its axis."""
    layout = spec["layout"]
    margin, height = layout.get("margin") or {}, layout.get("height") or HEIGHT
    title = layout.get("title") or {}
    size = (title.get("font") or {}).get("size") or TITLE_SIZE
    if isinstance(title.get("text"), str):
        before = title["text"].count("<br>")  # lines already made room for
        title["text"] = wrapped(title["text"], int(PANEL_WIDTH / (GLYPH_EM * size)))
        added = (title["text"].count("<br>") - before) * 1.25 * size  # px; the plot keeps its height
        margin["t"] = margin.get("t", 40) + added
        # plotly lifts a title of several lines ~0.75 em above its anchor (measured): the pad takes it back
        title["pad"] = {"t": 10 + (0.75 * size if "<br>" in title["text"] else 0)}
        height += added
        layout["height"] = height
    size = ((layout.get("legend") or {}).get("font") or {}).get("size") or (layout.get("font") or {}).get("size", 14)
    added = 0
    for trace in spec.get("data") or []:
        shown = trace.get("showlegend") or (trace.get("showlegend") is None and trace.get("type") not in _NO_LEGEND)
        if isinstance(trace.get("name"), str) and shown:
            before = trace["name"].count("<br>")
            trace["name"] = wrapped(trace["name"], int((PANEL_WIDTH - 50) / (GLYPH_EM * size)))  # 50: the swatch
            added += trace["name"].count("<br>") - before
    if added and "b" in margin:
        margin["b"] += added * LEGEND_ROW * size / 14
        height += added * LEGEND_ROW * size / 14
        layout["height"] = height
    layout["margin"] = margin
    area = {"x": PANEL_WIDTH - margin.get("l", 55) - margin.get("r", 20),
            "y": 0.9 * (height - margin.get("t", 40) - margin.get("b", 40))}
    for name, axis in layout.items():
        text = ((axis.get("title") or {}) if isinstance(axis, dict) else {}).get("text")
        if name.startswith(("xaxis", "yaxis")) and isinstance(text, str):
            low, high = axis.get("domain") or (0, 1)
            size = (axis["title"].get("font") or {}).get("size") or 15
            axis["title"]["text"] = wrapped(text, int(area[name[0]] * (high - low) / (GLYPH_EM * size)))


# A colour bar's labels grow less than the rest: at the full scale, long ones ("≥ 0.9999 same")
# would leave the heatmap a strip of a narrow panel.
COLOUR_BAR_SCALE = 1.25


def _narrow_colour_bars(traces: list, font_scale: float) -> None:
    size = 14 * min(font_scale, COLOUR_BAR_SCALE)
    for trace in traces:
        bar = trace.get("colorbar") or (trace.get("marker") or {}).get("colorbar")
        if isinstance(bar, dict):
            bar.setdefault("tickfont", {})["size"] = size
            title = bar.setdefault("title", {})
            if isinstance(title, dict):
                title.setdefault("font", {})["size"] = size


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
    if font_scale > 1:
        _narrow_colour_bars(restyled.get("data") or [], font_scale)
    margin = restyled["layout"].get("margin") or {}
    restyled["layout"]["margin"] = {k: v * font_scale if isinstance(v, (int, float)) else v for k, v in margin.items()}
    if "height" in restyled["layout"]:
        # Axes stacked in one figure (a domain each) keep their gaps for ticks and titles only if the
        # figure grows with the type; a single plot grows less (it reads well shorter).
        stacked = any(isinstance(axis, dict) and axis.get("domain") not in (None, [0, 1], (0, 1))
                      for name, axis in restyled["layout"].items() if name.startswith("yaxis"))
        restyled["layout"]["height"] *= font_scale if stacked else 1 + 0.4 * (font_scale - 1)
    fit_words(restyled)
    return go.Figure(restyled)
