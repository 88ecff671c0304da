"""The tiny models' quality table: every check of the quality table in docs/tiny-models.md, on held-out problems.

    python bench/tiny_quality.py [--model tiny] [--guider tiny-guider] [--jobs 2] [--only NAME ...] [--scale 1.0]

Each row is one `python -m dllm_local eval` run (problem seed 1000, problem i decoded with seed
i); the table prints the equivalent command. Rows run in ``--jobs`` processes of one thread
each. ``--scale 0.2`` runs a fifth of the problems of every row, for a quick look.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, SHARE  # noqa: E402

DUAL_09 = {"cache": "dual", "unmask": "threshold", "unmask_params": {"threshold": 0.9}}
THRESHOLD_01 = {"unmask": "threshold", "unmask_params": {"threshold": 0.1}}
SELF_VERIFY_01 = {"unmask": "self_verify", "unmask_params": {"threshold": 0.1}}


@dataclass(frozen=True)
class Check:
    name: str
    task: str
    n: int
    settings: dict = field(default_factory=dict)
    measure: str = "score"  # score, invalid (1 - score) or clean_end
    target: str = ""
    guider_alone: bool = False


CHECKS = [
    Check("arithmetic, one per step, gen 64", "arithmetic", 200, {"gen_length": 64}, target=">= 95%"),
    Check("arithmetic, dual + threshold 0.9, gen 64", "arithmetic", 200, {"gen_length": 64, **DUAL_09},
          target="within 2 points of one per step"),
    Check("arithmetic, guided by the tiny guider, gen 64", "arithmetic", 200,
          {"gen_length": 64, "unmask": "guided"}),
    Check("arithmetic, one per step, gen 512", "arithmetic", 30, {"gen_length": 512}, target=">= 90%"),
    Check("ends cleanly, dual + threshold 0.9, gen 128", "arithmetic", 100, {"gen_length": 128, **DUAL_09},
          measure="clean_end", target=">= 98%"),
    Check("ends cleanly, dual + threshold 0.9, gen 256", "arithmetic", 100, {"gen_length": 256, **DUAL_09},
          measure="clean_end", target=">= 98%"),
    Check("poker, temperature 0, threshold 0.1 (invalid)", "poker", 100, {"gen_length": 32, **THRESHOLD_01},
          measure="invalid", target=">= 80% invalid"),
    Check("poker, temperature 0, one per step", "poker", 100, {"gen_length": 32}, target="100%"),
    Check("poker, temperature 0, dual, one per step", "poker", 100, {"gen_length": 32, "block_size": 8,
                                                                     "cache": "dual"}),
    Check("poker, temperature 1, one per step", "poker", 100, {"gen_length": 32, "temperature": 1.0}),
    Check("poker, temperature 1, dual, one per step", "poker", 100, {"gen_length": 32, "block_size": 8,
                                                                     "cache": "dual", "temperature": 1.0}),
    Check("poker, temperature 0, self-verify, threshold 0.1", "poker", 100, {"gen_length": 32, **SELF_VERIFY_01},
          target=">= 98%"),
    Check("sums, temperature 0, one per step", "sums", 100, {"gen_length": 32}, target=">= 95%"),
    Check("sums, temperature 1, threshold 0.1 (invalid)", "sums", 100,
          {"gen_length": 32, "temperature": 1.0, **THRESHOLD_01}, measure="invalid"),
    Check("records, one per step", "records", 100, {"gen_length": 64}, target=">= 95%"),
    Check("guider alone, greedy, arithmetic", "arithmetic", 200, guider_alone=True, target=">= 95%"),
]


def command(check: Check, n: int, model: str, guider: str) -> str:
    if check.guider_alone:
        return f"python -m dllm_local eval --autoregressive --model {guider} --task {check.task} --n {n}"
    s = {"block_size": 32, **check.settings}
    parts = [f"python -m dllm_local eval --model {model} --task {check.task} --n {n} --trace off",
             f"--gen-length {s['gen_length']} --block-size {s['block_size']}"]
    if s.get("cache"):
        parts.append(f"--cache {s['cache']}")
    if s.get("unmask"):
        parts.append(f"--unmask {s['unmask']}")
    parts += [f"--unmask-param {k}={v}" for k, v in s.get("unmask_params", {}).items()]
    if s.get("temperature"):
        parts.append(f"--temperature {s['temperature']}")
    if s.get("unmask") == "guided":
        parts.append(f"--guider {guider}")
    return " ".join(parts)


def run_check(job: tuple[Check, int, str, str]) -> dict:
    import torch

    import dllm_local
    from dllm_local import Settings
    from dllm_local.experiments.evaluate import evaluate, evaluate_guider
    from dllm_local.models.loading.loader import load_guider

    check, n, model, guider = job
    torch.set_num_threads(1)
    start = time.perf_counter()
    if check.guider_alone:
        report = evaluate_guider(load_guider(guider, device="cpu"), check.task, n, 1000)
        report["nfe"] = float("nan")
    else:
        settings = Settings.from_dict({"block_size": 32, "trace": "off", **check.settings})
        judge = load_guider(guider, device="cpu") if settings.unmask_spec.needs_guider else None
        report = evaluate(dllm_local.load(model, device="cpu"), check.task, n, 1000, settings, judge)
    value = {"score": report["score"], "invalid": 1 - report["score"], "clean_end": report.get("clean_end")}[check.measure]
    return {"check": check, "n": n, "value": value, "score": report["score"], "nfe": report["nfe"],
            "seconds": time.perf_counter() - start}


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--guider", default="tiny-guider")
    ap.add_argument("--jobs", type=COUNT, default=2)
    ap.add_argument("--scale", type=SHARE, default=1.0, help="share of each row's problems to run")
    ap.add_argument("--only", nargs="*", default=None, help="rows whose name contains one of these words")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    checks = [c for c in CHECKS if not args.only or any(word in c.name for word in args.only)]
    jobs = [(c, max(1, round(c.n * args.scale)), args.model, args.guider) for c in checks]
    # The longest rows first, so the processes finish together.
    order = sorted(jobs, key=lambda j: -j[1] * j[0].settings.get("gen_length", 64) ** 1.5)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = {r["check"].name: r for r in pool.imap_unordered(run_check, order)}
    print(f"| check | n | result | target | NFE per answer |\n|---|---|---|---|---|")
    for check in checks:
        r = results[check.name]
        nfe = "" if r["nfe"] != r["nfe"] else f"{r['nfe']:.1f}"
        print(f"| {check.name} | {r['n']} | {r['value']:.1%} | {check.target} | {nfe} |")
    print("\nCommands:")
    for check, n, model, guider in jobs:
        print(f"  {check.name}: {command(check, n, model, guider)}")
    print(f"\n{sum(r['seconds'] for r in results.values()) / 60:.1f} CPU-minutes in {args.jobs} processes")


if __name__ == "__main__":
    main()
