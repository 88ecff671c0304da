"""Where a chart's point labels go: each beside its point, clear of every marker, error bar, line
and other label, estimated in pixels of the plot area. Numbers in, plotly annotation dicts out."""
from __future__ import annotations

from collections.abc import Sequence

Box = tuple[float, float, float, float]  # left, bottom, right, top in plot pixels (y up)

# The plot area in pixels, which the page sizes to its column: an estimate below the drawn size
# (1240 px wide less the margins and the key on the right) keeps the distances on the safe side.
PLOT_PX = (900, 330)
MARKER_PX = 9         # a marker's radius (size 14) and a little air
BAR_CAP_PX = 5        # an error bar's caps reach this far either side of it
GAP_PX = 3            # air between a label and what it stands beside

# (name, the box's left edge in label widths, its bottom in label heights): where a label may sit
# relative to its point, offset by the marker radius. First the top right: no point of a Pareto
# frontier has another point up and to its right, and its own error bar runs straight up.
PLACES = [("top right", (0, 1), (0, 1)), ("middle right", (0, 1), (-0.5, 0)), ("bottom right", (0, 1), (-1, -1)),
          ("top left", (-1, -1), (0, 1)), ("middle left", (-1, -1), (-0.5, 0)), ("bottom left", (-1, -1), (-1, -1)),
          ("top center", (-0.5, 0), (0, 1)), ("bottom center", (-0.5, 0), (-1, -1))]
_X_ANCHOR, _Y_ANCHOR = {-0.5: "center", 0: "left", -1: "right"}, {-0.5: "middle", 0: "bottom", -1: "top"}


def text_px(text: str, size: float) -> tuple[float, float]:
    """A label's width and height in pixels at font ``size`` (bold digits and letters ~0.62 em)."""
    return 0.62 * size * len(text) + 2 * GAP_PX, 1.35 * size


class Canvas:
    """The plot area in pixels: data coordinates mapped onto ``PLOT_PX`` by the axes' ranges."""

    def __init__(self, x_range: Sequence[float], y_range: Sequence[float], size: tuple[float, float] = PLOT_PX):
        self.x_range, self.y_range, self.size = x_range, y_range, size

    def px(self, x: float, y: float) -> tuple[float, float]:
        (x0, x1), (y0, y1), (w, h) = self.x_range, self.y_range, self.size
        return (x - x0) / (x1 - x0) * w, (y - y0) / (y1 - y0) * h

    def inside(self, box: Box) -> bool:
        return box[0] >= 0 and box[1] >= 0 and box[2] <= self.size[0] and box[3] <= self.size[1]


def overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def crosses(segment: tuple[tuple[float, float], tuple[float, float]], box: Box) -> bool:
    """Whether a line segment passes through a box (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = segment
    dx, dy = x1 - x0, y1 - y0
    low, high = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low > high:
            return False
    return True


def label_box(centre: tuple[float, float], place: str, width: float, height: float) -> Box:
    """The pixel box of a ``width`` × ``height`` label at ``place`` beside a marker at ``centre``."""
    (wx, rx), (hy, ry) = next((w, h) for name, w, h in PLACES if name == place)
    left, bottom = centre[0] + wx * width + rx * MARKER_PX, centre[1] + hy * height + ry * MARKER_PX
    return left, bottom, left + width, bottom + height


def place_labels(canvas: Canvas, points: list[tuple[float, float]], labels: list[str], size: float,
                 bars: Sequence[tuple[float, float, float]] = (),
                 lines: Sequence[tuple[tuple[float, float], tuple[float, float]]] = (),
                 others: Sequence[tuple[float, float]] = ()) -> list[str | None]:
    """A place of :data:`PLACES` for each label at font ``size`` such that it stays inside the plot and
    covers no marker (``points`` and ``others``), no error bar (``bars``: x, low, high in data units),
    no line (``lines``: segments in data units) and no label placed before it; None where none fits."""
    centres = [canvas.px(*p) for p in points]
    r = MARKER_PX
    taken = [(cx - r, cy - r, cx + r, cy + r) for cx, cy in centres + [canvas.px(*p) for p in others]]
    for x, low, high in bars:
        (cx, bottom), (_, top) = canvas.px(x, low), canvas.px(x, high)
        taken.append((cx - BAR_CAP_PX, bottom - 1, cx + BAR_CAP_PX, top + 1))
    segments = [(canvas.px(*a), canvas.px(*b)) for a, b in lines]
    places: list[str | None] = []
    for centre, text in zip(centres, labels):
        width, height = text_px(text, size)
        places.append(None)
        for name, *_ in PLACES:
            box = label_box(centre, name, width, height)
            if (canvas.inside(box) and not any(overlaps(box, t) for t in taken)
                    and not any(crosses(s, box) for s in segments)):
                taken.append(box)
                places[-1] = name
                break
    return places


def annotation(x: float, y: float, text: str, place: str, size: float, colour: str) -> dict:
    """A plotly annotation of ``text`` at ``place`` beside the point (x, y), as :func:`label_box` has it."""
    (wx, rx), (hy, ry) = next((w, h) for name, w, h in PLACES if name == place)
    return {"x": x, "y": y, "text": f"<b>{text}</b>", "showarrow": False, "font": {"size": size, "color": colour},
            "xanchor": _X_ANCHOR[wx], "yanchor": _Y_ANCHOR[hy], "xshift": rx * MARKER_PX, "yshift": ry * MARKER_PX,
            "borderpad": 0}
