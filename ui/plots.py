"""Pure views of a decoding trace: trace dict in, plotly figure (or HTML / dict) out.

The page imports this module, so it must stay torch-free: stdlib, plotly and html only.
A trace is the plain dict of ``dllm_local.trace.Trace.to_dict()`` (or its JSON). Plots show the
answer region only: x = answer position ``0..gen_length-1`` = absolute position - len(prompt_ids).
``upto_step`` everywhere is a 0-based step index (inclusive); ``None`` means every recorded step,
so a live page can redraw the same trace as it grows.
"""
from __future__ import annotations

import html
import math
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
                  "x marks a commit; a policy that commits early on bright cells saves steps. Left of each row: "
                  "Fast-dLLM's Theorem 1. When a step commits n tokens, all with confidence above 1 − ε, and "
                  "(n+1)ε ≤ 1, greedy parallel decoding commits exactly what one-at-a-time decoding would (green "
                  "dot); otherwise there is no guarantee (red cross), and the tokens may not fit together.",
    "kv": "Yellow: the position's K/V barely moved (cosine near 1); dark: it changed. Below the black staircase "
          "a position holds a decoded token, above it the position is still masked. Decoded tokens' K/V barely "
          "move, so reusing them is nearly exact; still-masked positions' K/V drift as their neighbours get "
          "decoded, so a cache of the later blocks goes stale, which is why DualCache refreshes at every block start "
          "(▶ marks a refresh; grey cells were reused from the cache).",
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
    # 14 px and up everywhere: the page is read from the back of a lecture hall.
    fig.update_xaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_yaxes(gridcolor="#ebebeb", linecolor="#cccccc", tickfont={"size": 14}, title_font={"size": 15})
    fig.update_layout(
        template=None, plot_bgcolor="white", paper_bgcolor="white", font={"color": "#2a3f5f", "size": 14},
        height=height, title={"text": title, "font": {"size": 17}, "x": 0.01},
        margin={"l": 55, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
    )
    return fig


def _message_figure(message: str, title: str = "") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 16, "color": "#555"})
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
    position, or None), ``confidence`` (confidence at commit, or None), ``history`` (per position,
    the tokens a revising policy took back: [token, step committed, step taken back, confidence
    then, probability when taken back]), ``step`` (the step shown, clamped to the recorded range)
    and ``masked`` (count of still-masked positions).
    """
    P, n = _prompt_len(trace), _gen_length(trace)
    steps = trace.get("steps") or []
    step = max(-1, min(int(step), len(steps) - 1))
    ids: list[int | None] = [None] * n
    commit_step: list[int | None] = [None] * n
    confidence: list[float | None] = [None] * n
    history: list[list] = [[] for _ in range(n)]
    for index, record in enumerate(steps[: step + 1]):
        for position, token, conf in record.get("committed") or []:
            p = int(position) - P
            if 0 <= p < n:
                ids[p], commit_step[p], confidence[p] = int(token), index, float(conf)
        # Taken back after this step's commits, in the same forward (a revising policy).
        for position, token, then, now in record.get("revoked") or []:
            p = int(position) - P
            if 0 <= p < n:
                history[p].append([int(token), commit_step[p], index, float(then), float(now)])
                ids[p] = commit_step[p] = confidence[p] = None
    return {"ids": ids, "commit_step": commit_step, "confidence": confidence, "history": history, "step": step,
            "masked": sum(t is None for t in ids)}


# ----------------------------------------------------------------------------- token grid

# A run of end-of-text tokens collapses into one chip when at least this long.
COLLAPSE_PADDING = 4
_BOX = ("display:inline-flex;flex-direction:column;align-items:center;margin:2px;padding:1px 5px;border-radius:4px;"
        "font-family:ui-monospace,monospace;font-size:18px;white-space:pre;min-width:1.6em;vertical-align:top;")
_WHAT_IF_FRAME = "box-shadow:0 0 0 3px #1a9850;border-radius:6px;"
_POS = '<span class="dl-pos" style="font-size:14px;opacity:0.7;line-height:1.1;">{}</span>'


def _first_end(trace: Trace, ids: list[int | None]) -> int | None:
    """The first answer position holding a committed end-of-text token, or None."""
    return next((p for p, t in enumerate(ids) if _is_end_token(trace, t)), None)


def _end_runs(trace: Trace, ids: list[int | None]) -> list[tuple[int, int]]:
    """(start, stop) of every run of at least COLLAPSE_PADDING committed end-of-text tokens."""
    runs, start = [], None
    for p, token in enumerate([*ids, None]):
        if _is_end_token(trace, token):
            start = p if start is None else start
        elif start is not None:
            if p - start >= COLLAPSE_PADDING:
                runs.append((start, p))
            start = None
    return runs


def _history(trace: Trace, history: list[list]) -> tuple[str, str]:
    """A position's taken-back tokens: struck through under the box, and told in the hover."""
    if not history:
        return "", ""
    struck = "".join(f'<s class="dl-revoked" style="font-size:14px;color:#b00020;">'
                     f"{html.escape(_visible(_token_text(trace, token)))}</s>" for token, *_ in history)
    told = "; ".join(f"'{_visible(_token_text(trace, token))}' committed at step {at} (confidence {then:.2f}), "
                     f"taken back at step {back} (probability then {now:.2f})"
                     for token, at, back, then, now in history)
    return struck, f" · history: {told}"


def _what_if_line(replay: dict | None, threshold: float | None, shown: int) -> str:
    if replay is None or shown < 0:
        return ""
    style = 'class="dl-whatif-line" style="font-size:16px;color:#1a6b3a;"'
    if replay["reason"]:
        return f"<div {style}>What-if τ′ = {threshold:.2f}: {html.escape(replay['reason'])}</div>"
    d = replay["diverges_at"]
    if d is None or shown < d:
        n = len(replay["commits"][shown]) if shown < len(replay["commits"]) else 0
        return (f"<div {style}>What-if τ′ = {threshold:.2f}: green frames are the {n} position(s) it would commit "
                f"at step {shown}; the same as this run so far.</div>")
    if shown == d:
        return (f'<div {style} data-diverges="{d}">What-if τ′ = {threshold:.2f}: <b>diverges here</b> (step {d}): '
                f"it would commit the green-framed positions instead; run to see the rest.</div>")
    return (f'<div {style} data-diverges="{d}">What-if τ′ = {threshold:.2f} diverged at step {d}: '
            f"run with τ′ to see the rest.</div>")


def token_grid_html(trace: Trace, step: int, color_by: str = "step", what_if_threshold: float | None = None) -> str:
    """HTML boxes for the answer region after ``step``; ``color_by`` is "step" or "confidence".

    Each box shows its answer position above its token. Tokens committed after the first end of
    text are marked (they are not part of the answer); each run of end-of-text tokens collapses into
    one chip that expands on click. With ``what_if_threshold`` (τ′), the positions τ′ would have
    committed at this step get a green frame (see :func:`what_if`).
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', not {color_by!r}")
    state = state_at(trace, step)
    shown = state["step"]
    last = max(1, len(trace.get("steps") or []) - 1)  # palette spans the whole run: stable colours while scrubbing
    ids = state["ids"]
    first_end = _first_end(trace, ids)
    record = (trace.get("steps") or [])[shown] if shown >= 0 else {}
    P = _prompt_len(trace)
    top = {int(pos) - P: pairs for pos, pairs in record.get("top_candidates") or []}
    rejected = {int(pos) - P: (tok, score) for pos, tok, score in (record.get("policy") or {}).get("rejected_at") or []}
    replay = what_if(trace, what_if_threshold) if what_if_threshold is not None else None
    would = set()
    if replay and 0 <= shown < len(replay["commits"]):
        would = set(replay["commits"][shown])
    boxes, stray = [], False
    for p, (token, s, conf) in enumerate(zip(ids, state["commit_step"], state["confidence"])):
        number = _POS.format(p)
        past, past_title = _history(trace, state["history"][p])
        if token is None:
            title = f"pos {p} · masked" + past_title
            if p in top:
                title += f" · step {shown}'s top candidates: " + ", ".join(
                    f"'{_visible(_token_text(trace, t))}' {q:.2f}" for t, q in top[p])
            style, classes = f"{_BOX}background:#e5e5e5;color:#777;", "dl-tok dl-masked"
            if p in rejected:
                tok, score = rejected[p]
                title += (f" · self-verify sent '{_visible(_token_text(trace, tok))}' back to mask at step {shown}"
                          f" (conflict score {score:.3f})")
                style += "border:3px solid #d73027;"
                classes += " dl-rejected"
            if p in would:
                style += _WHAT_IF_FRAME
                classes += " dl-whatif-box"
            boxes.append(f'<span class="{classes}" title="{_attr(title)}" style="{style}">{number}▢{past}</span>')
            continue
        vis = _visible(_token_text(trace, token))
        rgb = _interp(_CONF_STOPS, conf) if color_by == "confidence" else _interp(_STEP_STOPS, 0.1 + 0.9 * s / last)
        style = f"{_BOX}background:{_css(rgb)};color:{_text_colour(rgb)};"
        classes = ["dl-tok"]
        title = f"pos {p} · token '{vis}' · step {s} · confidence {conf:.2f}" + past_title
        if s == shown:
            style += "outline:3px solid #e4572e;outline-offset:-1px;"
            classes.append("dl-new")
        if _is_end_token(trace, token):
            style += "opacity:0.35;"
            classes.append("dl-end")
        elif first_end is not None and p > first_end:
            stray = True
            style += "border:2px dashed #b00020;text-decoration:line-through;"
            classes.append("dl-after-end")
            title += " · committed after the end of text: not part of the answer"
        if p in would:
            style += _WHAT_IF_FRAME
            classes.append("dl-whatif-box")
        if past:
            classes.append("dl-revised")
        boxes.append(f'<span class="{" ".join(classes)}" title="{_attr(title)}" style="{style}">'
                     f"{number}{html.escape(vis)}{past}</span>")
    for start, stop in reversed(_end_runs(trace, ids)):  # from the end, so earlier indices stay valid
        chip = (f'<summary class="dl-pad-chip" style="{_BOX}display:inline-block;background:#f0f0f0;color:#555;'
                f'cursor:pointer;">× {stop - start} end of text (pos {start}–{stop - 1})</summary>')
        boxes[start:stop] = [f'<details class="dl-pad" style="display:inline;">{chip}{"".join(boxes[start:stop])}</details>']
    swatch = "display:inline-block;width:1.1em;height:0.9em;border-radius:3px;vertical-align:middle;margin:0 3px;"
    if color_by == "confidence":
        scale = (f'<span style="{swatch}background:{_css(_CONF_STOPS[0])}"></span>low → high confidence at commit'
                 f'<span style="{swatch}background:{_css(_CONF_STOPS[-1])}"></span>')
    else:
        scale = (f'<span style="{swatch}background:{_css(_interp(_STEP_STOPS, 0.1))}"></span>step 0 → step {last}'
                 f'<span style="{swatch}background:{_css(_interp(_STEP_STOPS, 1.0))}"></span>')
    committed = len(ids) - state["masked"]
    where = "before any step" if shown < 0 else f"after step {shown}"
    marks = ""
    if rejected:
        marks += f' · <span style="{swatch}border:3px solid #d73027;"></span>sent back by self-verify'
    if stray:
        marks += f' · <span style="{swatch}border:2px dashed #b00020;"></span>committed after the end of text'
    verdict = theorem1(record) if record else None
    theorem = ""
    if verdict and verdict["verdict"] != "serial":
        colour = "#1a9850" if verdict["verdict"] == "guaranteed" else "#d73027"
        theorem = (f'<div class="dl-theorem" data-verdict="{verdict["verdict"]}" style="font-size:16px;'
                   f'color:{colour};font-weight:600;">Step {shown}: {html.escape(verdict["text"])}</div>')
    theorem += _what_if_line(replay, what_if_threshold, shown)
    legend = (f'{theorem}<div class="dl-legend" style="font-size:14px;color:#444;margin-top:4px;">'
              f"{where} · {committed}/{len(ids)} committed · {scale} · "
              f'<span style="{swatch}outline:2px solid #e4572e;"></span>committed this step · '
              f'<span style="{swatch}background:#e5e5e5;"></span>masked · faded: end of text{marks} · '
              f"small numbers: answer position</div>")
    return f'<div class="dl-grid" style="line-height:1.2;">{"".join(boxes)}</div>{legend}'


# ----------------------------------------------------------------------------- Theorem 1

def theorem1(record: dict) -> dict:
    """Whether Fast-dLLM's Theorem 1 guarantees a step's commits: n positions, each with
    confidence above 1 - ε, and (n + 1)ε <= 1; then greedy parallel decoding commits what greedy
    one-at-a-time decoding would. ε is 1 - the least confidence among the commits.

    Returns ``n``, ``epsilon``, ``bound`` ((n + 1)ε), ``verdict`` ("serial" for one commit or
    none, "guaranteed", "no guarantee") and ``text`` (one line for a caption or hover).
    """
    confidences = [float(c) for _, _, c in record.get("committed") or []]
    n = len(confidences)
    if n <= 1:
        return {"n": n, "epsilon": None, "bound": None, "verdict": "serial",
                "text": f"{n} commit: one token at a time, nothing to guarantee"}
    epsilon = 1.0 - min(confidences)
    bound = (n + 1) * epsilon
    verdict = "guaranteed" if bound <= 1.0 else "no guarantee"
    sign = "≤" if bound <= 1.0 else ">"
    return {"n": n, "epsilon": epsilon, "bound": bound, "verdict": verdict,
            "text": f"Theorem 1: {verdict} (n = {n}, ε = {epsilon:.2f}, (n+1)ε = {bound:.2f} {sign} 1)"}


# ----------------------------------------------------------------------------- what-if threshold

def what_if(trace: Trace, threshold: float) -> dict:
    """Replay the run's stored confidences under the threshold rule with ``threshold`` (τ′),
    without the model: at each step, the block's masked positions with confidence >= τ′ (at
    least the most confident one) are what τ′ would commit.

    The replay is exact while its commits equal the run's: the model then saw the same tokens.
    ``diverges_at`` is the first step where they differ (None if never); from there on the run
    would have gone elsewhere, so ``commits`` (answer positions per step) stops at that step.
    Sampled runs (temperature > 0) store the top probability, not the sampled token's, so there
    the replay says nothing (``reason``).
    """
    settings = trace.get("settings") or {}
    if float(settings.get("temperature") or 0.0) > 0:
        return {"commits": [], "diverges_at": None, "reason": "what-if needs a greedy run (temperature 0)"}
    P, block_size = _prompt_len(trace), int(settings.get("block_size") or _gen_length(trace) or 1)
    commits: list[list[int]] = []
    for i, record in enumerate(trace.get("steps") or []):
        start = P + int(record.get("block") or 0) * block_size
        scored = [(int(p), float(c)) for p, c in zip(record.get("masked_positions") or [],
                                                      record.get("masked_confidence") or [])
                  if start <= int(p) < start + block_size]
        if not scored:
            return {"commits": commits, "diverges_at": None, "reason": "this trace has no per-step confidences"}
        chosen = [p for p, c in scored if c >= threshold] if threshold < 1 else []
        chosen = chosen or [max(scored, key=lambda pc: pc[1])[0]]
        commits.append(sorted(p - P for p in chosen))
        actual = sorted(int(p) - P for p, _, _ in record.get("committed") or [])
        if commits[-1] != actual or record.get("revoked"):
            return {"commits": commits, "diverges_at": i, "reason": ""}
    return {"commits": commits, "diverges_at": None, "reason": ""}


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
    rx, ry, rtext = [], [], []
    for i, record in enumerate(steps):
        for position, token, score in (record.get("policy") or {}).get("rejected_at") or []:
            rx.append(int(position) - P)
            ry.append(i)
            rtext.append(f"self-verify sent '{html.escape(_visible(_token_text(trace, token)))}' back to mask · "
                         f"conflict score {score:.3f}")
    if rx:
        fig.add_trace(go.Scatter(
            x=rx, y=ry, mode="markers", name="sent back (self-verify)", hovertext=rtext, hoverinfo="text",
            marker={"symbol": "square-open", "color": "#d73027", "size": 13, "line": {"width": 3}},
        ))
    verdicts = [theorem1(record) for record in steps]
    for verdict, symbol, colour in (("guaranteed", "circle", "#1a9850"), ("no guarantee", "x-thin-open", "#d73027")):
        rows = [i for i, v in enumerate(verdicts) if v["verdict"] == verdict]
        fig.add_trace(go.Scatter(
            x=[-1.2] * len(rows), y=rows, mode="markers", name=f"Theorem 1: {verdict}", cliponaxis=False,
            hovertext=[verdicts[i]["text"] for i in rows], hoverinfo="text",
            marker={"symbol": symbol, "size": 11, "color": colour, "line": {"color": colour, "width": 3}},
        ))
    fig.update_xaxes(title_text="answer position", range=[-1.7, n - 0.5])
    _step_axis(fig, len(steps))
    return _style(fig, title)


# ----------------------------------------------------------------------------- KV

MEAN_LAYERS = "mean"
# One colour scale for every cosine view, fixed, so a colour means the same value everywhere.
# Most of the range goes to cosines near 1, where committed positions live; anything at or
# below 0 (unrelated or opposite) takes the darkest colour, its true value in the hover.
COS_SCALE = [[0.0, "#2d0a4e"], [0.5, "#3b528b"], [0.9, "#21918c"], [0.99, "#7ad151"], [1.0, "#fde725"]]
COS_TICKS = {0.0: "≤ 0 unrelated", 0.5: "0.5", 1.0: "1 unchanged"}


def _layer_values(record: dict, view: str, layer: str, which: str) -> list | None:
    """One step's cosines for one layer (or the mean over every recorded layer)."""
    if view == "drift":
        by_layer = record.get("kv") or {}
    else:
        key = "true_drift" if view == "true_drift" else "cache_vs_exact"
        by_layer = (record.get("exact") or {}).get(key) or {}
    if layer != MEAN_LAYERS:
        return (by_layer.get(layer) or {}).get(which)
    rows = [[_num(v) for v in (data or {}).get(which) or []] for data in by_layer.values()]
    rows = [r for r in rows if r]
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    # A null (nothing cached there yet) is null in every layer alike, so the plain mean keeps it.
    return np.array(rows, dtype=np.float64).mean(axis=0).tolist()


def _kv_rows(trace: Trace, steps: list[dict], layer: str, which: str, view: str):
    """Per-step rows of the chosen view plus, for "drift", the rows of reused (cached) cells."""
    P, n = _prompt_len(trace), _gen_length(trace)
    values = np.full((len(steps), n), NAN, dtype=np.float32)
    cached = np.full((len(steps), n), NAN, dtype=np.float32)
    for i, record in enumerate(steps):
        cos = _layer_values(record, view, layer, which) or []
        if view == "drift":
            recomputed = record.get("recomputed") or []
            cached[i] = 1.0  # reused, except where this step recomputed
            for j, position in enumerate(recomputed):
                p = int(position) - P
                if 0 <= p < n:
                    # null or absent (kv == {}): the cache held nothing there yet
                    values[i, p] = _num(cos[j] if j < len(cos) else None)
                    cached[i, p] = NAN
        else:
            for p, c in enumerate(cos[P:P + n]):
                values[i, p] = _num(c)
    return values, cached


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
    layer = str(layer)
    names = {"drift": "KV drift", "true_drift": "True KV drift (exact)", "cache_error": "Cache vs exact"}
    where = "all layers (mean)" if layer == MEAN_LAYERS else f"layer {layer}"
    title = f"{names[view]} · {where} · {which.upper()}"
    steps = _steps(trace, upto_step)
    if not steps:
        return _message_figure(EMPTY_MESSAGE, title)
    if view == "drift":
        if not any(s.get("recomputed") is not None for s in steps):
            return _message_figure(SUMMARY_MESSAGE, title)
        if layer != MEAN_LAYERS and not any(layer in (s.get("kv") or {}) for s in steps):
            return _message_figure(f"layer {layer} is not in this trace", title)
    elif not any(s.get("exact") for s in steps):
        return _message_figure("exact-drift data needs the setting exact_drift on", title)
    if len(steps) == 1:
        return _message_figure("one step only: there is no earlier K/V to compare with", title)
    n = _gen_length(trace)
    values, cached = _kv_rows(trace, steps, layer, which, view)
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
        z=values, x=columns, y=rows, name=view, zmin=0.0, zmax=1.0, colorscale=COS_SCALE,
        hoverongaps=False, **gaps,
        colorbar={"title": {"text": "cosine"}, "thickness": 14, "tickvals": list(COS_TICKS),
                  "ticktext": list(COS_TICKS.values()), "tickfont": {"size": 14}},
        hovertemplate=f"pos %{{x}} · step %{{y}}<br>{label[view]} %{{z:.4f}}<extra></extra>",
    ))
    line_x, line_y = _commit_line(trace, steps)
    fig.add_trace(go.Scatter(
        x=line_x, y=line_y, mode="lines", name="committed below", line={"color": "#111", "width": 2.5},
        hoverinfo="skip",
    ))
    refresh = [i for i, s in enumerate(steps) if s.get("full_refresh")]
    fig.add_trace(go.Scatter(
        x=[-1.0] * len(refresh), y=refresh, mode="markers", name="refresh", cliponaxis=False,
        marker={"symbol": "triangle-right", "size": 11, "color": "#e4572e"},
        hovertemplate="step %{y}: full refresh (every position recomputed)<extra></extra>",
    ))
    right = n - 0.5
    probes = [(i, s["policy"]["drift"], bool(s["policy"].get("refresh_next")))
              for i, s in enumerate(steps) if (s.get("policy") or {}).get("drift") is not None]
    if probes:  # drift_refresh: the attention drift it measured, and what it decided, right of each row
        gamma = ((trace.get("settings") or {}).get("cache_params") or {}).get("gamma")
        below = f" < γ {gamma}" if gamma is not None else ""
        fig.add_trace(go.Scatter(
            x=[n + 0.4] * len(probes), y=[i for i, _, _ in probes], mode="markers", name="attention drift probe",
            cliponaxis=False, hoverinfo="text",
            hovertext=[f"step {i}: attention drift cos {d:.3f}" + (f"{below} → the next step refreshes" if r else
                                                                    " → keep reusing the cache") for i, d, r in probes],
            marker={"symbol": ["diamond" if r else "circle" for *_, r in probes], "size": 11,
                    "color": ["#e4572e" if r else "#999" for *_, r in probes]},
        ))
        right = n + 1.0
    fig.update_xaxes(title_text="answer position", range=[-1.6, right])
    _step_axis(fig, len(steps))
    return _style(fig, title)


# ----------------------------------------------------------------------------- cache

def cache_panel(trace: Trace, upto_step: int | None = None) -> go.Figure:
    """Bars: G (positions recomputed) per step; lines: hit rate per step and cumulative (right axis)."""
    title = "Cache: recomputed positions and hit rate"
    steps = _steps(trace, upto_step)
    if not steps:
        return _message_figure(EMPTY_MESSAGE, title)
    if (trace.get("settings") or {}).get("cache") == "none":
        return _message_figure("no cache in this run: every forward recomputes every position (hit rate 0)", title)
    x = np.arange(len(steps))
    g = np.array([int(s.get("g") or 0) for s in steps])
    reads = np.array([int(s.get("reads") or 0) for s in steps])
    seen = g + reads
    rate = np.divide(reads, seen, out=np.zeros(len(steps)), where=seen > 0)
    total_seen = np.cumsum(seen)
    cumulative = np.divide(np.cumsum(reads), total_seen, out=np.zeros(len(steps)), where=total_seen > 0)
    refresh = np.array([bool(s.get("full_refresh")) for s in steps])
    fig = go.Figure()
    # Two bar traces, so the legend names both shades.
    for name, rows, colour in (("G, full refresh", refresh, "#3d6aa6"), ("G, partial", ~refresh, "#a6c4e6")):
        fig.add_trace(go.Bar(x=x[rows], y=g[rows], name=name, marker_color=colour,
                             hovertemplate=f"step %{{x}}: G %{{y}} ({name[3:]})<extra></extra>"))
    fig.update_layout(barmode="overlay")
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
      tokens_per_s     committed tokens per second of model time, end-of-text padding included
      content_tokens_per_s  content tokens per second of model time: the headline speed. While
                       running, the committed tokens before the first committed end of text
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
    if not finished:
        ids = state_at(trace, len(steps) - 1)["ids"]
        before_end = ids[:_first_end(trace, ids)]
        content = sum(t is not None for t in before_end)
        values["content_tokens_per_s"] = content / values["model_s"] if values["model_s"] else 0.0
    busy = values["model_s"] + values["other_s"]
    return {"steps": len(steps), "committed": committed, "revisions": revisions, "gen_length": _gen_length(trace), **values,
            "other_share": values["other_s"] / busy if busy else 0.0, "finished": finished}


def _final_numbers(stats: dict) -> dict:
    return {"nfe": stats["nfe"], "tau": stats["tokens_per_forward"], "content_tau": stats["content_tokens_per_forward"],
            "content_tokens": stats["content_tokens"], "model_s": stats["model_s"], "other_s": stats["other_s"],
            "exact_s": stats["exact_s"], "tokens_per_s": stats["tokens_per_s"],
            "content_tokens_per_s": stats["content_tokens_per_s"], "wall_s": stats["wall_s"],
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
        ("speed", _fmt(nums.get("content_tokens_per_s"), ".1f"), "answer tokens / s (model time)"),
        ("all tokens", _fmt(nums.get("tokens_per_s"), ".1f"), "tokens / s, end-of-text padding included"),
        ("NFE", _fmt(nums.get("nfe"), "d"), "forwards"),
        ("committed", f"{_fmt(nums.get('committed'), 'd')}/{_fmt(nums.get('gen_length'), 'd')}", "tokens"),
        ("τ", _fmt(nums.get("tau"), ".2f"), "tokens / forward"),
        ("content τ", _fmt(nums.get("content_tau"), ".2f"), "content tokens / forward"),
        ("model", _fmt(None if nums.get("model_s") is None else nums["model_s"] * 1e3, ".0f"), "ms"),
        ("wall", _fmt(nums.get("wall_s"), ".2f"), "s" if nums.get("finished") else "s (model + other, so far)"),
        ("outside model", _fmt(nums.get("other_share"), ".0%"), "of time"),
        ("mean G", _fmt(nums.get("mean_g"), ".1f"), "positions / forward"),
        ("cache hits", _fmt(nums.get("hit_rate"), ".0%"), "cumulative"),
    ]
    if nums.get("revisions"):
        cards.insert(4, ("revisions", _fmt(nums["revisions"], "d"), "tokens taken back"))
    if nums.get("exact_s"):
        cards.append(("exact-drift diagnostic", _fmt(nums["exact_s"] * 1e3, ".0f"), "ms, kept out of model time (in wall)"))
    card = ("display:inline-block;margin:3px;padding:4px 8px;border:1px solid #ddd;border-radius:6px;"
            "min-width:6.5em;vertical-align:top;background:#fafafa;")
    body = "".join(
        f'<div class="dl-card" style="{card}"><div style="font-size:14px;color:#555;">{html.escape(label)}</div>'
        f'<div style="font-size:22px;font-weight:600;">{html.escape(value)}</div>'
        f'<div style="font-size:14px;color:#666;">{html.escape(unit)}</div></div>'
        for label, value, unit in cards
    )
    return f'<div class="dl-numbers">{body}</div>'


# ----------------------------------------------------------------------------- compare

def compare(trace_a: Trace, trace_b: Trace) -> dict:
    """How run b compares with run a (e.g. a = no cache, b = cached).

    Keys: ``speedup_wall`` and ``speedup_model`` (a's time / b's time: >1 means b is faster; None
    when b's time is 0), per side (``_a``/``_b``): ``answer``, ``wall_s``, ``model_s``, ``nfe``,
    ``tau``, ``content_tau``; ``agreement`` (fraction of answer positions with equal final ids;
    positions only one run has count as different) and ``first_difference`` (first differing
    answer position, None when identical).
    """
    na, nb = numbers(trace_a), numbers(trace_b)
    ids_a, ids_b = list(trace_a.get("final_ids") or []), list(trace_b.get("final_ids") or [])
    length = max(len(ids_a), len(ids_b))
    same = sum(x == y for x, y in zip(ids_a, ids_b))
    first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), None)
    if first is None and len(ids_a) != len(ids_b):
        first = min(len(ids_a), len(ids_b))
    sides = {}
    for side, trace, nums in (("a", trace_a, na), ("b", trace_b, nb)):
        sides.update({f"answer_{side}": trace.get("text", ""), f"wall_s_{side}": nums["wall_s"],
                      f"model_s_{side}": nums["model_s"], f"nfe_{side}": nums["nfe"], f"tau_{side}": nums["tau"],
                      f"content_tau_{side}": nums["content_tau"]})
    return {
        "speedup_wall": na["wall_s"] / nb["wall_s"] if nb["wall_s"] else None,
        "speedup_model": na["model_s"] / nb["model_s"] if nb["model_s"] else None,
        **sides,
        "agreement": same / length if length else 1.0,
        "first_difference": first,
    }


def compare_html(result: dict) -> str:
    """The :func:`compare` numbers as one table: a row per measure, a column per side."""
    def pair(key: str, spec: str, unit: str = "") -> tuple[str, str]:
        return (_fmt(result[f"{key}_a"], spec) + unit, _fmt(result[f"{key}_b"], spec) + unit)

    rows = [
        ("answer", (result["answer_a"], result["answer_b"])),
        ("wall time", pair("wall_s", ".3f", " s")),
        ("model time", pair("model_s", ".3f", " s")),
        ("forwards (NFE)", pair("nfe", "d")),
        ("τ (tokens / forward)", pair("tau", ".2f")),
        ("content τ", pair("content_tau", ".2f")),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(a)}</td><td>{html.escape(b)}</td></tr>"
                   for k, (a, b) in rows)
    first = result["first_difference"]
    summary = [
        ("speedup of B (wall)", _fmt(result["speedup_wall"], ".2f") + "×"),
        ("speedup of B (model time)", _fmt(result["speedup_model"], ".2f") + "×"),
        ("token agreement", _fmt(result["agreement"], ".1%")),
        ("first difference", "none" if first is None else f"answer position {first}"),
    ]
    body += "".join(f'<tr><td>{html.escape(k)}</td><td colspan="2"><b>{html.escape(v)}</b></td></tr>' for k, v in summary)
    return (f'<table class="dl-compare" style="font-size:15px;"><tr><th></th><th>A</th><th>B</th></tr>{body}</table>')


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


def sweep_figure(report: dict) -> go.Figure:
    """Accuracy (with its 95% interval over each point's n problems) against answer tokens/s for
    every sweep point, each labelled with its knobs, and every added result (an lm-eval run,
    another sweep) as a diamond labelled with its source; the Pareto frontier joined by a line.
    The axes zoom to the data."""
    rows = report.get("rows") or []
    if not rows:
        return _message_figure("no sweep points yet", "Sweep: accuracy vs speed")
    n = int(report.get("problems") or 0)
    accuracy = [r["accuracy"] for r in rows]
    low, high = zip(*(wilson_interval(a, int(r.get("n") or n)) for a, r in zip(accuracy, rows)))
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r["model_tok_s"] for r in rows], y=accuracy, mode="markers+text", name="points",
        text=[" · ".join(filter(None, [r.get("label"), _point_label(r["point"])])) for r in rows],
        textposition="top center",
        textfont={"size": 14},
        error_y={"type": "data", "symmetric": False, "array": [h - a for h, a in zip(high, accuracy)],
                 "arrayminus": [a - lo for a, lo in zip(accuracy, low)], "color": "#aaa", "thickness": 1.5},
        marker={"size": 12, "color": ["#e4572e" if r["pareto"] else "#888" for r in rows],
                "symbol": ["diamond" if r.get("label") else "circle" for r in rows]},
        hovertemplate="%{text}<br>%{x:.1f} tok/s · accuracy %{y:.0%}<extra></extra>",
    ))
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["model_tok_s"])
    fig.add_trace(go.Scatter(x=[r["model_tok_s"] for r in front], y=[r["accuracy"] for r in front], mode="lines",
                             name="Pareto frontier", line={"color": "#e4572e", "width": 2}, hoverinfo="skip"))
    fig.update_xaxes(title="answer tokens / s (model time)")
    span = max(0.05, max(high) - min(low))
    sizes = sorted({int(r.get("n") or n) for r in rows})
    fig.update_yaxes(title=f"accuracy (n = {', '.join(map(str, sizes))}, bars: 95% interval)", tickformat=".0%",
                     range=[max(-0.02, min(low) - 0.1 * span), min(1.05, max(high) + 0.15 * span)])
    return _style(fig, "Sweep: accuracy vs speed (red: Pareto frontier)", height=420)


SWEEP_TABLE_HEADERS = ["source", "knobs", "accuracy", "tok/s", "NFE", "pareto"]


def sweep_table(report: dict) -> list[list]:
    """Rows for the sweep table (:data:`SWEEP_TABLE_HEADERS`): one per point, where it came from
    and its knobs first, whatever knobs the sweep or the added report varied."""
    return [[r.get("label") or "sweep", _point_label(r["point"]), round(r["accuracy"], 4), round(r["model_tok_s"], 1),
             round(r["nfe"], 1), "yes" if r["pareto"] else ""] for r in report.get("rows") or []]


def cost_table_html(rows: list[dict], model: str, device: str, trace: Trace) -> str:
    """The projection of :func:`dllm_local.experiments.costmodel.project` as a table, with its
    formula written out for this run, and this machine's measured step apart."""
    run = rows[0]
    head = ("<tr><th>strategy</th><th>G (positions / forward)</th><th>τ (answer tokens / forward)</th>"
            "<th>step floor</th><th>bound</th><th>answer tokens / s</th><th>speedup vs AR</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['strategy'])}</td><td>{r['g']:.0f}</td><td>{r['tau']:.2f}</td>"
        f"<td>{r['floor_ms']:.2f} ms</td><td>{r['bound']}</td><td>{r['tokens_per_s']:.0f}</td>"
        f"<td><b>{r['speedup_vs_ar']:.2f}×</b></td></tr>"
        for r in rows
    )
    stats = trace.get("stats") or {}
    measured = stats["model_s"] / max(1, stats["nfe"]) * 1e3 if stats.get("nfe") else None
    model_name = (trace.get("model") or {}).get("name", "the loaded model")
    formula = (f"step floor = max(weight bytes / bandwidth, G × 2 × params / FLOP rate) = "
               f"max({run['read_ms']:.2f} ms, {run['g']:.0f} × 2 × params / FLOP rate = {run['compute_ms']:.2f} ms) "
               f"= {run['floor_ms']:.2f} ms; tokens/s = τ / floor; speedup = this over the autoregressive row "
               f"(one token per weight read at batch 1).")
    note = ("" if measured is None else
            f"Measured here: {html.escape(str(model_name))} took {measured:.2f} ms per forward of model time "
            f"on this machine; the projection above uses only this run's G and τ.")
    style = 'style="font-size:15px;color:#333;"'
    return (f'<div {style}><b>This run projected onto {html.escape(model)} on {html.escape(device)}</b>, batch 1, '
            f"bf16.</div><table class=\"dl-cost\" {style}>{head}{body}</table>"
            f'<div class="dl-formula" {style}>{html.escape(formula)}</div><div {style}>{note}</div>')


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
        return _message_figure("no concurrency levels", title)
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
    fig = _style(fig, title, height=height)
    fig.update_layout(legend={"font": {"size": 15}})
    return fig
