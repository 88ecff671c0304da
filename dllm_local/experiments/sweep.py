"""Sweeps: a grid over numeric knobs -> accuracy against tokens/s, Pareto frontier marked.

    python -m dllm_local sweep --threshold 0.5,0.7,0.8,0.9 --block-size 8,16,32 --n 50
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .bench import run_strategy
from .problems import Problem
from .frontier import pareto
from ..errors import SettingsError
from ..policies import registry
from ..settings import Settings

if TYPE_CHECKING:  # the CLI's parser reads sweepable() without loading torch
    from ..models.loader import GuiderHandle, ModelHandle

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
    return [(point, apply(base, point)) for point in grid(axes)]


@dataclass
class SweepProgress:
    done: int
    total: int
    point: dict
    row: dict


def run_sweep(handle: ModelHandle, problems: list[Problem], base: Settings, axes: dict[str, list],
              guider: GuiderHandle | None = None, cancel: threading.Event | None = None,
              on_point: Callable[[SweepProgress], None] | None = None) -> dict:
    """Every grid point over ``problems``; stops early (keeping what it has) when ``cancel`` is set."""
    points = plan(base, axes)
    rows = []
    for i, (point, s) in enumerate(points):
        if cancel is not None and cancel.is_set():
            break
        # One pass per point: a sweep compares accuracy against speed over many points, and a
        # point's time is already a mean over every problem.
        row = {"point": point, **run_strategy(handle, problems, s, guider, repeats=1)}
        rows.append(row)
        if on_point:
            on_point(SweepProgress(i + 1, len(points), point, row))
    front = set(pareto(rows))
    for i, row in enumerate(rows):
        row["pareto"] = i in front
    return {"axes": axes, "base_settings": base.to_dict(), "problems": len(problems), "rows": rows,
            "cancelled": len(rows) < len(points)}


def format_sweep(report: dict) -> str:
    axes = list(report["axes"])
    head = " ".join(f"{a:>11}" for a in axes) + f" {'acc':>7} {'tok/s':>8} {'NFE':>6} {'tau':>6}  pareto"
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(" ".join(f"{r['point'][a]!s:>11}" for a in axes)
                     + f" {r['accuracy']:>7.1%} {r['model_tok_s']:>8.1f} {r['nfe']:>6.1f} {r['tau']:>6.2f}  "
                     + ("*" if r["pareto"] else ""))
    if report["cancelled"]:
        lines.append("(cancelled: partial grid)")
    return "\n".join(lines)
