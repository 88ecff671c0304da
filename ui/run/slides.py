"""Export for slides: the token grid at a step with its verdict lines as a standalone SVG, and the
page script that turns that SVG and the Run tab's plots into PNG and SVG images in one click (the
zip they are handed out in: ``slides_zip``). The SVG is a pure function of the trace dict."""
from __future__ import annotations

import json
import textwrap
from xml.sax.saxutils import escape

from ..lessons.acceptance import acceptance_verdict
from ..block.edit_lessons import edit_verdict
from ..grid.tokens import chip_rgb, css, text_colour, token_label
from ..grid.ends import end_runs
from ..lessons.verdicts import MARKS, grid_verdicts
from ..grid.policy_marks import sent_back
from ..canvas.parts import is_canvas
from ..canvas.slides import canvas_chips
from ..parts.replay import Trace, first_end, is_end_token, state_at

MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
SANS = "DejaVu Sans, Helvetica, Arial, sans-serif"
LABEL_PX, POS_PX, PAST_PX, LINE_PX = 22, 13, 15, 19  # big enough to read when projected
_MONO_EM, _SANS_EM = 0.62, 0.57  # a glyph's width per pixel of font size (DejaVu's, rounded up)
CHIP_H, PAST_H, GAP, PAD, MAX_WIDTH = 52, 20, 6, 16, 1200
STATUS_COLOUR = {"holds": "#1a7f37", "does not hold": "#b00020"}  # anything else: grey
PLOT_IDS = ("conf-plot", "kv-plot", "cache-plot")  # the gr.Plot components SLIDES_JS draws


def _chips(trace: Trace, step: int, color_by: str) -> tuple[list[dict], int, int]:
    """One chip per box of the grid (a run of end-of-text tokens folded into one, as the grid
    folds it): label, position text, fill, text colour and marks. Also the step shown and the
    number of positions committed."""
    state = state_at(trace, step)
    shown, ids = state["step"], state["ids"]
    last = len(trace.get("steps") or []) - 1
    drafts = sent_back(trace, shown)
    eventful = {p for p, h in enumerate(state["history"]) if h} | set(drafts)
    new = {p for p, s in enumerate(state["commit_step"]) if s == shown and ids[p] is not None}
    runs = {start: (stop, fresh) for start, stop, fresh in end_runs(trace, ids, eventful, new)}
    end = first_end(trace, ids)
    chips, p = [], 0
    while p < len(ids):
        if p in runs:
            stop, fresh = runs[p]
            names = sorted({token_label(trace, t) for t in ids[p:stop]})
            chips.append({"label": f"× {stop - p} end of text: {', '.join(names)}", "pos": f"{p}–{stop - 1}",
                          "fill": "#f0f0f0", "ink": "#333", "stroke": "#e4572e" if fresh else None})
            p = stop
            continue
        token, s, conf = ids[p], state["commit_step"][p], state["confidence"][p]
        past = [token_label(trace, t) for t, *_ in state["history"][p]] + [token_label(trace, t) for _, t, _ in drafts.get(p, [])]
        if token is None:
            rejected_now = any(at == shown for at, _, _ in drafts.get(p, []))
            chips.append({"label": "▢", "pos": str(p), "fill": "#e5e5e5", "ink": "#555", "past": past,
                          "stroke": "#d73027" if rejected_now else None})
        else:
            rgb = chip_rgb(color_by, s, conf, last)
            stray = end is not None and p > end and not is_end_token(trace, token)
            chips.append({"label": token_label(trace, token), "pos": str(p), "fill": css(rgb), "ink": text_colour(rgb),
                          "stroke": "#e4572e" if s == shown else "#b00020" if stray else None, "dashed": stray,
                          "faded": is_end_token(trace, token), "past": past})
        p += 1
    return chips, shown, len(ids) - state["masked"]


def _chip_width(chip: dict) -> float:
    past = sum(len(label) + 1 for label in chip.get("past") or [])
    return max(len(chip["label"]) * LABEL_PX * _MONO_EM, len(chip["pos"]) * POS_PX * _MONO_EM,
               past * PAST_PX * _MONO_EM, 18) + 14


def _chip_svg(chip: dict, x: float, y: float, height: int) -> str:
    """A chip: its position above its label; below, struck through in red, the tokens taken back
    or sent back there (the grid's struck tokens under a box)."""
    w = _chip_width(chip)
    opacity = ' opacity="0.55"' if chip.get("faded") else ""
    parts = [f'<g class="chip" data-pos="{escape(chip["pos"])}"{opacity}>',
             f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{height}" rx="5" fill="{chip["fill"]}"/>']
    if chip.get("stroke"):
        dash = ' stroke-dasharray="6 3"' if chip.get("dashed") else ""
        parts.append(f'<rect x="{x + 1.5:.1f}" y="{y + 1.5:.1f}" width="{w - 3:.1f}" height="{height - 3}" rx="4" '
                     f'fill="none" stroke="{chip["stroke"]}" stroke-width="3"{dash}/>')
    mid = x + w / 2
    parts.append(f'<text class="pos" x="{mid:.1f}" y="{y + 15:.1f}" font-family="{MONO}" font-size="{POS_PX}" '
                 f'text-anchor="middle" fill="{chip["ink"]}">{escape(chip["pos"])}</text>')
    parts.append(f'<text class="label" x="{mid:.1f}" y="{y + 41:.1f}" font-family="{MONO}" font-size="{LABEL_PX}" '
                 f'text-anchor="middle" fill="{chip["ink"]}" xml:space="preserve">{escape(chip["label"])}</text>')
    if chip.get("past"):
        parts.append(f'<rect x="{x + 3:.1f}" y="{y + CHIP_H - 2:.1f}" width="{w - 6:.1f}" height="{PAST_H - 2}" '
                     'fill="#fff" rx="3"/>'
                     f'<text class="past" x="{mid:.1f}" y="{y + CHIP_H + PAST_H - 8:.1f}" font-family="{MONO}" '
                     f'font-size="{PAST_PX}" text-anchor="middle" fill="#b00020" text-decoration="line-through" '
                     f'xml:space="preserve">{escape(" ".join(chip["past"]))}</text>')
    return "".join(parts) + "</g>"


def _lines(text: str, width: float, px: int) -> list[str]:
    return textwrap.wrap(text, max(20, int(width / (px * _SANS_EM)))) or [""]


def grid_svg(trace: Trace, step: int, color_by: str = "step") -> str:
    """The token grid after ``step`` as a standalone SVG (rects and texts, fonts named), one chip
    per box with the grid's colours, its commit outline and its folded ends of text, and the
    grid's verdict lines (Theorem 1, the answer, verification, acceptance) below, wrapped to fit.
    Sized to its content, at most ``MAX_WIDTH`` wide."""
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', not {color_by!r}")
    if is_canvas(trace):
        chips, shown, head = canvas_chips(trace, step, color_by)
    else:
        chips, shown, committed = _chips(trace, step, color_by)
        where = "before any step" if shown < 0 else f"after step {shown}"
        head = f"{where} · {committed}/{len(state_at(trace, shown)['ids'])} committed"
    rows, row, used = [], [], 0.0
    for chip in chips:
        w = _chip_width(chip)
        if row and used + w > MAX_WIDTH - 2 * PAD:
            rows.append(row)
            row, used = [], 0.0
        row.append(chip)
        used += w + GAP
    rows += [row] if row else []
    width = max([720.0] + [sum(_chip_width(c) + GAP for c in r) - GAP + 2 * PAD for r in rows])
    body = [f'<text x="{PAD}" y="{PAD + LINE_PX}" font-family="{SANS}" font-size="{LINE_PX}" fill="#333">'
            f"{escape(head)}</text>"]
    y = PAD + LINE_PX + 12
    height = CHIP_H + (PAST_H if any(chip.get("past") for chip in chips) else 0)
    for r in rows:
        x = PAD
        for chip in r:
            body.append(_chip_svg(chip, x, y, height))
            x += _chip_width(chip) + GAP
        y += height + GAP
    y += 8
    steps = trace.get("steps") or []
    verdicts = [*grid_verdicts(trace, shown), acceptance_verdict(trace, shown), edit_verdict(trace, shown)] if steps else []
    for verdict in (v for v in verdicts if v is not None):
        colour = STATUS_COLOUR.get(verdict.status, "#555")
        text = f"{MARKS[verdict.status]} {verdict.claim}: {verdict.status} — {verdict.detail}"
        for i, line in enumerate(_lines(text, width - 2 * PAD, LINE_PX)):
            y += LINE_PX + 6
            weight = ' font-weight="bold"' if i == 0 else ""
            body.append(f'<text class="verdict" data-status="{escape(verdict.status)}" x="{PAD}" y="{y}" '
                        f'font-family="{SANS}" font-size="{LINE_PX}" fill="{colour}"{weight}>{escape(line)}</text>')
        y += 6
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y + PAD:.0f}" '
            f'viewBox="0 0 {width:.0f} {y + PAD:.0f}"><rect width="100%" height="100%" fill="#fff"/>'
            f'{"".join(body)}</svg>')


# ----------------------------------------------------------------------------- in the page

SLIDES_JS = """
async (grid_svg) => {
  const PLOTS = %s;
  const b64 = (text) => {
    const bytes = new TextEncoder().encode(text);
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(s);
  };
  const svgUrl = (text) => "data:image/svg+xml;base64," + b64(text);
  const toPng = (text, w, h) => new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = Math.ceil(w * 2); canvas.height = Math.ceil(h * 2);
      const ctx = canvas.getContext("2d");
      ctx.scale(2, 2);
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
      ctx.drawImage(img, 0, 0, w, h);
      resolve(canvas.toDataURL("image/png"));
    };
    img.onerror = () => reject(new Error("an SVG for the slides did not load as an image"));
    img.src = svgUrl(text);
  });
  const ns = "http://www.w3.org/2000/svg";
  const composed = (plot) => {  // the plot's svg.main-svg layers, laid over each other in one SVG
    const box = plot.getBoundingClientRect();
    const root = document.createElementNS(ns, "svg");
    root.setAttribute("width", box.width); root.setAttribute("height", box.height);
    root.setAttribute("viewBox", `0 0 ${box.width} ${box.height}`);
    for (const layer of plot.querySelectorAll("svg.main-svg")) {
      const at = layer.getBoundingClientRect(), copy = layer.cloneNode(true);
      copy.setAttribute("x", at.left - box.left); copy.setAttribute("y", at.top - box.top);
      root.appendChild(copy);
    }
    // plotly points its clip paths and gradients at the page's own address (url('http://…/#id')),
    // which an SVG standing alone cannot reach: point them at the copy's own ids
    const text = new XMLSerializer().serializeToString(root).replace(/url\\((['"]|&quot;)?[^'"#)&]*#/g, "url($1#");
    return [text, box.width, box.height];
  };
  const out = {};
  if (grid_svg) {
    const svg = new DOMParser().parseFromString(grid_svg, "image/svg+xml").documentElement;
    out["grid.svg"] = svgUrl(grid_svg);
    out["grid.png"] = await toPng(grid_svg, parseFloat(svg.getAttribute("width")), parseFloat(svg.getAttribute("height")));
  }
  for (const id of PLOTS) {
    const plot = document.querySelector(`#${id} .js-plotly-plot`);
    if (!plot || !plot.data) continue;
    const hidden = plot.getBoundingClientRect().width === 0;  // a panel presenter view set aside
    let text, w, h;
    if (window.Plotly && window.Plotly.toImage) {
      // as drawn on the page, not plotly's default 700 × 450; a panel never drawn, at a slide's size
      const size = plot._fullLayout || {};
      const url = await window.Plotly.toImage(plot, {format: "svg", width: size.width || 900,
                                                     height: size.height || 400});
      const comma = url.indexOf(",");
      text = url.slice(0, comma).endsWith(";base64") ? atob(url.slice(comma + 1)) : decodeURIComponent(url.slice(comma + 1));
      const svg = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
      w = parseFloat(svg.getAttribute("width")); h = parseFloat(svg.getAttribute("height"));
    } else if (!hidden && plot.querySelector("svg.main-svg")) {
      [text, w, h] = composed(plot);
    } else {
      continue;
    }
    out[`${id}.svg`] = svgUrl(text);
    out[`${id}.png`] = await toPng(text, w, h);
  }
  return JSON.stringify(out);
}
""" % json.dumps(list(PLOT_IDS))
