"""Benchmarks: strategies side by side on one evaluation set, one table, medians of repeats.

    python -m dllm_local bench [--task arithmetic | --jsonl FILE --scorer exact_number] [--set cache-x-unmask]

Speedups are ratios measured in the same run against the first strategy (the baseline).
"""
from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from .costmodel import machine_name
from ..errors import DllmError
from ..policies import registry
from ..models.loader import GuiderHandle, ModelHandle
from ..sampler import generate
from ..settings import Settings
from ..tiny.tasks import make_problems
from ..tiny.tasks import score as score_task


@dataclass(frozen=True)
class Strategy:
    changes: dict = field(default_factory=dict)
    note: str = ""  # what sets the row apart beyond its policies ("trace off")

    def settings(self, base: Settings) -> Settings:
        return base.with_(**self.changes)

    def name(self, base: Settings) -> str:
        """The policies with their headline knobs, from the specs: "dual + threshold 0.9"."""
        s = self.settings(base)
        unmask = s.unmask_spec.short(s.unmask_params)
        if s.unmask_spec.uses_steps and s.steps is None:
            unmask += " 1/step"
        return f"{s.cache_spec.short(s.cache_params)} + {unmask}" + (f", {self.note}" if self.note else "")


def _rule(unmask: str, **params) -> dict:
    return {"unmask": unmask, "unmask_params": params}


ONE_PER_STEP = _rule("fixed")
THRESHOLD = _rule("threshold", threshold=0.9)


def _cache_x_unmask() -> list[Strategy]:
    rules = (ONE_PER_STEP, THRESHOLD, _rule("factor", factor=1.0))
    return [Strategy({"cache": cache, **rule}) for cache in registry.CACHE for rule in rules]


STRATEGY_SETS: dict[str, Callable[[], list[Strategy]]] = {
    "cache-x-unmask": _cache_x_unmask,
    "headline": lambda: [
        Strategy({"cache": "none", **ONE_PER_STEP}),
        Strategy({"cache": "dual", **THRESHOLD}),
        Strategy({"cache": "freecache", **THRESHOLD}),
        Strategy({"cache": "adaptive", **THRESHOLD}),
        Strategy({"cache": "dual", **_rule("self_verify", threshold=0.9)}),
        Strategy({"cache": "dual", **_rule("revise")}),
        Strategy({"cache": "drift_refresh", **THRESHOLD}),
        Strategy({"cache": "dual", "trace": "off", **THRESHOLD}, note="trace off"),
    ],
}


@dataclass
class Problem:
    prompt: str
    is_correct: Callable[[str], bool]
    kind: str = ""


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "exact_number": lambda out, ans: _last_number(out) is not None and float(_last_number(out)) == float(_last_number(ans) or "nan"),
    "exact_string": lambda out, ans: out.strip() == ans.strip(),
    "contains": lambda out, ans: ans.strip().lower() in out.lower(),
}


def task_problems(task: str, n: int, seed: int) -> list[Problem]:
    return [Problem(ex.prompt, lambda out, ex=ex: score_task(ex, out), ex.kind) for ex in make_problems(task, n, seed)]


def jsonl_problems(path: Path, scorer: str, n: int | None = None) -> list[Problem]:
    """A user's evaluation set: one ``{"prompt": ..., "answer": ...}`` object per line."""
    if scorer not in SCORERS:
        raise DllmError(f"scorer must be one of {', '.join(SCORERS)}, not {scorer!r}")
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DllmError(f"cannot read the evaluation set {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    problems = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, answer = row["prompt"], str(row["answer"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DllmError(f"{path} line {i}: expected a JSON object with 'prompt' and 'answer' ({exc})") from exc
        problems.append(Problem(prompt, lambda out, a=answer: SCORERS[scorer](out, a)))
    if not problems:
        raise DllmError(f"{path} has no problems: expected one JSON object with 'prompt' and 'answer' per line")
    return problems[:n] if n else problems


# Repeats of one row whose times spread wider than this (max - min over the median) are flagged:
# something else was using the machine, and the row's ratios are not to be trusted.
SPREAD_WARNING = 0.2


def run_strategy(handle: ModelHandle, problems: list[Problem], settings: Settings,
                 guider: GuiderHandle | None = None, repeats: int = 3, bar: tqdm | None = None) -> dict:
    """One row of the table: per-answer means, and the median over repeats of the times (after
    one warm-up answer, so start-up costs stay out of it). ``bar`` advances once per answer."""
    repeats = registry.check_value(repeats, int, "repeats", "an integer >= 1", lambda v: v >= 1)
    walls, models = [], []
    generate(handle, problems[0].prompt, settings, guider)
    for _ in range(repeats):
        stats, correct = [], []
        t0 = time.perf_counter()
        for i, p in enumerate(problems):
            r = generate(handle, p.prompt, settings.for_problem(i), guider)
            stats.append(r.stats)
            correct.append(p.is_correct(r.text))
            if bar is not None:
                bar.update(1)
        walls.append((time.perf_counter() - t0) / len(problems))
        models.append(sum(s.model_s for s in stats) / len(problems))
    content = sum(s.content_tokens for s in stats)
    model_total = sum(s.model_s for s in stats)
    wall = statistics.median(walls)
    return {
        "settings": settings.to_dict(),
        "accuracy": sum(correct) / len(problems),
        "nfe": statistics.mean(s.nfe for s in stats),
        "tau": statistics.mean(s.tokens_per_forward for s in stats),
        "tau_content": statistics.mean(s.content_tokens_per_forward for s in stats),
        "g": statistics.mean(s.mean_g for s in stats),
        "model_tok_s": content / model_total if model_total else 0.0,
        "model_s": statistics.median(models),
        "wall_s": wall,
        "wall_s_repeats": walls,
        "spread": (max(walls) - min(walls)) / wall if wall else 0.0,
        "other_share": sum(s.other_s for s in stats) / max(1e-9, sum(s.wall_s for s in stats)),
    }


def run_bench(handle: ModelHandle, problems: list[Problem], strategies: list[Strategy], base: Settings,
              guider: GuiderHandle | None = None, repeats: int = 3, progress: bool = True) -> dict:
    rows = []
    with tqdm(total=len(strategies) * repeats * len(problems), unit="answer", disable=not progress,
              mininterval=2) as bar:
        for strat in strategies:
            name = strat.name(base)
            bar.set_description(name)
            rows.append({"strategy": name, **run_strategy(handle, problems, strat.settings(base), guider, repeats, bar)})
    base_wall = rows[0]["wall_s"]
    for row in rows:
        row["speedup"] = base_wall / row["wall_s"] if row["wall_s"] else 0.0
    return {"machine": machine_name(), "model": handle.summary()["name"], "problems": len(problems),
            "repeats": repeats, "base_settings": base.to_dict(), "rows": rows}


def format_table(report: dict) -> str:
    head = (f"{'strategy':<34} {'NFE':>6} {'tau':>6} {'tau_c':>6} {'G':>7} {'tok/s':>8} "
            f"{'wall s':>8} {'speedup':>8} {'acc':>6}")
    lines = [f"machine: {report['machine']} | model: {report['model']} | {report['problems']} problems, "
             f"median of {report['repeats']} | gen {report['base_settings']['gen_length']}, "
             f"block {report['base_settings']['block_size']}", head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(f"{r['strategy']:<34} {r['nfe']:>6.1f} {r['tau']:>6.2f} {r['tau_content']:>6.2f} {r['g']:>7.1f} "
                     f"{r['model_tok_s']:>8.1f} {r['wall_s']:>8.3f} {r['speedup']:>7.1f}x {r['accuracy']:>6.1%}")
    lines.append("tau: tokens per forward (all; tau_c: content only, EOS padding excluded); G: positions recomputed per "
                 "forward; tok/s: content tokens over model time; wall s: per answer; speedup: wall, vs the first row")
    unsteady = [r["strategy"] for r in report["rows"] if r.get("spread", 0.0) > SPREAD_WARNING]
    if unsteady:
        lines.append(f"WARNING: the repeats of {', '.join(unsteady)} differ by more than {SPREAD_WARNING:.0%} "
                     "(max - min over the median wall time): something else used the machine, so these rows' "
                     "speedups are not reliable. Run again on a quiet machine, or with more --repeats.")
    elif report["repeats"] < 3:
        lines.append(f"note: {report['repeats']} repeat(s) only: nothing shows whether the machine was quiet.")
    return "\n".join(lines)
