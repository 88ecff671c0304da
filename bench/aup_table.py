"""AUP of every cache x unmasking policy on the tiny model: for each pair, the unmasking policy's
parallelism knob at three values (one token per step down to four for the fixed schedule), all
pairs in one job, so one pool of workers decodes them and every pair is weighted against the best
accuracy of all (d3LLM's y_max). Prints a Markdown table.

    python bench/aup_table.py [--n 40] [--ray local] [--resume bench/results/aup.jsonl]

With --results FILE every finished problem is appended to FILE, so a stopped run goes on with
--resume FILE.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT  # noqa: E402

from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.analysis.frontier import policy_curves  # noqa: E402
from dllm_local.experiments.sweep import point_row  # noqa: E402
from dllm_local.experiments.cluster import Cluster, ClusterRunner  # noqa: E402
from dllm_local.experiments.units import (Job, LocalRunner, ModelSpec, Results, Worker, plan_units,  # noqa: E402
                                          progress_bar)
from dllm_local.policies import registry  # noqa: E402
from dllm_local.settings import Settings  # noqa: E402

GEN, BLOCK = 64, 32
# Each unmasking policy's knob of parallelism, least parallel first.
KNOBS = {
    "fixed": [{"steps": 64}, {"steps": 32}, {"steps": 16}],
    "threshold": [{"threshold": t} for t in (0.9, 0.7, 0.5)],
    "factor": [{"factor": f} for f in (0.5, 1.0, 2.0)],
    "guided": [{"rule": "topk", "ratio": r} for r in (0.9, 0.5, 0.2)],
    "self_verify": [{"threshold": t} for t in (0.9, 0.7, 0.5)],
    "revise": [{"draft_threshold": t} for t in (0.9, 0.7, 0.5)],
    "flash_verify": [{"threshold": t} for t in (0.9, 0.7, 0.5)],
}


def decodes(cache: str, unmask: str) -> bool:
    return registry.pair_problem(registry.get("cache", cache), registry.get("unmask", unmask)) is None


def settings_of(cache: str, unmask: str, knob: dict) -> Settings:
    steps = knob.get("steps")
    params = {k: v for k, v in knob.items() if k != "steps"}
    return Settings(gen_length=GEN, block_size=BLOCK, steps=steps, cache=cache, unmask=unmask, unmask_params=params,
                    trace="off")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=COUNT, default=40)
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--ray", default=None, help="local, auto or HOST:PORT (default: this process)")
    ap.add_argument("--results", default=None)
    ap.add_argument("--resume", default=None)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    missing = set(registry.UNMASK) - set(KNOBS)
    if missing:
        sys.exit(f"no parallelism knob listed for {', '.join(sorted(missing))}: add it to KNOBS")
    points, settings = [], []
    for cache in registry.for_model("masked", registry.CACHE):
        for unmask, knobs in KNOBS.items():
            for knob in knobs if decodes(cache, unmask) else ():
                points.append({"cache": cache, "unmask": unmask, **knob})
                settings.append(settings_of(cache, unmask, knob).to_dict())
    job = Job(ModelSpec("tiny", device="cpu"), args.task, args.n, 1000, tuple(points), tuple(settings))
    results = Results(job, args.resume or args.results, resume=bool(args.resume))
    start = time.perf_counter()
    runner = ClusterRunner(Cluster(args.ray)) if args.ray else LocalRunner(Worker.load(job, "local"))
    with progress_bar(results, "aup") as on_unit:
        runner.run(job, plan_units(job, results.records), results, on_unit, None)
    rows = [point_row(job, results, p) for p in range(len(points))]
    curves = policy_curves(rows)
    print(f"machine: {machine_name()} | task {args.task}, n {args.n}, gen {GEN}, block {BLOCK} | "
          f"{time.perf_counter() - start:.0f} s{' on Ray ' + args.ray if args.ray else ''}")
    print("| cache \\ unmasking | " + " | ".join(KNOBS) + " |")
    print("|---|" + "---|" * len(KNOBS))
    for cache in registry.for_model("masked", registry.CACHE):
        cells = []
        for unmask in KNOBS:
            if not decodes(cache, unmask):
                cells.append("—")
                continue
            c = curves[f"{cache} + {unmask}"]
            cells.append(f"{c['aup']:.0f} ({max(c['accuracy']):.0f}%, τc ≤ {max(c['tau_content']):.1f})")
        print(f"| {cache} | " + " | ".join(cells) + " |")
    best = max(r["accuracy"] for r in rows)
    print(f"y_max (best accuracy of all points): {best:.1%}; cell: AUP (best accuracy on the curve, its largest "
          "content tokens per forward)")


if __name__ == "__main__":
    main()
