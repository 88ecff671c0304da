"""LLaDA 2.1's editing, told beside the token grid: how many committed tokens the run rewrote in
place, at which steps, and how many of them the answer keeps. Trace in, verdict out, like
``lessons``; None for a run whose policy does not edit."""
from __future__ import annotations

from ..lessons.verdicts import FAILS, HOLDS, Verdict
from ..parts.replay import Trace, state_at, steps_upto
from ..parts.trace_parts import setting

CLAIM = "Editing rewrote committed tokens"


def edit_verdict(trace: Trace, step: int | None = None) -> Verdict | None:
    """The edits up to ``step``: their count, steps and positions, and how many of the edited
    positions still hold the edit's token (a later edit may rewrite a position again)."""
    if (trace.get("settings") or {}).get("unmask") != "edit":
        return None
    steps = steps_upto(trace, step)
    state = state_at(trace, len(steps) - 1)
    edits = [(index, *edit) for index, record in enumerate(steps) for edit in record.get("edited") or []]
    at = sorted({index for index, *_ in edits})
    positions = sorted({p for p, edited in enumerate(state["edits"]) if edited})
    numbers = {"edits": len(edits), "edit_steps": at, "edited_positions": positions}
    if not edits:
        threshold = setting(trace, "edit_threshold", float, "unmask_params")
        where = f" above the edit threshold {threshold}" if threshold is not None else ""
        return Verdict("edit", CLAIM, FAILS, f"no committed token's draft changed{where} so far", numbers)
    told = ", ".join(str(s) for s in at[:12]) + (" ..." if len(at) > 12 else "")
    noun = "edit" if len(edits) == 1 else "edits"
    return Verdict("edit", CLAIM, HOLDS, f"{len(edits)} {noun} at {len(positions)} answer position(s), at step(s) {told}; "
                   "each rewrote a token committed on an earlier step of its block", numbers)
