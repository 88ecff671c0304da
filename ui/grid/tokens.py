"""The token grid: the answer region at one step as HTML boxes, with its legend, the Theorem 1
verdict of the step, what the policy sent back or accepted, the what-if threshold's frames and,
for the embedded tiny model, a word when the prompt is none of its tasks. Trace dict in, HTML out."""
from __future__ import annotations

import html

from dllm_local.tiny.tasks import TASKS, recognise

from . import policy_marks
from ..canvas.parts import is_canvas
from ..canvas.views import canvas_grid_html
from .ends import (BOX, CONF_STOPS, COLLAPSE_PADDING, MASKED, POS, STEP_STOPS, SWATCH, attr, css, end_runs, fold_end_runs, interp,
                   text_colour, token_label)
from ..parts.replay import Trace, drafts, first_end, is_end_token, prompt_len, prompt_of, state_at, theorem1, what_if

__all__ = ["CAPTION", "COLLAPSE_PADDING", "OFF_TASK", "TINY_MODEL", "off_task_notice", "token_grid_html", "token_label"]

CAPTION = ("Each box is one answer position: colour says when (or how confidently) it was committed; "
           "outlined boxes were committed in this step, grey boxes are still masked.")


TINY_MODEL = "tiny"  # the embedded model's name in a trace's and the session's model summary
_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


OFF_TASK = (f"The embedded tiny model knows {_COUNTS[len(TASKS)] if len(TASKS) < len(_COUNTS) else len(TASKS)} "
            f"synthetic tasks ({', '.join(TASKS)}); other questions give noise. Load a real model for open questions.")


def off_task_notice(prompt: str | None, model: dict) -> str:
    """What the page says when a model trained on the tiny tasks (its ``trained_tasks``; an older
    trace's tiny model) is given a prompt that none of them pose (its answer is then noise); empty
    for another model, a task prompt or an unknown prompt."""
    trained = model.get("trained_tasks", TASKS if model.get("name") == TINY_MODEL else None)
    problem = recognise(prompt) if prompt is not None else None
    if not trained or prompt is None or (problem is not None and problem.task in trained):
        return ""
    return OFF_TASK


def chip_rgb(color_by: str, commit_step: int, confidence: float | None, last: int) -> tuple[int, int, int]:
    """A committed box's colour: by the step that committed it, or by its confidence then (a token
    a branch forced has none: coloured by its step)."""
    if color_by == "confidence" and confidence is not None:
        return interp(CONF_STOPS, confidence)
    return interp(STEP_STOPS, 0.1 + 0.9 * commit_step / max(1, last))


# This step's commits are outlined inside the box, τ′'s frame lies outside it: a box can show both.
_COMMIT_OUTLINE = "outline:3px solid #e4572e;outline-offset:-3px;"
_WHAT_IF_SHADOW = "0 0 0 3px #1a9850"
# The theorem line's green: 16 px bold is not large text, so 4.5:1 on white (WCAG 1.4.3); the plots'
# #1a9850 (3.7:1) is a mark's colour, enough for a graphic (3:1), not for this line's words.
GUARANTEED_INK = "#168344"
_WHAT_IF_FRAME = f"box-shadow:{_WHAT_IF_SHADOW};border-radius:6px;"
def _history(trace: Trace, history: list[list]) -> tuple[str, str]:
    """A position's taken-back tokens: struck through under the box, and told in the hover."""
    if not history:
        return "", ""
    struck = "".join(f'<s class="dl-revoked" style="font-size:14px;color:#b00020;">'
                     f"{html.escape(token_label(trace, token))}</s>" for token, *_ in history)
    told = "; ".join(f"'{token_label(trace, token)}' committed at step {at} (confidence {then:.2f}), "
                     f"taken back at step {back} (probability then {now:.2f})"
                     for token, at, back, then, now in history)
    return struck, f" · history: {told}"


def _edits(trace: Trace, edits: list[list], colour: str) -> tuple[str, str]:
    """A position's rewritten tokens (an editing policy): the last one replaced, struck through under
    the box in its text colour with a count of the earlier ones (a box stays one line taller, however
    many edits); every edit told in the hover."""
    old, _, at, _ = edits[-1]
    more = f'<span class="dl-edit-count" style="font-size:12px;color:inherit;"> +{len(edits) - 1}</span>' if len(edits) > 1 else ""
    struck = (f'<span class="dl-edit-old" data-step="{at}" style="display:block;font-size:14px;color:{colour};">'
              f"✎<s style=\"color:inherit;\">{html.escape(token_label(trace, old))}</s>{more}</span>")
    told = "".join(f" · edited at step {at}: '{token_label(trace, old)}' -> '{token_label(trace, new)}' "
                   f"(probability {q:.2f})" for old, new, at, q in edits)
    return struck, told


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


def _theorem_line(trace: Trace, record: dict, shown: int) -> str:
    """Theorem 1 for the step shown. Where self-verify sent drafts back, the theorem is told for
    what was drafted (the commits and the sent-back drafts, at their confidences this step) and
    for what was kept: a guarantee of the kept commits says nothing of the drafts sent back, and
    drafts without one say nothing against the commits kept (the line's colour is theirs)."""
    kept = theorem1(record)
    rejected = (record.get("policy") or {}).get("rejected_at") or []
    if not rejected:
        if kept["verdict"] == "serial":
            return ""
        colour = GUARANTEED_INK if kept["verdict"] == "guaranteed" else "#d73027"
        return (f'<div class="dl-theorem" data-verdict="{kept["verdict"]}" style="font-size:16px;color:{colour};'
                f'font-weight:600;">Step {shown}: {html.escape(kept["text"])}</div>')
    drafted_here = drafts(record)
    drafted = theorem1({"committed": drafted_here})
    P = prompt_len(trace)
    which = ", ".join(f"'{token_label(trace, t)}' at pos {p - P}" for p, t, _ in rejected)
    # Coloured for what was kept (the commits): red only where the kept commits have no guarantee.
    colour = {"guaranteed": GUARANTEED_INK, "no guarantee": "#d73027"}.get(kept["verdict"], "#444")
    return (f'<div class="dl-theorem" data-verdict="{kept["verdict"]}" data-drafts-verdict="{drafted["verdict"]}" '
            f'style="font-size:16px;color:{colour};font-weight:600;">Step {shown}: self-verify sent '
            f"{len(rejected)} of {len(drafted_here)} drafts back ({html.escape(which)}). On the {len(drafted_here)} drafts, "
            f"{html.escape(drafted['text'])}. On the {kept['n']} kept: {html.escape(kept['text'])}.</div>")


def token_grid_html(trace: Trace, step: int, color_by: str = "step", what_if_threshold: float | None = None) -> str:
    """HTML boxes for the answer region after ``step``; ``color_by`` is "step" or "confidence".

    Each box shows its answer position above its token. Tokens committed after the first end of
    text are marked (they are not part of the answer); each run of end-of-text tokens collapses into
    one chip that expands on click. Drafts self-verify sent back stay struck through under their
    position. With ``what_if_threshold`` (τ′), the positions τ′ would have committed at this step
    get a green frame (see :func:`what_if`) outside the red outline of this step's commits. In a
    Flash-dLLM run (a sliding window) the window's boxes are barred: see ``policy_marks``.
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', not {color_by!r}")
    if is_canvas(trace):  # a canvas model commits nothing: its grid shows each canvas's drafts
        return canvas_grid_html(trace, step, color_by)
    state = state_at(trace, step)
    shown = state["step"]
    last = len(trace.get("steps") or []) - 1  # palette spans the whole run: stable colours while scrubbing
    ids = state["ids"]
    answer_end = first_end(trace, ids)
    record = (trace.get("steps") or [])[shown] if shown >= 0 else {}
    P = prompt_len(trace)
    at_commit = {(i, int(q) - P): pairs for i, r in enumerate((trace.get("steps") or [])[: max(0, shown + 1)])
                 for q, pairs in r.get("top_candidates") or []}
    top = {int(pos) - P: pairs for pos, pairs in record.get("top_candidates") or []}
    scored = {int(pos) - P: c for pos, c in zip(record.get("masked_positions") or [], record.get("masked_confidence") or [])}
    sent_back = policy_marks.sent_back(trace, shown)
    guided = "guider_accepted" in (record.get("policy") or {})
    window, accepted = policy_marks.window(trace, record), policy_marks.accepted(trace, record)  # Flash-dLLM
    replay = what_if(trace, what_if_threshold) if what_if_threshold is not None else None
    would = set()
    if replay and 0 <= shown < len(replay["commits"]):
        would = set(replay["commits"][shown])
    boxes, stray, eventful, ends = [], False, set(), {}
    for p, (token, s, conf) in enumerate(zip(ids, state["commit_step"], state["confidence"])):
        number = POS.format(f"{p}{policy_marks.ACCEPTED_MARK}" if p in accepted else p)
        past, past_title = _history(trace, state["history"][p])
        drafts = sent_back.get(p, [])
        past += "".join(f'<s class="dl-sent-back" data-step="{at}" style="font-size:14px;color:#d73027;">'
                        f"{html.escape(token_label(trace, tok))}</s>" for at, tok, _ in drafts)
        past_title += "".join(f" · self-verify sent draft '{token_label(trace, tok)}' back to mask at step {at} "
                              f"(conflict score {score:.3f})" for at, tok, score in drafts)
        if token is None:
            title = f"pos {p} · masked" + past_title
            if p in top:
                title += f" · step {shown}'s top candidates: " + ", ".join(
                    f"'{token_label(trace, t)}' {q:.2f}" for t, q in top[p])
            elif scored.get(p) is not None:  # a later block: the trace keeps its confidence, not its candidates
                title += (f" · step {shown}'s confidence {scored[p]:.2f} (top-k is recorded for the "
                          "current block only)")
            style, classes = BOX + MASKED, "dl-tok dl-masked"
            if any(at == shown for at, _, _ in drafts):
                style += "border:3px solid #d73027;"
                classes += " dl-rejected"
            if p in would:
                style += _WHAT_IF_FRAME
                classes += " dl-whatif-box"
            if window and p in window:
                style += policy_marks.WINDOW_MASKED + policy_marks.window_bar(_WHAT_IF_SHADOW if p in would else "")
                classes += " dl-window"
            boxes.append(f'<span class="{classes}" title="{attr(title)}" data-pos="{p}" style="{style}">'
                         f"{number}▢{past}</span>")
            continue
        vis = token_label(trace, token)
        rgb = chip_rgb(color_by, s, conf, last)
        style = f"{BOX}background:{css(rgb)};color:{text_colour(rgb)};"
        classes = ["dl-tok"]
        title = (f"pos {p} · token '{vis}' · step {s} · confidence {conf:.2f}" if conf is not None else
                 f"pos {p} · token '{vis}' · forced after step {s} by the branch (no forward chose it)") + past_title
        if conf is None:
            style += "outline:3px dashed #7b2cbf;outline-offset:1px;"
            classes.append("dl-forced")
        if (s, p) in at_commit:  # why it is this token: the candidates of the forward that committed it
            title += " · top candidates when committed: " + ", ".join(
                f"'{token_label(trace, t)}' {q:.2f}" for t, q in at_commit[s, p])
        if s == shown:
            style += _COMMIT_OUTLINE
            classes.append("dl-new")
            if guided:
                title += " · accepted by the guider"
            if p in accepted:
                title += f" · accepted by the verify forward (P(draft | masked) {accepted[p]:.2f})"
                classes.append("dl-accepted")
        # An event of its own (a forced token too: folded, its dashed outline would never show): kept
        # out of any folded run of ends.
        if p in would or past or state["edits"][p] or conf is None:
            eventful.add(p)
        if is_end_token(trace, token):
            ends[vis] = ends.get(vis, 0) + 1
            # faded as padding, unless something happens to it: its marks must stay readable
            style += "font-style:italic;" + ("" if s == shown or p in eventful else "opacity:0.35;")
            classes.append("dl-end")
            title += " · end of text"
        elif answer_end is not None and p > answer_end:
            stray = True
            style += "border:2px dashed #b00020;text-decoration:line-through;"
            classes.append("dl-after-end")
            title += " · committed after the end of text: not part of the answer"
        if p in would:
            style += _WHAT_IF_FRAME
            classes.append("dl-whatif-box")
        if past:
            classes.append("dl-revised")
        if state["edits"][p]:
            struck, told = _edits(trace, state["edits"][p], text_colour(rgb))
            past, title = past + struck, title + told
            classes.append("dl-edited")
        if window and p in window:
            style += policy_marks.window_bar(_WHAT_IF_SHADOW if p in would else "")
            classes.append("dl-window")
        boxes.append(f'<span class="{" ".join(classes)}" title="{attr(title)}" data-pos="{p}" data-token="{token}" '
                     f'style="{style}">{number}{html.escape(vis)}{past}</span>')
    tail = policy_marks.masked_tail(trace, record, ids) if window is not None else None
    if tail and tail[1] - tail[0] >= COLLAPSE_PADDING:  # the positions a sliding-window run never decodes
        chip = policy_marks.tail_chip(*tail, sum(tail[0] <= p < tail[1] for p in window), BOX)
        boxes[tail[0]:] = [f'<details class="dl-pad" style="display:inline;">{chip}{"".join(boxes[tail[0]:])}</details>']
    new = {p for p, s in enumerate(state["commit_step"]) if s is not None and s == shown}
    fold_end_runs(trace, ids, boxes, end_runs(trace, ids, eventful, new), BOX, _COMMIT_OUTLINE,
                  lambda start, stop: policy_marks.window_bar() if window and any(start <= p < stop for p in window)
                  else "")
    swatch = SWATCH
    if color_by == "confidence":
        scale = (f'<span style="{swatch}background:{css(CONF_STOPS[0])}"></span>low → high confidence at commit'
                 f'<span style="{swatch}background:{css(CONF_STOPS[-1])}"></span>')
    elif last >= 1:
        scale = (f'<span style="{swatch}background:{css(interp(STEP_STOPS, 0.1))}"></span>step 0 → step {last}'
                 f'<span style="{swatch}background:{css(interp(STEP_STOPS, 1.0))}"></span>')
    else:  # a run of one step (or none yet): one colour
        scale = f'<span style="{swatch}background:{css(interp(STEP_STOPS, 0.1))}"></span>step 0'
    committed = len(ids) - state["masked"]
    where = "before any step" if shown < 0 else f"after step {shown}"
    marks = ""
    if any(at == shown for drafts in sent_back.values() for at, _, _ in drafts):
        marks += f' · <span style="{swatch}border:3px solid #d73027;"></span>sent back by self-verify this step'
    if sent_back:
        marks += ' · <s style="color:#d73027;">red struck</s> under a box: a draft self-verify sent back'
    if window is not None:
        marks += policy_marks.window_legend(window, accepted, swatch)
    if any(state["edits"]):
        marks += ' · ✎<s>struck</s> under a box: the token an edit rewrote (+N: earlier edits there)'
    if stray:
        marks += f' · <span style="{swatch}border:2px dashed #b00020;"></span>committed after the end of text'
    ends_legend = (f" · faded italic {', '.join(html.escape(label) for label in ends)}: end of text" if ends else "")
    notice = off_task_notice(prompt_of(trace), trace.get("model") or {})
    head = (f'<div class="dl-off-task" style="font-size:16px;color:#8a4b00;font-weight:600;">⚠ {html.escape(notice)}'
            "</div>" if notice else "")
    lines = _theorem_line(trace, record, shown) + policy_marks.guider_line(trace, record, shown) if record else ""
    lines += _what_if_line(replay, what_if_threshold, shown)
    legend = (f'{lines}<div class="dl-legend" style="font-size:14px;color:#444;margin-top:4px;">'
              f"{where} · {committed}/{len(ids)} committed · {scale} · "
              f'<span style="{swatch}outline:2px solid #e4572e;"></span>committed this step · '
              f'<span style="{swatch}background:#e5e5e5;"></span>masked{ends_legend}{marks} · '
              f"small numbers: answer position</div>")
    return f'{head}<div class="dl-grid" style="line-height:1.2;">{"".join(boxes)}</div>{legend}'
