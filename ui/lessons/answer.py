"""The answer's claim, beside the token grid: a finished run's answer graded on its tiny task, by
one rule for every model (``answer_verdict``). Trace in, verdict out, like ``verdicts``."""
from __future__ import annotations

from dllm_local.tiny.tasks import recognise, verdict as task_verdict

from ..canvas.parts import is_canvas
from ..parts.replay import Trace, is_end_token, prompt_len, prompt_of
from .verdict import FAILS, HOLDS, UNMEASURABLE, Verdict


def answer_verdict(trace: Trace) -> Verdict:
    """Is a finished run's answer right (or valid) for its tiny task, and how many content tokens
    did its most parallel step commit at once? A wrong answer after parallel commits is the
    conflict parallel decoding risks. One rule for every model: a model of ours is graded on the
    tasks its config says it was trained on, a random checkpoint never; a model we did not make
    (a real checkpoint, whose config names no tasks) on any prompt of the suite."""
    problem = recognise(prompt_of(trace) or "")
    judged = task_verdict(problem.prompt, trace.get("text") or "") if problem else None
    claim = "The answer is " + ("valid" if judged in ("valid", "invalid") else "right")
    model = trace.get("model") or {}
    trained, name = model.get("trained_tasks"), model.get("name") or "this model"
    if trained is not None and not trained:
        return Verdict("answer", claim, UNMEASURABLE, f"{name} is a random checkpoint, trained on no task: it shows "
                       "the mechanics of decoding, and its answers are not graded")
    if not trace.get("final_ids"):
        return Verdict("answer", claim, UNMEASURABLE, "the run has not ended")
    if (trace.get("stats") or {}).get("stopped"):
        return Verdict("answer", claim, UNMEASURABLE, "the run was stopped before its end: its answer is not graded")
    if problem is None or (trained is not None and problem.task not in trained):
        tasks = f"the tasks {name} was trained on ({', '.join(trained)})" if trained else "the tiny tasks"
        return Verdict("answer", claim, UNMEASURABLE, f"the prompt is none of {tasks}")
    if is_canvas(trace):  # no commits: each step redraws the canvas's every position
        return Verdict("answer", claim, HOLDS if judged in ("right", "valid") else FAILS, judged, {"verdict": judged})
    ids, P = trace["final_ids"], prompt_len(trace)
    end = next((p for p, t in enumerate(ids) if is_end_token(trace, t)), len(ids))
    content = [sum(0 <= int(p) - P < end for p, _, _ in s.get("committed") or []) for s in trace.get("steps") or []]
    most = max(content, default=0)
    at = content.index(most) if content else None
    together = f"{most} content tokens committed together at step {at}" if most > 1 else "one content token per step"
    return Verdict("answer", claim, HOLDS if judged in ("right", "valid") else FAILS, f"{judged}; {together}",
                   {"verdict": judged, "most_content_in_one_step": most, "at_step": at})
