"""Accuracy-against-speed points and their Pareto frontier, torch-free (the page uses it): a sweep's
points, and results added from elsewhere (an ``lm-eval`` or another sweep's JSON report)."""
from __future__ import annotations

from numbers import Real

from ..errors import DllmError


def pareto(points: list[dict], x: str = "model_tok_s", y: str = "accuracy") -> list[int]:
    """Indices of points no other point beats on both ``x`` and ``y`` (higher is better)."""
    front = []
    for i, p in enumerate(points):
        dominated = any(
            q[x] >= p[x] and q[y] >= p[y] and (q[x] > p[x] or q[y] > p[y]) for j, q in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return front


def _checked_rows(report: object, source: str) -> list[dict]:
    rows = report.get("rows") if isinstance(report, dict) else None
    if not isinstance(rows, list) or not rows:
        raise DllmError(f"{source} is not a sweep or lm-eval report: it has no \"rows\" "
                        "(write one with `python -m dllm_local lm-eval ... --out FILE` or `sweep ... --out FILE`)")
    for i, row in enumerate(rows):
        ok = (isinstance(row, dict) and isinstance(row.get("point"), dict)
              and all(isinstance(row.get(k), Real) for k in ("accuracy", "model_tok_s", "nfe")))
        if not ok:
            raise DllmError(f"{source}: row {i + 1} needs a \"point\" and numbers for accuracy, model_tok_s and nfe")
    return rows


def add_points(current: dict, added: dict, source: str) -> dict:
    """``current`` (a sweep report, possibly empty) with ``added``'s points appended, each labelled
    with where it came from and keeping its own number of problems; the frontier recomputed."""
    new_rows = _checked_rows(added, source)
    n_added = added.get("problems") or added.get("limit") or 0
    rows = [dict(r, n=r.get("n", current.get("problems") or 0)) for r in current.get("rows") or []]
    rows += [dict(r, n=r.get("n") or n_added, label=r.get("label") or source, pareto=False) for r in new_rows]
    front = set(pareto(rows))
    for i, row in enumerate(rows):
        row["pareto"] = i in front
    axes = dict(current.get("axes") or added.get("axes") or {})
    return {**current, "axes": axes, "rows": rows, "problems": current.get("problems") or n_added}
