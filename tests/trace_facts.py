"""The figures a verdict line states, worked out again from an exported trace file with code of
their own (not ``ui.lessons.verdicts``), as the lines they must appear in."""
from __future__ import annotations

from statistics import fmean

from dllm_local.tiny.tasks import recognise, verdict


def _bound(confidences: list[float]) -> tuple[int, float | None]:
    return len(confidences), 1 - min(confidences) if confidences else None


def theorem1_lines(trace: dict) -> list[str]:
    """Told for the commits each step kept; a step whose drafts (sent-back ones included) had no
    guarantee together is named apart."""
    steps = trace["steps"]
    stops = set(trace["model"].get("stop_ids") or [])
    bounds = [_bound([c for _, _, c in record["committed"]]) for record in steps]
    parallel = [i for i, (n, _) in enumerate(bounds) if n > 1]
    drafted = []
    for i, record in enumerate(steps):
        sent_back = record["policy"].get("rejected_at", [])
        scored = dict(zip(record["masked_positions"], record["masked_confidence"]))
        n, epsilon = _bound([c for _, _, c in record["committed"]] + [scored[p] for p, _, _ in sent_back])
        if sent_back and (n + 1) * epsilon > 1:
            drafted.append(f"step {i} drafted {n} positions, with no guarantee together ((n+1)ε = {(n + 1) * epsilon:.2f} "
                           f"> 1): self-verify sent {len(sent_back)} back")
    if not parallel:
        return ["Theorem 1 guarantees every parallel step: not measurable in this run", *drafted[:1]]
    failing = [i for i in parallel if (bounds[i][0] + 1) * bounds[i][1] > 1]
    status = "does not hold" if failing else "holds"
    lines = [f"Theorem 1 guarantees every parallel step: {status}", *drafted[:1]]
    if failing:
        lines.append("the run's one parallel step" if len(parallel) == 1 else
                     f"{len(failing)} of the {len(parallel)} parallel steps without a guarantee")
    deciding = failing[0] if failing else len(steps) - 1
    n, epsilon = bounds[deciding]
    if n > 1:
        ends = sum(t in stops for _, t, _ in steps[deciding]["committed"])
        lines.append(f"step {deciding}: {'no guarantee' if failing else 'guaranteed'}, n = {n} ({ends} end of text), "
                     f"ε = {epsilon:.2f}, (n+1)ε = {(n + 1) * epsilon:.2f}")
    return lines


def cache_lines(trace: dict) -> list[str]:
    """The steps' main forwards (one each), and the verifying forwards beyond them named apart."""
    main = len(trace["steps"])
    verifying = sum(s["forwards"] for s in trace["steps"]) - main
    length = len(trace["prompt_ids"]) + trace["gen_length"]
    plural = "" if main == 1 else "s"
    counted = f"the {main} main forward{plural} (one per step)" if verifying else f"{main} forward{plural}"
    apart = [f"the run's other {verifying} forward"] if verifying else []
    if trace["settings"]["cache"] == "none":
        return ["The cache saves recomputation: not measurable in this run",
                f"{counted} recomputed all {length} positions", *apart]
    g = sum(s["g"] for s in trace["steps"])
    attended = g + sum(s["reads"] for s in trace["steps"])  # every position each forward attends
    per = "main forward" if verifying else "forward"
    return [f"The cache saves recomputation: {'holds' if g < attended else 'does not hold'}",
            f"{counted} recomputed {g:,} positions (mean G {g / main:.1f} per {per})",
            f"recompute {attended:,} (every position each attends)", *apart]


def kv_lines(trace: dict, layer: str, which: str) -> list[str]:
    if not any(s.get("exact") for s in trace["steps"]):
        return ["Reused K/V are close to exact", "not measurable in this run"]
    P, decoded = len(trace["prompt_ids"]), set()
    pooled: dict[str, list[float]] = {"prompt": [], "decoded": [], "masked": []}
    for record in trace["steps"]:
        table = record["exact"]["cache_vs_exact"]
        rows = [table[name][which] for name in (table if layer == "mean" else [layer])]
        for position in range(len(rows[0])):
            if position in record["recomputed"]:
                continue
            kind = "prompt" if position < P else "decoded" if position in decoded else "masked"
            pooled[kind].append(fmean(row[position] for row in rows))
        decoded |= {p for p, _, _ in record["committed"]}
        decoded -= {p for p, _, _, _ in record["revoked"]}
    kinds = {kind: values for kind, values in pooled.items() if values}
    if not kinds:
        return ["Reused K/V are close to exact", "not measurable in this run"]
    status = "holds" if min(fmean(v) for v in kinds.values()) >= 0.99 else "does not hold"
    return [f"Reused K/V are close to exact (mean cosine ≥ 0.99 for each kind of position): {status}",
            "over the run: " + ", ".join(f"{kind} mean {fmean(v):.3f} min {min(v):.3f} ({len(v)})"
                                         for kind, v in kinds.items())]


def answer_lines(trace: dict, prompt: str) -> list[str]:
    judged, problem = verdict(prompt, trace["text"]), recognise(prompt)
    trained, name = trace["model"].get("trained_tasks"), trace["model"]["name"]
    if trained == []:
        return [f"not measurable in this run — {name} is a random checkpoint, trained on no task"]
    if judged is None or (trained is not None and problem.task not in trained):
        tasks = f"the tasks {name} was trained on" if trained else "the tiny tasks"
        return [f"not measurable in this run — the prompt is none of {tasks}"]
    stops, P, ids = set(trace["model"].get("stop_ids") or []), len(trace["prompt_ids"]), trace["final_ids"]
    end = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    content = [sum(P <= p < P + end for p, _, _ in s["committed"]) for s in trace["steps"]]
    most = max(content)
    claim = "valid" if judged in ("valid", "invalid") else "right"
    status = "holds" if judged in ("valid", "right") else "does not hold"
    together = f"{most} content tokens committed together at step {content.index(most)}" if most > 1 else \
        "one content token per step"
    return [f"The answer is {claim}: {status} — {judged}; {together}"]


def verification_lines(trace: dict) -> list[str]:
    rejected = [i for i, s in enumerate(trace["steps"]) for _ in s["policy"].get("rejected_at", [])]
    revoked = [i for i, s in enumerate(trace["steps"]) for _ in s["revoked"]]
    unmask = trace["settings"]["unmask"]
    if unmask not in ("self_verify", "revise") and not rejected and not revoked:
        return []
    lines = [f"Verification sent drafts back: {'holds' if rejected or revoked else 'does not hold'}"]
    for noun, verb, found in (("draft", "sent back", rejected), ("committed token", "revised", revoked)):
        if found:
            distinct = sorted(set(found))
            lines.append(f"{len(found)} {noun}{'s' if len(found) > 1 else ''} {verb} at step"
                         f"{'s' if len(distinct) > 1 else ''} {', '.join(map(str, distinct))}")
    return lines


def acceptance_lines(trace: dict) -> list[str]:
    """Flash-Verify's line: the drafts its verify forwards accepted, counted from the steps' accepted
    drafts and their forwards (a step with a verify forward ran two)."""
    if trace["settings"]["unmask"] != "flash_verify":
        return []
    accepted = [(i, len(s["policy"]["accepted_at"])) for i, s in enumerate(trace["steps"]) if s["policy"]["accepted_at"]]
    verify_forwards = sum(s["forwards"] - 1 for s in trace["steps"])
    total = sum(n for _, n in accepted)
    status = "holds" if total else "does not hold" if verify_forwards else "not measurable in this run"
    lines = [f"Verification accepted drafts: {status}"]
    if verify_forwards:
        lines.append(f"{total} draft{'' if total == 1 else 's'} accepted over {verify_forwards} verify "
                     f"forward{'' if verify_forwards == 1 else 's'}")
    if 0 < len(accepted) <= 4:
        lines.append(", ".join(f"{n} at step {i}" for i, n in accepted))
    return lines
