"""The page's teaching claims, each checked on the run it is shown beside: trace in, verdict out.

A verdict is "holds", "does not hold" or "not measurable in this run", with the numbers behind
it, so no sentence on the page states a figure its own run does not have. Pure functions of the
trace dict (``dllm_local.trace.Trace.to_dict()``), like ``replay``."""
from __future__ import annotations

import html
from statistics import fmean

from dllm_local.policies import registry

from ..block.parts import sequence_end
from ..canvas.lessons import ENCODER_LESSON, canvas_told
from .answer import answer_verdict
from .verdict import FAILS, HOLDS, STATUS, UNMEASURABLE, Verdict
from ..canvas.parts import is_canvas
from ..parts.replay import MEAN_LAYERS, Trace, drafts, is_end_token, per_position, prompt_len, steps_upto, theorem1

# Reused K/V count as close to exact when their mean cosine with the exact K/V is at least this.
CLOSE_TO_EXACT = 0.99
KINDS = ("prompt", "decoded", "masked")


# ----------------------------------------------------------------------------- Theorem 1

THEOREM1_N = "n counts every position the step committed, end of text included"
THEOREM1_CLAIM = "Theorem 1 guarantees every parallel step"


def theorem1_verdict(trace: Trace, step: int) -> Verdict:
    """Does Fast-dLLM's Theorem 1 guarantee the parallel steps of the run up to step ``step``, and that step?
    (``replay.theorem1``; n counts every committed position: the theorem speaks of the whole parallel commit.)
    Drafts self-verify sent back were never committed: said apart where a step's drafts had no guarantee together."""
    steps = steps_upto(trace, step)
    if not steps:
        return Verdict("theorem1", THEOREM1_CLAIM, UNMEASURABLE, "no step yet")
    told = [theorem1(record) for record in steps]
    parallel = [i for i, t in enumerate(told) if t["verdict"] != "serial"]
    unguaranteed = [i for i in parallel if told[i]["verdict"] == "no guarantee"]
    shown = len(steps) - 1
    # The step whose figures decide: the first without a guarantee, else the step shown.
    deciding = unguaranteed[0] if unguaranteed else shown
    at = told[deciding]
    ends = sum(is_end_token(trace, token) for _, token, _ in steps[deciding].get("committed") or [])
    sent_back = _sent_back_unguaranteed(steps)
    numbers = {"step": deciding, "n": at["n"], "end_of_text": ends, "epsilon": at["epsilon"], "bound": at["bound"],
               "parallel_steps": len(parallel), "unguaranteed_steps": unguaranteed, "drafts_without_guarantee": sent_back}
    drafted = _drafts_clause(sent_back)
    if not parallel:
        return Verdict("theorem1", THEOREM1_CLAIM, UNMEASURABLE,
                       f"no step so far committed more than one position (step {shown} committed {at['n']})"
                       + drafted, numbers)
    # A serial step (one commit) has no ε to show: the shown step may be one after guaranteed ones.
    figures = "" if at["verdict"] == "serial" else (f"step {deciding}: {at['verdict']}, n = {at['n']} ({ends} end of "
                                                    f"text), ε = {at['epsilon']:.2f}, (n+1)ε = {at['bound']:.2f} "
                                                    f"{'≤' if at['bound'] <= 1 else '>'} 1")
    if not unguaranteed:
        every = "the one parallel step" if len(parallel) == 1 else f"all {len(parallel)} parallel steps"
        return Verdict("theorem1", THEOREM1_CLAIM, HOLDS, f"{every} guaranteed" + (f"; {figures}" if figures else "")
                       + drafted + f" ({THEOREM1_N})", numbers)
    so_far = " so far" if len(steps) < len(trace.get("steps") or []) else ""  # not at the run's end yet
    count = ((f"the one parallel step{so_far}" if so_far else "the run's one parallel step") if len(parallel) == 1 else
             f"{len(unguaranteed)} of the {len(parallel)} parallel steps{so_far} without a guarantee"
             + (f" (steps {_list(unguaranteed)})" if len(unguaranteed) > 1 else ""))
    return Verdict("theorem1", THEOREM1_CLAIM, FAILS, f"{figures}; {count}{drafted} ({THEOREM1_N})", numbers)


def _sent_back_unguaranteed(steps: list[dict]) -> list[dict]:
    """The steps where self-verify sent drafts back and all the step drafted, taken together, had
    no guarantee: step, drafts, sent back, (n+1)ε of the drafts. What the verification spared the commits."""
    told = [(i, len(record["policy"]["rejected_at"]), theorem1({"committed": drafts(record)}))
            for i, record in enumerate(steps) if (record.get("policy") or {}).get("rejected_at")]
    return [{"step": i, "drafted": together["n"], "sent_back": sent, "bound": together["bound"]}
            for i, sent, together in told if together["verdict"] == "no guarantee"]


def _drafts_clause(sent_back: list[dict]) -> str:
    """"; step 3 drafted 4 positions, with no guarantee together ((n+1)ε = 3.10 > 1): self-verify
    sent 2 back" and the other such steps; empty when there is none."""
    if not sent_back:
        return ""
    first, more = sent_back[0], [s["step"] for s in sent_back[1:]]
    return (f"; step {first['step']} drafted {first['drafted']} positions, with no guarantee together "
            f"((n+1)ε = {first['bound']:.2f} > 1): self-verify sent {first['sent_back']} back"
            + (f" (so too at step{_s(more)} {_list(more)})" if more else ""))


# ----------------------------------------------------------------------------- reused K/V

def reused_kv_error(trace: Trace, step: int, layer: str, which: str) -> dict[str, list[float]] | None:
    """The cache-vs-exact cosine of every K (or V) entry step ``step`` reused instead of
    recomputing, by position kind: the prompt, answer positions decoded before the step, and
    answer positions still masked when it began. ``layer`` is a layer number as text or "mean"
    (the mean over layers, per position). None without an exact-drift record or recomputed positions."""
    return reused_kv_errors(trace, step, layer, which)[-1]


def reused_kv_errors(trace: Trace, upto_step: int | None, layer: str, which: str) -> list[dict[str, list[float]] | None]:
    """``reused_kv_error`` of every step up to ``upto_step``, in one pass over the trace."""
    P, decoded, errors = prompt_len(trace), set(), []
    for record in steps_upto(trace, upto_step):
        errors.append(_reused(record, P, decoded, layer, which, sequence_end(trace, record)))
        decoded |= {int(p) for p, _, _ in record.get("committed") or []}
        decoded -= {int(p) for p, _, _, _ in record.get("revoked") or []}
    return errors


def _reused(record: dict, P: int, decoded: set[int], layer: str, which: str,
            end: int | None) -> dict[str, list[float]] | None:
    per_layer = (record.get("exact") or {}).get("cache_vs_exact") or {}
    recomputed = record.get("recomputed")
    rows = [row for name in (per_layer if layer == MEAN_LAYERS else [str(layer)])
            if (row := per_position(per_layer.get(name), which)) is not None]
    if not rows or recomputed is None:
        return None
    skip = {int(p) for p in recomputed}
    by_kind: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for position, column in enumerate(zip(*rows)):
        values = [c for c in column if c is not None]
        if position in skip or not values or (end is not None and position >= end):  # past it: not in the sequence
            continue
        kind = "prompt" if position < P else "decoded" if position in decoded else "masked"
        by_kind[kind].append(fmean(values))
    return by_kind


KV_CLAIM = f"Reused K/V are close to exact (mean cosine ≥ {CLOSE_TO_EXACT} for each kind of position)"


def kv_reuse_verdict(trace: Trace, step: int, layer: str, which: str) -> Verdict:
    """Are the K/V the cache reused close to exact (mean cosine >= CLOSE_TO_EXACT for each kind
    of position reused)? At the shown step, and over the run so far, where the steps after a
    one-token step are also given apart: fewer changes per step should mean less drift."""
    steps = steps_upto(trace, step)
    name = f"layer {layer}" if layer != MEAN_LAYERS else "all layers (mean)"
    if not steps or not any((s.get("exact") or {}).get("cache_vs_exact") for s in steps):
        return Verdict("kv_reuse", KV_CLAIM, UNMEASURABLE, "it needs the exact-drift diagnostic and the full trace")
    per_step = reused_kv_errors(trace, step, layer, which)
    here, run = per_step[-1], _pool([s for s in per_step if s])
    after_one = _pool([s for i, s in enumerate(per_step)
                       if s and i > 0 and len(steps[i - 1].get("committed") or []) == 1])
    numbers = {"layer": layer, "which": which, "step": len(steps) - 1, "at_step": _summary(here or {}),
               "run": _summary(run), "after_one_token_steps": _summary(after_one)}
    if not any(run.values()):
        return Verdict("kv_reuse", KV_CLAIM, UNMEASURABLE,
                       "no step reused a cached entry: every forward recomputed everything", numbers)
    status = HOLDS if min(fmean(values) for values in run.values() if values) >= CLOSE_TO_EXACT else FAILS
    parts = [f"{which.upper()}, {name}, over the run: {_kinds(run)}"]
    if here and any(here.values()):
        parts.append(f"at step {len(steps) - 1}: {_kinds(here)}")
    elif here is not None:
        parts.append(f"step {len(steps) - 1} reused nothing")
    if any(after_one.values()) and after_one != run:
        parts.append(f"steps after a one-token step: {_kinds(after_one)}")
    return Verdict("kv_reuse", KV_CLAIM, status, "; ".join(parts), numbers)


def _pool(groups: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {kind: [c for group in groups for c in group[kind]] for kind in KINDS}


def _summary(by_kind: dict[str, list[float]]) -> dict[str, dict]:
    return {kind: {"count": len(v), "mean": fmean(v), "min": min(v)} for kind, v in by_kind.items() if v}


def _kinds(by_kind: dict[str, list[float]]) -> str:
    return ", ".join(f"{kind} mean {s['mean']:.3f} min {s['min']:.3f} ({s['count']})"
                     for kind, s in _summary(by_kind).items())


# ----------------------------------------------------------------------------- recomputation

CACHE_CLAIM = "The cache saves recomputation"


def cache_saves_verdict(trace: Trace, step: int | None = None) -> Verdict:
    """Does the cache save recomputation? The steps' main forwards' G against what they recompute
    without a cache: every position each attends, recomputed or read (a padded span's too), so the
    share is one minus the hit rate. Verifying forwards are named apart: the counts add up to NFE."""
    steps = steps_upto(trace, step)
    if not steps:
        return Verdict("cache_saves", CACHE_CLAIM, UNMEASURABLE, "no step yet")
    length, main = prompt_len(trace) + int(trace.get("gen_length") or 0), len(steps)
    verifying = max(0, sum(int(s.get("forwards") or 1) for s in steps) - main)
    with_cache, read = (sum(int(s.get(key) or 0) for s in steps) for key in ("g", "reads"))
    numbers = {"forwards": main, "verifying_forwards": verifying, "g_with_cache": with_cache,
               "g_without_cache": (without := with_cache + read), "mean_g": with_cache / main, "sequence": length}
    forwards = (f"the {_count(main, 'main forward')} (one per step)" if verifying else _count(main, "forward"))
    apart = (f"; the run's other {_count(verifying, 'forward')} ({main + verifying} in all) verified drafts and "
             f"{'is' if verifying == 1 else 'are'} not counted here") if verifying else ""
    if (trace.get("settings") or {}).get("cache") == "none":
        return Verdict("cache_saves", CACHE_CLAIM, UNMEASURABLE, f"no cache: {forwards} recomputed all {length} "
                       f"positions{' each' if main > 1 else ''}{apart}", numbers)
    return Verdict("cache_saves", CACHE_CLAIM, HOLDS if with_cache < without else FAILS,
                   f"{forwards} recomputed {with_cache:,} positions (mean G {with_cache / main:.1f} per "
                   f"{'main ' if verifying else ''}forward); without a cache the same forwards recompute {without:,} "
                   f"(every position each attends): {with_cache / without:.0%} of that{apart}", numbers)


# ----------------------------------------------------------------------------- verification

def verification_verdict(trace: Trace, step: int | None = None) -> Verdict | None:
    """How many drafts a verifying policy sent back (self-verify) or took back after committing
    them (revise), and at which steps. None for a run whose policy does neither."""
    steps = steps_upto(trace, step)
    rejected = [i for i, s in enumerate(steps) for _ in (s.get("policy") or {}).get("rejected_at") or []]
    revoked = [i for i, s in enumerate(steps) for _ in s.get("revoked") or []]
    # A verifying policy declares the step fields it reports them in (its spec's trace fields).
    spec = registry.UNMASK.get((trace.get("settings") or {}).get("unmask"))
    declared = spec.trace_fields if spec is not None else {}
    sends_back, takes_back = "rejected_at" in declared, "revoked" in declared
    if not (sends_back or takes_back or rejected or revoked):
        return None
    numbers = {"sent_back": len(rejected), "sent_back_steps": sorted(set(rejected)), "revised": len(revoked),
               "revised_steps": sorted(set(revoked))}
    parts = []
    if rejected or sends_back:
        parts.append(_count(len(rejected), "draft") + " sent back" + _at_steps(rejected))
    if revoked or takes_back:
        parts.append(_count(len(revoked), "committed token") + " revised" + _at_steps(revoked))
    return Verdict("verification", "Verification sent drafts back", HOLDS if rejected or revoked else FAILS, "; ".join(parts), numbers)


def _list(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _s(values: list) -> str:
    return "" if len(values) == 1 else "s"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _at_steps(steps: list[int]) -> str:
    distinct = sorted(set(steps))
    return f" at step{_s(distinct)} {_list(distinct)}" if distinct else ""


# ----------------------------------------------------------------------------- on the page

MARKS = {HOLDS: "✓", FAILS: "✗", UNMEASURABLE: "–"}


def verdicts_html(verdicts: list[Verdict | None]) -> str:
    """Verdict lines for beside a view: the status first, as a mark and in words, then the claim
    and its numbers."""
    lines = [f'<p class="dl-verdict" data-lesson="{v.lesson}" data-status="{v.status}">'
             f'<b>{MARKS[v.status]} {html.escape(v.claim)}: {v.status}</b> — {html.escape(v.detail)}</p>'
             for v in verdicts if v is not None]
    return f'<div class="dl-verdicts">{"".join(lines)}</div>' if lines else ""


def canvas_verdicts(trace: Trace, step: int) -> list[Verdict]:
    """A canvas model's claims (``ui.canvas.lessons``) as verdicts: its encoder's cache is shown
    beside the cache panel (``ENCODER_LESSON``), the rest beside the grid."""
    return [Verdict(t.lesson, t.claim, STATUS[t.holds], t.detail, t.numbers) for t in canvas_told(trace, step)]


def grid_verdicts(trace: Trace, step: int) -> list[Verdict | None]:
    """The claims about commits, beside the token grid; a canvas model's own (``ui.canvas.lessons``)."""
    if is_canvas(trace):
        return [*(v for v in canvas_verdicts(trace, step) if v.lesson != ENCODER_LESSON), answer_verdict(trace)]
    return [theorem1_verdict(trace, step), answer_verdict(trace), verification_verdict(trace, step)]
