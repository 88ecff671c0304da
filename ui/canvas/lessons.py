"""A canvas model's claims, checked on its own trace (DiffusionGemma): how each canvas ended (the
stopping rule ends it early once its draft is stable and it is confident), that the encoder's cache
is exact, and how many of the experts each step routed to.

Each claim comes as ``Told`` (lesson, claim, holds: True / False / None for not measurable, the line
with its numbers, the numbers); ``lessons.grid_verdicts`` makes them ``Verdict`` lines. Pure
functions of the trace dict."""
from __future__ import annotations

from statistics import fmean
from typing import NamedTuple

from dllm_local.analysis.costmodel import Experts

from .parts import canvas_ended, canvas_length, canvas_rules, canvas_steps, stable_for
from ..block.parts import experts_of
from ..parts.trace_parts import Trace, layer_order, steps_upto


class Told(NamedTuple):
    lesson: str
    claim: str
    holds: bool | None  # None: not measurable in this run (yet)
    detail: str
    numbers: dict


def _shown_below(value: float, threshold: float | None) -> str:
    """``value`` with the digits it takes to read as below ``threshold`` (0.0049, not 0.005 < 0.005)."""
    digits = 3
    while threshold is not None and digits < 9 and round(value, digits) >= threshold:
        digits += 1
    return f"{value:.{digits}f}"


def canvas_ending(trace: Trace, canvas: int, rows: list[int]) -> Told:
    """How canvas ``canvas`` (0-based) ended, or stands, at the last of its steps ``rows``."""
    steps, rules = trace.get("steps") or [], canvas_rules(trace)
    n, last = canvas + 1, steps[rows[-1]]["canvas"]
    most = rules.max_steps if rules.max_steps is not None else "max_denoising_steps (not in this trace)"
    threshold = rules.confidence_threshold if rules.confidence_threshold is not None else "not in this trace"
    lowest = min(float(steps[i]["canvas"]["mean_entropy"]) for i in rows)
    numbers = {"canvas": n, "steps": len(rows), "max": rules.max_steps, "threshold": rules.confidence_threshold,
               "finished": bool(last["finished"]), "mean_entropy": float(last["mean_entropy"]),
               "lowest_mean_entropy": lowest, "stable_for": stable_for(steps, rows)}
    claim = f"The stopping rule ends canvas {n} early"
    if last["finished"]:
        confident = (f"stable for {numbers['stable_for']} step(s) and confident (mean entropy "
                     f"{_shown_below(numbers['mean_entropy'], rules.confidence_threshold)} < {threshold})")
        if rules.max_steps is not None and len(rows) >= rules.max_steps:
            return Told("canvas_stop", claim, False, f"canvas {n} met its stopping rule only at its last step "
                        f"({len(rows)} of {most}), so no step was saved: {confident}", numbers)
        return Told("canvas_stop", claim, True, f"canvas {n} stopped early at step {len(rows)} of {most}: {confident}",
                    numbers)
    if not canvas_ended(trace, rows[-1]):
        return Told("canvas_stop", claim, None,
                    f"canvas {n} at step {len(rows)} of {most} so far: not yet stable and confident "
                    f"(mean entropy {numbers['mean_entropy']:.3f}, threshold {threshold})", numbers)
    stopped = (trace.get("stats") or {}).get("stopped") and rows[-1] == len(steps) - 1
    if stopped or (rules.max_steps is not None and len(rows) < rules.max_steps):  # neither finished nor out of steps
        return Told("canvas_stop", claim, None, f"canvas {n} was stopped at step {len(rows)} of {most}, before "
                    "its stopping rule or its last step", numbers)
    return Told("canvas_stop", claim, False,
                f"canvas {n} ran all {len(rows)} steps: never stable and confident "
                f"(lowest mean entropy {lowest:.3f}, threshold {threshold})", numbers)


ENCODER_CLAIM, ENCODER_LESSON = "The encoder's cache is exact", "encoder_cache"


def encoder_cache(trace: Trace, step: int | None = None) -> Told:
    """The encoder's cache up to ``step``: entries the decoder read from it (every step reads all
    of it) and entries the encoder computed (each canvas's first step: the prompt, then the canvas
    before). Exact by construction: the decoder only reads what the encoder wrote once. What the
    run measured, and could break it: each encoder pass found the cache grown by exactly what the
    passes before it computed (``cached``, the live cache's length), so nothing was computed twice.
    Its sliding-window layers keep only their last window of it; its full-attention layers all."""
    steps = steps_upto(trace, step)
    passes = [s["canvas"]["encoder"] for s in steps if s["canvas"].get("encoder")]
    reads = sum(int(s.get("reads") or 0) for s in steps)
    computed = sum(int(p["positions"]) for p in passes)
    before = [sum(int(p["positions"]) for p in passes[:i]) for i in range(len(passes))]
    kept = all(int(p["cached"]) == earlier for p, earlier in zip(passes, before))
    numbers = {"reads": reads, "computed": computed, "passes": len(passes), "kept": kept}
    line = (f"the encoder cache: {reads} entries read, {computed} computed; exact by construction (the encoder "
            f"never recomputes what it cached); each of its {len(passes)} pass(es) found the cache grown by exactly "
            f"what the passes before computed" if kept else
            f"the encoder cache: {reads} entries read, {computed} computed; a pass found "
            f"{next(int(p['cached']) for p, e in zip(passes, before) if int(p['cached']) != e)} entries in its cache "
            f"where the passes before computed {next(e for p, e in zip(passes, before) if int(p['cached']) != e)}")
    return Told(ENCODER_LESSON, ENCODER_CLAIM, kept if steps else None, line if steps else "no step yet", numbers)


def experts_routed(trace: Trace, step: int | None = None) -> list[Told]:
    """Per decoder layer, the distinct experts its router chose per pass, on average over the
    passes up to ``step``, against the cost model's expectation for a canvas of G tokens each sent
    to k of E experts, E(1 - (1 - k/E)^G): a pass over a whole canvas reads nearly every expert,
    where one autoregressive token reads k (so a canvas model's MoE saves less per pass)."""
    shape, steps = experts_of(trace), steps_upto(trace, step)
    layers = sorted({layer for s in steps for layer in s["canvas"].get("experts") or {}}, key=layer_order)
    if shape is None or not layers:
        return []
    total, routed = shape
    expected = Experts(total, routed, 1, 0.0).distinct(canvas_length(trace))
    told = []
    for layer in layers:
        mean = fmean(len(s["canvas"]["experts"][layer]) for s in steps if layer in (s["canvas"].get("experts") or {}))
        told.append(Told("experts", f"Layer {layer} reads the experts the cost model expects of a canvas",
                         abs(mean - expected) <= 0.15 * expected,
                         f"experts: layer {layer} routed to {mean:.1f} distinct of {total} on average per pass; the "
                         f"cost model expects {expected:.1f} for {canvas_length(trace)} tokens each sent to {routed} "
                         f"(one autoregressive token reads {routed})",
                         {"layer": layer, "mean_distinct": mean, "expected": expected, "experts": total}))
    return told


def canvas_told(trace: Trace, step: int | None = None) -> list[Told]:
    """Every canvas claim up to ``step``: how each canvas begun so far ended (or stands), the
    encoder's cache, the experts."""
    if not steps_upto(trace, step):
        return []
    endings = [canvas_ending(trace, canvas, rows) for canvas, rows in sorted(canvas_steps(trace, step).items())]
    return [*endings, encoder_cache(trace, step), *experts_routed(trace, step)]

