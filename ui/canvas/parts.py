"""A canvas model's trace (DiffusionGemma) as its views read it: which steps refined which canvas,
each answer position's draft at a step, the knobs of its stopping rule, the tokens it settled.

A canvas model commits nothing: each step redraws a whole canvas (``step["canvas"]``, see
``dllm_local/canvas/trace.py``) and a canvas's last draft joins the answer. Pure functions of the
trace dict; positions here are answer positions (absolute position - len(prompt_ids)), as in ``replay``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..parts.kinds import model_kind
from ..parts.trace_parts import Trace, answer_length, is_end_token, mapping, prompt_len, read_number, setting, steps_upto



def is_canvas_model(model: dict) -> bool:
    """Whether ``model`` (the engine's info on the loaded model, or a trace's ``model``) is a
    canvas model; one without a kind (an older trace) is a masked model."""
    return model_kind(model).canvas_steps


def is_canvas(trace: Trace) -> bool:
    """Whether ``trace`` is drawn as a canvas run: a canvas model's, each step with its canvas record
    (a step without one, which the schema allows, is drawn as a masked model's step, the whole trace so)."""
    return is_canvas_model(trace.get("model") or {}) and all(s.get("canvas") for s in trace.get("steps") or [])


def canvas_length(trace: Trace) -> int:
    """Tokens per canvas of this run: a step's draft's; before any step, the run's setting
    (``canvas_params``), else the model's own."""
    first = next((s["canvas"] for s in trace.get("steps") or [] if s.get("canvas")), None)
    if first:
        return len(first["draft"])
    length = setting(trace, "canvas_length", int, "canvas_params") or read_number(
        (trace.get("model") or {}).get("canvas_length"), int)
    return length if length and length > 0 else max(1, answer_length(trace))


def canvas_count(trace: Trace) -> int:
    return max(1, answer_length(trace) // canvas_length(trace))


def canvas_steps(trace: Trace, upto_step: int | None = None) -> dict[int, list[int]]:
    """Canvas index -> the indices of the steps that refined it, in order, up to ``upto_step``."""
    found: dict[int, list[int]] = {}
    for index, record in enumerate(steps_upto(trace, upto_step)):
        found.setdefault(int(record["canvas"]["canvas"]), []).append(index)
    return found


def run_complete(trace: Trace) -> bool:
    """Whether the trace holds the whole run (its final ids are there): no step will follow."""
    return bool(trace.get("final_ids"))


@dataclass(frozen=True)
class CanvasRules:
    """The stopping rule's knobs as the trace tells them; None where it does not."""
    max_steps: int | None
    confidence_threshold: float | None
    stability_threshold: int | None


def canvas_rules(trace: Trace) -> CanvasRules:
    """The knobs the run set (its settings' ``canvas_params``), else the checkpoint's (the model's
    ``canvas_defaults``). A trace older than those leaves the thresholds unsaid, and the most steps
    a canvas may take is then the length of a canvas that ran out of steps (it did not finish early
    and the run went on past it, or ended whole)."""
    params = {**mapping((trace.get("model") or {}).get("canvas_defaults")),
              **mapping(mapping(trace.get("settings")).get("canvas_params"))}
    most = read_number(params.get("max_denoising_steps"), int)
    if most is None:
        steps, by_canvas = trace.get("steps") or [], canvas_steps(trace)
        last = max(by_canvas, default=None)
        ran_out = [len(rows) for canvas, rows in by_canvas.items()
                   if not steps[rows[-1]]["canvas"]["finished"]
                   and (canvas != last or (run_complete(trace) and not (trace.get("stats") or {}).get("stopped")))]
        most = max(ran_out, default=None)
    return CanvasRules(most, read_number(params.get("confidence_threshold"), float),
                       read_number(params.get("stability_threshold"), int))


def stable_for(steps: list[dict], rows: list[int]) -> int:
    """How many steps in a row, up to the last of ``rows``, left the draft as it was."""
    count = 0
    for index in reversed(rows):
        if steps[index]["canvas"]["changed"]:
            break
        count += 1
    return count


@dataclass
class CanvasState:
    """The answer region after one step of a canvas run. Per answer position: the draft token
    (None where its canvas has not started), the step since which it stands, its entropy at the
    last step of its canvas up to here, and its canvas; the canvas refined at the step shown
    (``current``) with this step's accepted (answer position -> sampled token), renoised and
    changed positions."""
    step: int
    ids: list[int | None]
    since: list[int | None]
    entropy: list[float | None]
    canvas_of: list[int]
    current: int | None = None
    accepted: dict[int, int] = field(default_factory=dict)
    renoised: set[int] = field(default_factory=set)
    changed: set[int] = field(default_factory=set)


def canvas_state_at(trace: Trace, step: int) -> CanvasState:
    """The drafts after step ``step`` (clamped to the run; -1: before any step): each canvas shows
    the draft of its latest step up to ``step``; a later canvas has none yet."""
    steps, P, n, L = trace.get("steps") or [], prompt_len(trace), answer_length(trace), canvas_length(trace)
    step = max(-1, min(int(step), len(steps) - 1))
    state = CanvasState(step, [None] * n, [None] * n, [None] * n, [p // L for p in range(n)])
    for index, record in enumerate(steps[: step + 1]):
        canvas = record["canvas"]
        first = int(canvas["start"]) - P
        moved = {int(q) - P for q in canvas["changed"]}
        for offset, (token, entropy) in enumerate(zip(canvas["draft"], canvas["entropy"])):
            p = first + offset
            if 0 <= p < n:
                if state.ids[p] is None or p in moved:
                    state.since[p] = index
                state.ids[p], state.entropy[p] = int(token), float(entropy)
    if step >= 0:
        canvas = steps[step]["canvas"]
        first = int(canvas["start"]) - P
        state.current = int(canvas["canvas"])
        state.accepted = {int(q) - P: int(t) for q, t in zip(canvas["accepted"], canvas["sampled"])}
        state.renoised = set(range(first, min(n, first + len(canvas["draft"])))) - set(state.accepted)
        state.changed = {int(q) - P for q in canvas["changed"]}
    return state


def canvas_ended(trace: Trace, row: int) -> bool:
    """Whether the canvas refined at step ``row`` ended there: the stopping rule finished it, it
    ran out of steps, or the run's next step is another canvas's (or there is none, the run over)."""
    steps = trace.get("steps") or []
    record = steps[row]
    most = canvas_rules(trace).max_steps
    if record["canvas"]["finished"] or (most is not None and int(record["step_in_block"]) + 1 >= most):
        return True
    if row + 1 < len(steps):
        return steps[row + 1]["canvas"]["canvas"] != record["canvas"]["canvas"]
    return run_complete(trace)


def settled_tokens(trace: Trace, upto_step: int | None = None) -> list[int]:
    """The answer tokens of the canvases ended by ``upto_step`` (their last drafts), up to and
    including the first end of text: what the run has produced so far (pads after it not counted)."""
    steps, settled = trace.get("steps") or [], []
    by_canvas = canvas_steps(trace, upto_step)
    for canvas in sorted(by_canvas):
        if not canvas_ended(trace, by_canvas[canvas][-1]):
            break
        for token in steps[by_canvas[canvas][-1]]["canvas"]["draft"]:
            settled.append(int(token))
            if is_end_token(trace, token):
                return settled
    return settled


def draft_history(trace: Trace, step: int, position: int) -> list[dict]:
    """Answer position ``position``'s draft at every step of its canvas up to ``step``: step, the
    canvas's own step number (from 1), token, whether it changed, the token the sampler kept
    (None: renoised) and its entropy."""
    P, history = prompt_len(trace), []
    where = P + position
    for index, record in enumerate(steps_upto(trace, step)):
        canvas = record["canvas"]
        offset = where - int(canvas["start"])
        if not 0 <= offset < len(canvas["draft"]):
            continue
        kept = dict(zip((int(q) for q in canvas["accepted"]), canvas["sampled"]))
        history.append({"step": index, "in_canvas": int(record["step_in_block"]) + 1,
                        "token": int(canvas["draft"][offset]), "changed": where in canvas["changed"],
                        "kept": None if where not in kept else int(kept[where]),
                        "entropy": float(canvas["entropy"][offset])})
    return history
