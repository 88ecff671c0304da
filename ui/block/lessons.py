"""The block cache's claim beside the KV view, checked on a block-diffusion run: its finished blocks'
K/V are exact. Which entries were stored, when and by how many store forwards comes from the run's
``stored`` spans; with the exact-drift diagnostic on, their cached-vs-exact cosine is given too.
Trace in, verdict out, like ``lessons``."""
from __future__ import annotations

from .parts import EXACT_WORDS, exact_since, is_block_trace, store_forwards, stored_spans
from ..lessons.verdicts import FAILS, HOLDS, UNMEASURABLE, Verdict
from ..parts.replay import MEAN_LAYERS, Trace, per_position, prompt_len, steps_upto

CLAIM = "Finished blocks' K/V are exact"
# Exact by construction: a stored entry measured below this against a full recompute is a bug.
EXACT = 0.9999


def _measured(trace: Trace, step: int, layer: str, which: str) -> list[float]:
    """The cached-vs-exact cosines of the stored entries, where the run measured them."""
    since, found = exact_since(trace, step), []
    for index, record in enumerate(steps_upto(trace, step)):
        per_layer = (record.get("exact") or {}).get("cache_vs_exact") or {}
        names = per_layer if layer == MEAN_LAYERS else [name for name in per_layer if name == str(layer)]
        for name in names:
            column = per_position(per_layer[name], which) or []
            found += [float(column[p]) for p, s in since.items() if s <= index and p < len(column)
                      and column[p] is not None]
    return found


def _recomputed_after_store(trace: Trace, step: int, since: dict[int, int]) -> tuple[list[int], list[int]]:
    """Stored positions a later forward recomputed, up to ``step``: those that break the claim, and
    those a shifted head ran only as the query for the position after them (that one not stored)."""
    shifted, broken, queries = bool((trace.get("model") or {}).get("shifted_head")), set(), set()
    for s, record in enumerate(steps_upto(trace, step)):
        for p in map(int, record.get("recomputed") or []):
            if since.get(p, s + 1) <= s:
                (queries if shifted and since.get(p + 1, s + 1) > s else broken).add(p)
    return sorted(broken), sorted(queries - broken)


def stored_verdict(trace: Trace, step: int, layer: str = MEAN_LAYERS, which: str = "v") -> Verdict | None:
    """Were the run's finished blocks stored once and never recomputed, up to ``step``, and, where
    measured, equal to a full recompute? None for a run that is not block diffusion."""
    if not is_block_trace(trace):
        return None
    spans = stored_spans(trace, step)
    if not spans:
        return Verdict("stored", CLAIM, UNMEASURABLE, "no store forward yet: no block has finished", {"stored": 0})
    since = exact_since(trace, step)
    recomputed, queries = _recomputed_after_store(trace, step, since)
    measured = _measured(trace, step, layer, which)
    forwards = store_forwards(trace, step)
    numbers = {"stored": len(since), "spans": [[s, a, b] for s, a, b in spans], "store_forwards": forwards,
               "recomputed_after_store": recomputed, "query_only": queries, "least_measured": min(measured) if measured else None}
    prompt = sum(p < prompt_len(trace) for p in since)
    detail = (f"{len(since)} positions ({prompt} of the prompt, {len(since) - prompt} of the answer) in {len(spans)} span(s) written by {forwards} K/V store forward(s), "
              f"counted apart from NFE; {EXACT_WORDS}")
    if queries:  # a shifted head reads a block's first logits from the position before it, recomputed as released
        detail += (f"; positions {queries[:8]} ran again, each only as the query before the next block (a shifted "
                   "head reads a position's logits from the one before it): their K/V, recomputed from the same "
                   "tokens at the same positions, are the same values")
    if recomputed:
        return Verdict("stored", CLAIM, FAILS, f"{detail}; yet recomputed later at positions {recomputed[:8]}", numbers)
    if measured:
        status = HOLDS if min(measured) >= EXACT else FAILS
        return Verdict("stored", CLAIM, status, f"{detail}; cached vs exact on them ({which.upper()}): "
                       f"least cosine {min(measured):.6f} over {len(measured)}", numbers)
    return Verdict("stored", CLAIM, HOLDS, f"{detail} ({'no other' if queries else 'none'} recomputed after it was stored)",
                   numbers)
