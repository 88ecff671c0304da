"""The side panel for one answer position at one step, readable from the back row: its token and
since when, its top candidates, its commit and revision history, its cache state and the guider's
and the verifier's verdicts, all that the grid's hover titles tell, in text sized in ``em``.
A pure function of the trace dict (``dllm_local.trace.Trace.to_dict()``): trace in, HTML out."""
from __future__ import annotations

import html
from statistics import fmean

from ..grid import policy_marks
from ..block.parts import EXACT_WORDS, exact_since, sequence_end
from ..canvas.parts import is_canvas
from ..canvas.views import canvas_position_panel_html
from ..grid.tokens import token_label
from ..parts.replay import Trace, answer_length, first_end, is_end_token, prompt_len, state_at

NO_STEPS = "No step recorded yet: run or import a trace, then pick a position in the grid."
_LINE = '<div class="dl-pp-line" style="margin:0.15em 0;">{}</div>'
_HEAD = '<div class="dl-pp-head" style="font-size:1.15em;font-weight:700;margin:0.7em 0 0.2em;">{}</div>'
_CHIP = ('<span class="dl-pp-token" style="font-family:ui-monospace,monospace;font-size:1.3em;padding:0 0.3em;'
         'border:0.08em solid currentColor;border-radius:0.25em;white-space:pre;">{}</span>')
_BAR = '<span class="dl-pp-bar" style="display:inline-block;height:0.7em;width:{:.2f}em;background:#4292c6;"></span>'


def _message(text: str) -> str:
    return f'<div class="dl-position-panel dl-pp-message" style="font-size:1.1rem;">{html.escape(text)}</div>'


def _names(trace: Trace, tokens: set[int]) -> dict[int, str]:
    """Each token's grid label; where two different tokens read the same, their ids tell them apart."""
    labels = {t: token_label(trace, t) for t in tokens}
    clashing = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    return {t: f"{label} #{t}" if label in clashing else label for t, label in labels.items()}


def _events(trace: Trace, shown: int, position: int) -> list[dict]:
    """What happened at the position up to step ``shown``, in order: commits (with what they
    replaced), take-backs, in-place edits, drafts sent back, the verify forward's and the guider's acceptance."""
    where, events, taken_back = prompt_len(trace) + position, [], None
    for index, record in enumerate((trace.get("steps") or [])[: shown + 1]):
        policy = record.get("policy") or {}
        for p, token, score in policy.get("rejected_at") or []:
            if int(p) == where:
                events.append({"kind": "sent back", "step": index, "token": int(token), "score": float(score)})
        for p, token, conf in record.get("committed") or []:
            if int(p) == where:
                event = {"kind": "commit", "step": index, "token": int(token), "confidence": float(conf),
                         "replaces": taken_back}
                accepted = policy_marks.accepted(trace, record).get(position)
                if accepted is not None:
                    event["verify"] = accepted
                if "guider_accepted" in policy:
                    event["guider"] = int(policy["guider_accepted"])
                events.append(event)
        for p, token, then, now in record.get("revoked") or []:
            if int(p) == where:
                events.append({"kind": "taken back", "step": index, "token": int(token), "then": float(then),
                               "now": float(now)})
                taken_back = int(token)
        for p, token, probability, old in record.get("edited") or []:
            if int(p) == where:
                events.append({"kind": "edited", "step": index, "token": int(token), "old": int(old),
                               "probability": float(probability)})
    return events


def _event_text(event: dict, names: dict[int, str]) -> str:
    name = f"'{names[event['token']]}'"
    if event["kind"] == "sent back":
        return (f"step {event['step']}: self-verify sent draft {name} back to mask "
                f"(conflict score {event['score']:.3f})")
    if event["kind"] == "edited":
        return (f"step {event['step']}: edited in place, '{names[event['old']]}' -> {name} "
                f"(probability {event['probability']:.2f})")
    if event["kind"] == "taken back":
        return (f"step {event['step']}: {name} taken back to mask (confidence at commit {event['then']:.2f}, "
                f"probability then {event['now']:.2f})")
    text = f"step {event['step']}: committed {name} with confidence {event['confidence']:.2f}"
    if event["replaces"] is not None:
        before = f"'{names[event['replaces']]}'"
        text += (f", revised from {before} to {name}" if event["replaces"] != event["token"]
                 else f", {before} committed again")
    if "verify" in event:
        text += f"; accepted by the verify forward (P(draft | masked) {event['verify']:.2f})"
    if "guider" in event:
        text += ("; accepted by the guider" if event["guider"] else
                 "; the guider rejected it, committed anyway (at least one token per step)")
    return text


def candidates_at(trace: Trace, shown: int, position: int, commit_step: int | None) -> list[tuple[str, list]]:
    """(heading, [[token, probability], ...]) for this step's forward and, for a token committed
    earlier, the forward that committed it; a bare confidence where the trace keeps no top-k."""
    steps, where, found = trace.get("steps") or [], prompt_len(trace) + position, []
    for label, at in ((f"Top candidates at step {shown}", shown),
                      (f"Top candidates when committed (step {commit_step})", commit_step)):
        if at is None or at < 0 or (found and at == shown):
            continue
        pairs = next((pairs for p, pairs in steps[at].get("top_candidates") or [] if int(p) == where), None)
        if pairs is not None:
            found.append((label, pairs))
        elif at == shown:
            scored = dict(zip(steps[at].get("masked_positions") or [], steps[at].get("masked_confidence") or []))
            if scored.get(where) is not None:
                found.append((f"Step {shown}'s confidence {scored[where]:.2f} (top-k is recorded for the current "
                              "block only)", []))
    return found


def _mean_cosines(by_layer: dict, index: int) -> dict[str, tuple[float | None, int]]:
    """Per K and V: the mean over layers of the cosine at ``index`` (None when no layer holds one)."""
    found = {}
    for which in ("k", "v"):
        values = []
        for data in by_layer.values():
            column = (data or {}).get(which)
            if isinstance(column, list) and index < len(column) and column[index] is not None:
                values.append(float(column[index]))
        found[which] = (fmean(values) if values else None, len(values))
    return found


def _cosine_text(cosines: dict[str, tuple[float | None, int]]) -> str | None:
    told = [f"{which.upper()} {mean:.3f}" for which, (mean, _) in cosines.items() if mean is not None]
    layers = max(count for _, count in cosines.values())
    return f"{', '.join(told)} (mean over {layers} layer{'' if layers == 1 else 's'})" if told else None


def _cache_lines(trace: Trace, shown: int, position: int) -> list[str]:
    steps = trace.get("steps") or []
    if shown < 0:
        return ["before any step: nothing cached yet"]
    record, where = steps[shown], prompt_len(trace) + position
    if (trace.get("settings") or {}).get("cache") == "none":
        return [f"no cache: step {shown} recomputed every position, this one too"]
    recomputed = record.get("recomputed")
    if recomputed is None:
        return ["which positions were recomputed is not recorded (it needs trace level 'full')"]
    recomputed = [int(p) for p in recomputed]
    lines = []
    if where in recomputed:
        why = " (a full refresh of the cache)" if record.get("full_refresh") else ""
        tracked = [int(p) for p in (record.get("policy") or {}).get("tracked") or []]
        if where in tracked:
            why += " as a tracked decoded position"
        lines.append(f"recomputed at step {shown}{why}")
        drift = _cosine_text(_mean_cosines(record.get("kv") or {}, recomputed.index(where)))
        if drift:
            lines.append(f"KV drift, cosine with what the cache held: {drift}")
        elif record.get("kv"):
            lines.append("KV drift: the cache held nothing here before this step")
    elif where >= (sequence_end(trace, record) or where + 1):
        lines.append(f"not in step {shown}'s sequence yet: a later block, which no earlier block reads "
                     "(block-causal attention)")
    elif (stored := exact_since(trace, shown).get(where)) is not None:
        lines.append(f"read from the block cache at step {shown}, stored before step {stored}: {EXACT_WORDS}")
    else:
        last = next((i for i in range(shown - 1, -1, -1) if where in (steps[i].get("recomputed") or [])), None)
        since = f" (its K/V last recomputed at step {last})" if last is not None else ""
        lines.append(f"reused from the cache at step {shown}{since}")
    exact = record.get("exact") or {}
    for key, words in (("cache_vs_exact", "cached against exact"), ("true_drift", "exact against the step before")):
        told = _cosine_text(_mean_cosines(exact.get(key) or {}, where))
        if told:
            lines.append(f"{words}: {told}")
    return lines


def _verdict_lines(trace: Trace, shown: int, position: int, ids: list, commit_step: list) -> list[str]:
    """The guider's and the verifier's word on the position at the step shown, the window's, and
    where the answer ends."""
    if shown < 0:
        return []
    record, lines = (trace.get("steps") or [])[shown], []
    policy, where = record.get("policy") or {}, prompt_len(trace) + position
    committed_here = commit_step[position] == shown and ids[position] is not None
    if "guider_accepted" in policy:
        agreed = int(policy["guider_accepted"])
        if committed_here:
            lines.append(f"guider, step {shown}: " + (f"accepted (it agreed with the first {agreed} drafted token(s))"
                                                      if agreed else "rejected the draft; committed anyway"))
        elif ids[position] is None and where in (record.get("masked_positions") or []):
            lines.append(f"guider, step {shown}: this draft lies past the {agreed} token(s) it agreed with; "
                         "still masked")
    if "verified" in policy:
        sent = [p for p, _, _ in policy.get("rejected_at") or [] if int(p) == where]
        least = policy.get("min_conflict_score")
        checked = (f"checked {policy['verified']} close candidate(s), sent {policy.get('rejected', 0)} back"
                   + (f", least conflict score {float(least):.3f}" if least is not None else ""))
        if sent:
            lines.append(f"self-verify, step {shown}: sent this draft back to mask ({checked})")
        elif committed_here:
            lines.append(f"self-verify, step {shown}: kept this commit ({checked})")
    if "verify_candidates" in policy and committed_here:
        accepted = policy_marks.accepted(trace, record).get(position)
        lines.append(f"verify forward, step {shown}: " + (
            f"accepted this draft (P(draft | masked) {accepted:.2f})" if accepted is not None
            else "not this draft's judge: the confidence threshold committed it"))
    window = policy_marks.window(trace, record)
    if window is not None:
        lines.append(f"sliding window, step {shown}: " + ("scored this position" if position in window
                                                           else "did not reach this position"))
        tail = policy_marks.masked_tail(trace, record, ids)
        if tail and tail[0] <= position < tail[1]:
            lines.append("still masked after the first end of text: the released Flash-dLLM ends the answer at the "
                         "end of text it commits and decodes nothing after it")
    end = first_end(trace, ids)
    if is_end_token(trace, ids[position]):
        lines.append("end of text" + (" (the answer ends here)" if end == position else ""))
    elif ids[position] is not None and end is not None and position > end:
        lines.append(f"committed after the end of text at position {end}: not part of the answer")
    return lines


def position_panel_html(trace: Trace, step: int, position: int) -> str:
    """The panel for answer position ``position`` after step ``step`` (clamped to the run; -1:
    before any step). A position out of range, or a trace without steps, gives a short message."""
    steps, length = trace.get("steps") or [], answer_length(trace)
    if not steps:
        return _message(NO_STEPS)
    if type(position) is not int or not 0 <= position < length:
        return _message(f"No answer position {position}: this answer has positions 0–{length - 1}.")
    try:
        step = int(step)
    except (TypeError, ValueError):
        step = len(steps) - 1
    if is_canvas(trace):  # a canvas model redraws its canvas each step: the panel tells its drafts
        return canvas_position_panel_html(trace, step, position)
    state = state_at(trace, step)
    shown, token, at, conf = state["step"], *(state[k][position] for k in ("ids", "commit_step", "confidence"))
    events = _events(trace, shown, position)
    candidates = candidates_at(trace, shown, position, at)
    tokens = {e["token"] for e in events} | {e[k] for e in events for k in ("replaces", "old") if e.get(k) is not None}
    tokens |= {int(t) for _, pairs in candidates for t, _ in pairs} | ({token} if token is not None else set())
    names = _names(trace, tokens)
    when = "before any step" if shown < 0 else f"after step {shown}"
    head = f"Position {position} · {when}"
    if token is not None:
        how = ("written by an edit" if any(step == at for _, _, step, _ in state["edits"][position])
               else "committed")
        now = f"{_CHIP.format(html.escape(names[token]))} since step {at}, " + (
            f"{how} with confidence {conf:.2f}" if conf is not None else "forced there by the branch")
    else:
        back = [e for e in events if e["kind"] in ("taken back", "sent back")]
        now = _CHIP.format("▢") + (f" masked again since step {back[-1]['step']} ({back[-1]['kind']})"
                                   if back else " masked since the start")
    parts = [f'<div class="dl-pp-title" style="font-size:1.3em;font-weight:700;">{html.escape(head)}</div>',
             f'<div class="dl-pp-now" style="margin:0.3em 0;">{now}</div>']
    for label, pairs in candidates:
        parts.append(_HEAD.format(html.escape(label)))
        parts += [_LINE.format(f"{_CHIP.format(html.escape(names[int(t)]))} {_BAR.format(8 * float(q))} "
                               f"{float(q):.2f}") for t, q in pairs]
    parts.append(_HEAD.format("History"))
    parts += [_LINE.format(html.escape(_event_text(e, names))) for e in events] or [_LINE.format("nothing yet")]
    parts.append(_HEAD.format("Cache"))
    parts += [_LINE.format(html.escape(line)) for line in _cache_lines(trace, shown, position)]
    verdicts = _verdict_lines(trace, shown, position, state["ids"], state["commit_step"])
    if verdicts:
        parts.append(_HEAD.format("Verdicts"))
        parts += [_LINE.format(html.escape(line)) for line in verdicts]
    return (f'<div class="dl-position-panel" data-position="{position}" data-step="{shown}" '
            f'style="font-size:1.1rem;line-height:1.45;">{"".join(parts)}</div>')
