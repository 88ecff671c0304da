"""Sweeps: a grid over numeric knobs -> accuracy against tokens/s, Pareto frontier marked.

    python -m dllm_local sweep --threshold 0.5,0.7,0.8,0.9 --block-size 8,16,32 --n 50
"""
from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass
from typing import Callable

from ..analysis.frontier import AUP_ALPHA, AUP_CUT, MAX_POINTS, pareto, policy_curves
from .units import DEFAULT_CHUNK, Job, ModelSpec, OnUnit, Results, Runner, UnitDone, plan_units, row_of
from ..errors import SettingsError
from ..policies import registry
from ..settings import Settings

# Settings knobs any sweep can vary; besides them, every numeric parameter of the policies swept.
SETTINGS_KNOBS = ("block_size", "gen_length", "steps", "temperature")


def sweepable(base: Settings | None = None) -> list[str]:
    """The knobs a sweep can vary: of ``base``'s two policies, or of every registered policy."""
    specs = [base.cache_spec, base.unmask_spec] if base else [*registry.CACHE.values(), *registry.UNMASK.values()]
    params = [p.name for spec in specs for p in spec.params if p.type in (int, float)]
    return [*SETTINGS_KNOBS, *dict.fromkeys(params)]


def apply(base: Settings, point: dict) -> Settings:
    """``base`` with the knob values of one grid point. A policy parameter is named alone
    ("threshold"), or with its kind ("cache.top_k") where both policies have one of that name."""
    changes: dict = {}
    for knob, value in point.items():
        if knob in SETTINGS_KNOBS:
            changes[knob] = value
            continue
        only, _, name = knob.rpartition(".")
        for kind, spec in (("cache", base.cache_spec), ("unmask", base.unmask_spec)):
            if name in spec.defaults and only in ("", kind):
                group = f"{kind}_params"
                changes.setdefault(group, dict(getattr(base, group)))[name] = value
                break
        else:
            raise SettingsError(f"cannot sweep {knob!r} with {base.cache} + {base.unmask}; "
                                f"sweepable knobs: {', '.join(sweepable(base))}")
    return base.with_(**changes)


def grid(axes: dict[str, list]) -> list[dict]:
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def plan(base: Settings, axes: dict[str, list]) -> list[tuple[dict, Settings]]:
    """Every grid point with its settings, all validated before any time is spent on one."""
    for knob, values in axes.items():
        if not values:
            raise SettingsError(f"sweep axis {knob!r} has no values")
    size = math.prod(len(values) for values in axes.values())
    if size > MAX_POINTS:
        raise SettingsError(f"the sweep's grid has {size} points; at most {MAX_POINTS}: try fewer values per axis")
    return [(point, apply(base, point)) for point in grid(axes)]


def sweep_job(base: Settings, axes: dict[str, list], task: str, n: int, seed_data: int = 1000,
              model: ModelSpec = ModelSpec(), batch_size: int = 1) -> Job:
    """A sweep as work for any runner: every grid point's settings, validated here."""
    points = plan(base, axes)
    return Job(model, task, n, seed_data, tuple(p for p, _ in points), tuple(s.to_dict() for _, s in points),
               batch_size, base.to_dict())


@dataclass
class SweepProgress:
    done: int
    total: int
    point: dict
    row: dict


def run_sweep(job: Job, runner: Runner, results: Results | None = None, cancel: threading.Event | None = None,
              on_point: Callable[[SweepProgress], None] | None = None, on_unit: OnUnit | None = None,
              chunk: int = DEFAULT_CHUNK) -> dict:
    """Every grid point over the job's problems, on ``runner`` (this process, or a cluster); what
    ``results`` already holds (a resumed run) is not decoded again. Stops early, keeping what it
    has, when ``cancel`` is set. ``on_point`` is told each point as its last problem arrives."""
    results = results or Results(job)
    finished = [p for p in range(len(job.points)) if results.complete(p)]

    def unit_done(progress: UnitDone) -> None:
        for point in progress.completed_points:
            finished.append(point)
            if on_point:
                row = point_row(job, results, point)
                on_point(SweepProgress(len(finished), len(job.points), job.points[point], row))
        if on_unit:
            on_unit(progress)

    runner.run(job, plan_units(job, results.records, chunk), results, unit_done, cancel)
    return sweep_report(job, results)


def point_row(job: Job, results: Results, point: int) -> dict:
    return {"point": job.points[point], "settings": job.settings[point], "n": job.n,
            **row_of(results.of_point(point))}


def sweep_report(job: Job, results: Results) -> dict:
    """The table of the points whose every problem is in ``results``, the Pareto front of accuracy
    against tokens/s, and each policy's curve of accuracy against tokens per forward and its AUP."""
    rows = [point_row(job, results, p) for p in range(len(job.points)) if results.complete(p)]
    front = set(pareto(rows))
    for i, row in enumerate(rows):
        row["pareto"] = i in front
    axes = {knob: list(dict.fromkeys(p[knob] for p in job.points)) for knob in job.points[0]}
    return {"axes": axes, "base_settings": job.base, "problems": job.n, "rows": rows,
            "policies": policy_curves(rows), "cancelled": len(rows) < len(job.points)}


def format_sweep(report: dict) -> str:
    axes = list(report["axes"])
    head = " ".join(f"{a:>11}" for a in axes) + f" {'acc':>7} {'tok/s':>8} {'NFE':>6} {'tau':>6} {'tau_c':>6}  pareto"
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(" ".join(f"{r['point'][a]!s:>11}" for a in axes)
                     + f" {r['accuracy']:>7.1%} {r['model_tok_s']:>8.1f} {r['nfe']:>6.1f} {r['tau']:>6.2f} "
                     + f"{r['tau_content']:>6.2f}  " + ("*" if r["pareto"] else ""))
    if report["cancelled"]:
        lines.append("(cancelled: partial grid)")
    lines += format_aup(report.get("policies") or {})
    return "\n".join(lines)


def format_aup(curves: dict[str, dict]) -> list[str]:
    """Each policy's AUP and the curve it is the area under."""
    if not curves:
        return []
    lines = [f"AUP (accuracy under parallelism, d3LLM's definition: alpha {AUP_ALPHA:g}, points within {AUP_CUT:g} "
             "of the policy's best; tau_c, content tokens per forward, against accuracy):"]
    for policy, c in curves.items():
        curve = ", ".join(f"({t:.2f}, {a:.1f}%)" for t, a in zip(c["tau_content"], c["accuracy"]))
        lines.append(f"  {policy}: AUP {c['aup']:.1f}  curve {curve}")
    return lines
