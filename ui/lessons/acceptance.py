"""Flash-Verify's verdict beside the grid: how many drafts the released Flash-dLLM's verify forwards
accepted, over how many of them, and at which steps. Trace in, verdict out, like ``lessons``."""
from __future__ import annotations

from .verdicts import FAILS, HOLDS, UNMEASURABLE, Verdict
from ..parts.replay import Trace, steps_upto

ACCEPTANCE_CLAIM = "Verification accepted drafts"
LISTED = 4  # up to this many accepting steps are listed one by one; more are summarised


def acceptance_verdict(trace: Trace, step: int | None = None) -> Verdict | None:
    """Up to step ``step``: the drafts Flash-Verify's verify forwards accepted (``policy.verify_accepted``)
    of those they checked (``policy.verify_candidates``), and where. A verify forward runs at a step
    that had drafts left after its threshold commits. None for a run whose policy does not verify so."""
    steps = steps_upto(trace, step)
    if (trace.get("settings") or {}).get("unmask") != "flash_verify" and not any(
            "verify_accepted" in (s.get("policy") or {}) for s in steps):
        return None
    told = [(i, int(p.get("verify_accepted") or 0), int(p.get("verify_candidates") or 0))
            for i, p in ((i, s.get("policy") or {}) for i, s in enumerate(steps))]
    verified = [(i, a, c) for i, a, c in told if c > 0]
    accepting = [(i, a) for i, a, _ in verified if a > 0]
    total, checked = sum(a for _, a in accepting), sum(c for _, _, c in verified)
    numbers = {"accepted": total, "checked": checked, "verify_forwards": len(verified),
               "accepted_at_steps": {i: a for i, a in accepting}}
    if not verified:
        shown = f"up to step {len(steps) - 1}" if steps else "yet"
        return Verdict("acceptance", ACCEPTANCE_CLAIM, UNMEASURABLE,
                       f"no verify forward {shown}: the threshold left no drafts to check", numbers)
    forwards = f"{len(verified)} verify forward{'' if len(verified) == 1 else 's'}"
    head = f"{total} draft{'' if total == 1 else 's'} accepted over {forwards} ({checked} checked)"
    if not accepting:
        return Verdict("acceptance", ACCEPTANCE_CLAIM, FAILS, head + ": every first draft fell under gamma", numbers)
    if len(accepting) <= LISTED:
        where = ", ".join(f"{a} at step {i}" for i, a in accepting)
        return Verdict("acceptance", ACCEPTANCE_CLAIM, HOLDS, f"{head}: {where}", numbers)
    most = sorted(accepting, key=lambda ia: (-ia[1], ia[0]))[:3]
    where = ", ".join(f"{i} ({a})" for i, a in most)
    return Verdict("acceptance", ACCEPTANCE_CLAIM, HOLDS,
                   f"{head}, at {len(accepting)} steps; most at steps {where}", numbers)
