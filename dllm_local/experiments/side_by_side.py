"""Benchmarks: strategies side by side on one evaluation set, one table, medians of repeats.

    python -m dllm_local bench [--task arithmetic | --jsonl FILE --scorer exact_number] [--set cache-x-unmask]

Speedups are ratios measured in the same run against the first strategy (the baseline).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from pydantic import TypeAdapter
from tqdm import tqdm

from ..errors import DllmError
from ..policies import registry
from ..settings import Settings
from ..devices import DEVICES, machine_name
from ..limits import BATCH_MODE
from ..values import integer, read
from .problems import Problem
from ..analysis.costmodel import TARGET_MODELS, TEACHING_EXAMPLE, concurrency_crossovers

# The model side is imported where a bench runs: the CLI builds its parser from this module's
# STRATEGY_SETS and SCORERS without loading torch.
if TYPE_CHECKING:
    from ..models.loading.loader import GuiderHandle, ModelHandle


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


# The reference rows every set is read against: LLaDA's plain decoding, and Fast-dLLM's.
BASELINE = {"cache": "none", "unmask": "fixed", "unmask_params": {}}
FAST_DLLM = {"cache": "dual", "unmask": "threshold", "unmask_params": {"threshold": 0.9}}


def _unmask_rules() -> list[dict]:
    """Every registered unmasking policy at its defaults, except those that need a guider model
    (a bench loads none): the registry's order, so a new policy joins every set."""
    return [{"unmask": name, "unmask_params": {}} for name, spec in registry.UNMASK.items() if not spec.needs_guider]


def _cache_x_unmask() -> list[Strategy]:
    return [Strategy({"cache": cache, **rule}) for cache, spec in registry.for_model("masked", registry.CACHE).items() for rule in _unmask_rules()
            if registry.pair_problem(spec, registry.get("unmask", rule["unmask"])) is None]


def _headline() -> list[Strategy]:
    """The baseline, Fast-dLLM's row, then every other cache with its threshold rule and every
    other unmasking policy on its cache, and the trace's cost (Fast-dLLM's row, trace off)."""
    caches = [Strategy({**FAST_DLLM, "cache": cache}) for cache in registry.for_model("masked", registry.CACHE) if cache not in ("none", "dual")]
    rules = [Strategy({**FAST_DLLM, **rule}) for rule in _unmask_rules() if rule["unmask"] not in ("fixed", "threshold")]
    return [Strategy(BASELINE), Strategy(FAST_DLLM), *caches, *rules,
            Strategy({**FAST_DLLM, "trace": "off"}, note="trace off")]


def _block() -> list[Strategy]:
    """A block-diffusion model's set: full recompute under the block-causal mask, then its exact
    block cache with every unmasking policy (at the settings' block and cache parameters)."""
    return [Strategy({"cache": "none", **rule}) for rule in _unmask_rules()[:1]] + [
        Strategy({"cache": "block", **rule}) for rule in _unmask_rules()]


STRATEGY_SETS: dict[str, Callable[[], list[Strategy]]] = {"cache-x-unmask": _cache_x_unmask, "headline": _headline,
                                                          "block": _block}


# Repeats of one row whose times spread wider than this (max - min over the median) are flagged:
# something else was using the machine, and the row's ratios are not to be trusted.
SPREAD_WARNING = 0.2
REPEATS = TypeAdapter(integer(1, 1000))  # timed repeats of a row: the median is taken over them


def run_strategy(handle: ModelHandle, problems: list[Problem], settings: Settings,
                 guider: GuiderHandle | None = None, repeats: int = 3, bar: tqdm | None = None,
                 batch_size: int = 1, batch_mode: str = BATCH_MODE) -> dict:
    """One row of the table: per-answer means, and the median over repeats of the times (after
    one warm-up answer, so start-up costs stay out of it). ``batch_size`` answers are decoded
    together (in ``batch_mode``), each with its own seed. ``bar`` advances as answers finish."""
    from ..decoding.batch import generate_all
    from ..decoding.sampler import generate

    repeats = read(REPEATS, repeats, "repeats")
    walls, models = [], []
    generate(handle, problems[0].prompt, settings, guider)
    prompts, per_problem = [p.prompt for p in problems], [settings.for_problem(i) for i in range(len(problems))]
    for _ in range(repeats):
        t0 = time.perf_counter()
        results = generate_all(handle, prompts, per_problem, guider, batch_size, bar.update if bar is not None else None,
                               batch_mode=batch_mode)
        walls.append((time.perf_counter() - t0) / len(problems))
        stats = [r.stats for r in results]
        correct = [p.is_correct(r.text) for p, r in zip(problems, results)]
        models.append(sum(s.model_share_s for s in stats) / len(problems))
    content = sum(s.content_tokens for s in stats)
    model_total = sum(s.model_share_s for s in stats)  # a batch's forwards counted once
    waited = max(1e-9, sum(s.model_s for s in stats))  # each request's forwards in full
    wall = statistics.median(walls)
    return {
        "settings": settings.to_dict(),
        "batch_size": batch_size,
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
        # What the model time counts: the first forward (prefill), the block-start refreshes, the rest.
        "prefill_share": sum(s.prefill_s for s in stats) / waited,
        "refresh_share": sum(s.refresh_s for s in stats) / waited,
        "other_share": sum(s.other_s for s in stats) / max(1e-9, sum(s.wall_s for s in stats)),
    }


def run_bench(handle: ModelHandle, problems: list[Problem], strategies: list[Strategy], base: Settings,
              guider: GuiderHandle | None = None, repeats: int = 3, progress: bool = True, batch_size: int = 1,
              batch_mode: str = BATCH_MODE) -> dict:
    rows = []
    with tqdm(total=len(strategies) * repeats * len(problems), unit="answer", disable=not progress,
              mininterval=2) as bar:
        for strat in strategies:
            name = strat.name(base)
            bar.set_description(name)
            rows.append({"strategy": name, **run_strategy(handle, problems, strat.settings(base), guider, repeats, bar,
                                                          batch_size, batch_mode)})
    base_wall = rows[0]["wall_s"]
    for row in rows:
        row["speedup"] = base_wall / row["wall_s"] if row["wall_s"] else 0.0
    return {"machine": machine_name(), "model": handle.summary()["name"], "problems": len(problems),
            "repeats": repeats, "batch_size": batch_size, "batch_mode": batch_mode, "base_settings": base.to_dict(),
            "rows": rows}


def format_table(report: dict) -> str:
    head = (f"{'strategy':<34} {'NFE':>6} {'tau':>6} {'tau_c':>6} {'G':>7} {'tok/s':>8} {'wall s':>8} "
            f"{'speedup':>8} {'acc':>6} {'prefill':>7} {'refresh':>7} {'other':>6}")
    batch = report.get("batch_size", 1)
    lines = [f"machine: {report['machine']} | model: {report['model']} | {report['problems']} problems, "
             f"median of {report['repeats']} | gen {report['base_settings']['gen_length']}, "
             f"block {report['base_settings']['block_size']} | {batch} request{'s' if batch > 1 else ''} at a time"
             + (f", {report.get('batch_mode', BATCH_MODE)}" if batch > 1 else ""),
             head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(f"{r['strategy']:<34} {r['nfe']:>6.1f} {r['tau']:>6.2f} {r['tau_content']:>6.2f} {r['g']:>7.1f} "
                     f"{r['model_tok_s']:>8.1f} {r['wall_s']:>8.3f} {r['speedup']:>7.1f}x {r['accuracy']:>6.1%} "
                     f"{r['prefill_share']:>7.0%} {r['refresh_share']:>7.0%} {r['other_share']:>6.0%}")
    lines += [
        "tau: tokens per forward (all; tau_c: content only, EOS padding excluded); G: positions recomputed per forward",
        f"concurrency: {batch} request{'s' if batch > 1 else ''} decoded together (--batch-size); tok/s: content tokens "
        "over model time (a batch's forwards counted once)",
        "baseline: the first row, run on this machine, with this engine, in this same run; speedup: wall time vs it",
        "quality: acc is at that speed, each row's threshold named in its strategy",
        "time: wall s per answer counts everything: prefill (the first forward) and refresh (later forwards that "
        "recompute everything: block starts, refresh_every, drift) as shares of model time; other: setup, sampling "
        "and the trace, as a share of wall time",
    ]
    unsteady = [r["strategy"] for r in report["rows"] if r.get("spread", 0.0) > SPREAD_WARNING]
    if unsteady:
        lines.append(f"WARNING: the repeats of {', '.join(unsteady)} differ by more than {SPREAD_WARNING:.0%} "
                     "(max - min over the median wall time): something else used the machine, so these rows' "
                     "speedups are not reliable. Run again on a quiet machine, or with more --repeats.")
    elif report["repeats"] < 3:
        lines.append(f"note: {report['repeats']} repeat(s) only: nothing shows whether the machine was quiet.")
    return "\n".join(lines)


# ---------------------------------------------------------------- concurrency
def _median_run(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The run with the median wall time (its own latency with it)."""
    return sorted(runs)[len(runs) // 2]


def run_concurrency(handle: ModelHandle, guider: GuiderHandle, problems: list[Problem], levels: list[int],
                    settings: Settings, gpu: str = "H100", progress: bool = True, repeats: int = 3) -> dict:
    """Throughput and latency at each number of concurrent requests, for the diffusion model
    (``settings``, the requests decoded as one batch) and for the autoregressive ``guider``
    (batched, with its KV cache), on the same problems on this machine; and the cost model's
    prediction of the same two curves for LLaDA-8B and an 8B autoregressive model on ``gpu``,
    with the G and tau measured here. Each level runs ``repeats`` times; the run with the median
    wall time counts."""
    from ..decoding.batch import stream_batch
    from ..decoding.sampler import generate
    from .evaluate import ar_generate

    if len(problems) < max(levels):
        raise DllmError(f"{len(problems)} problems for {max(levels)} concurrent requests: give --n >= {max(levels)}")
    generate(handle, problems[0].prompt, settings)  # warm-up, both models
    ar_generate(guider, [problems[0].prompt], settings.gen_length)
    rows = []
    for c in tqdm(levels, desc="concurrency", disable=not progress):
        batch = problems[:c]
        diffusion, ar = [], []  # per repeat: (wall s, mean latency s); the answers are the same each time
        for _ in range(repeats):
            # Both clocks start before the prompts are encoded and stop when the last answer is done.
            t0 = time.perf_counter()
            run = stream_batch(handle, [p.prompt for p in batch], [settings.for_problem(i) for i in range(c)])
            encode_s = time.perf_counter() - t0
            for _ in run:
                pass
            diffusion.append((encode_s + run.wall_s, encode_s + statistics.mean(run.latency_s)))
            t0 = time.perf_counter()
            texts, lengths, ar_latency = ar_generate(guider, [p.prompt for p in batch], settings.gen_length)
            ar.append((time.perf_counter() - t0, statistics.mean(ar_latency)))
        stats = [r.stats for r in run.results]
        (d_wall, d_latency), (a_wall, a_latency) = _median_run(diffusion), _median_run(ar)
        rows.append({
            "concurrency": c,
            "diffusion_tok_s": sum(s.content_tokens for s in stats) / d_wall,
            "diffusion_latency_s": d_latency,
            "diffusion_accuracy": statistics.mean(p.is_correct(r.text) for p, r in zip(batch, run.results)),
            "g": statistics.mean(s.mean_g for s in stats),
            "tau_content": statistics.mean(s.content_tokens_per_forward for s in stats),
            "ar_tok_s": sum(lengths) / a_wall,
            "ar_latency_s": a_latency,
            "ar_accuracy": statistics.mean(p.is_correct(t) for p, t in zip(batch, texts)),
        })
    overtaken = next((r["concurrency"] for r in rows if r["ar_tok_s"] >= r["diffusion_tok_s"]), None)
    # Flat: doubling the requests (or more) gains less than a fifth in throughput.
    flat = next((b["concurrency"] for a, b in zip(rows, rows[1:]) if b["diffusion_tok_s"] < 1.2 * a["diffusion_tok_s"]), None)
    # A request decodes in a batch as alone: the largest level's mean G and tau, over the most problems.
    g, tau = rows[-1]["g"], rows[-1]["tau_content"]
    device = DEVICES[gpu]
    return {
        "machine": machine_name(), "model": handle.summary()["name"], "ar_model": guider.name,
        "settings": settings.to_dict(), "repeats": repeats, "rows": rows, "ar_overtakes_at": overtaken,
        "diffusion_flat_from": flat,
        "prediction": {
            "gpu": device.name, "g": g, "tau": tau, "measured_over": rows[-1]["concurrency"],
            "llada_8b": concurrency_crossovers(TARGET_MODELS["LLaDA-8B-Instruct"], device, g, tau),
            "teaching": concurrency_crossovers(TEACHING_EXAMPLE.model, DEVICES[TEACHING_EXAMPLE.device],
                                               TEACHING_EXAMPLE.g, TEACHING_EXAMPLE.tau),
            "teaching_gpu": DEVICES[TEACHING_EXAMPLE.device].name,
        },
    }


def format_concurrency(report: dict) -> str:
    s = report["settings"]
    strategy = Strategy({}).name(Settings.from_dict(s))
    head = (f"{'requests':>8} {'diffusion tok/s':>16} {'latency s':>10} {'acc':>6} {'AR tok/s':>10} "
            f"{'latency s':>10} {'acc':>6} {'AR / diffusion':>15}")
    lines = [f"machine: {report['machine']} | diffusion: {report['model']}, {strategy}, gen {s['gen_length']}, "
             f"block {s['block_size']} | autoregressive: {report['ar_model']}, greedy, KV cache | median of "
             f"{report['repeats']}", head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(f"{r['concurrency']:>8} {r['diffusion_tok_s']:>16.1f} {r['diffusion_latency_s']:>10.3f} "
                     f"{r['diffusion_accuracy']:>6.0%} {r['ar_tok_s']:>10.1f} {r['ar_latency_s']:>10.3f} "
                     f"{r['ar_accuracy']:>6.0%} {r['ar_tok_s'] / r['diffusion_tok_s']:>14.2f}x")
    flat, over = report["diffusion_flat_from"], report["ar_overtakes_at"]
    lines.append("measured here: diffusion throughput " + (f"flattens from {flat} requests" if flat else "still rising at the last level")
                 + "; autoregressive " + (f"overtakes at {over}" if over else "does not overtake at these levels"))
    p = report["prediction"]
    for name, key, gpu in (("LLaDA-8B vs an 8B AR model", "llada_8b", p["gpu"]),
                           ("the write-up's teaching 7B (G 32, tau 4)", "teaching", p["teaching_gpu"])):
        x = p[key]
        lines.append(f"cost model, {name} on {gpu}: diffusion saturates at "
                     f"~{x['diffusion_saturates']:.0f} requests, AR overtakes at ~{x['ar_overtakes']:.0f}"
                     + (f" (G {p['g']:.1f} and content tau {p['tau']:.2f}: this run's, the mean over "
                        f"{p['measured_over']} problems)" if key == "llada_8b" else ""))
    lines += [
        "tok/s: content tokens (answer up to its end) over wall time, all requests together; latency: the mean time "
        "until a request's answer is done (a diffusion request leaves the batch then; an AR request's row waits for "
        "the batch's longest answer); acc: over the level's requests",
        "baseline: the autoregressive model runs on this machine, in this process, on the same problems",
        "time counts everything from the prompts' encoding on: prefill, the refresh forwards, and fixed overhead",
    ]
    return "\n".join(lines)
