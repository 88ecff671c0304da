"""What the trace costs: wall time per answer at each trace level against trace off.

    python bench/trace_overhead.py [--runs 15] [--gen-length 128] [--threads 1]

Runs are interleaved (off, summary, full, off, ...) so that a noisy machine slows every level
alike; the table gives medians and each level's median ratio to trace off in the same round.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH  # noqa: E402

import torch  # noqa: E402

import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.tiny.tasks import make_problems  # noqa: E402

LEVELS = ("off", "summary", "full")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=COUNT, default=15)
    ap.add_argument("--gen-length", type=LENGTH, default=128)
    ap.add_argument("--threads", type=COUNT, default=1)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    handle = dllm_local.load("tiny")
    prompt = make_problems("arithmetic", 1, 1000)[0].prompt
    base = Settings(gen_length=args.gen_length, block_size=32, cache="dual", unmask="threshold",
                    unmask_params={"threshold": 0.9})
    for level in LEVELS:  # warm-up
        dllm_local.generate(handle, prompt, base.with_(trace=level))
    wall: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(args.runs):
        for level in LEVELS:
            t = time.perf_counter()
            result = dllm_local.generate(handle, prompt, base.with_(trace=level))
            wall[level].append(time.perf_counter() - t)
    off = wall["off"]
    print(f"machine: {machine_name()}; tiny model, dual + threshold 0.9, "
          f"gen {args.gen_length}, {result.stats.nfe} forwards per answer; {args.runs} interleaved runs")
    print(f"{'trace':<8} {'median ms':>10} {'vs off (median of per-round ratios)':>38}")
    for level in LEVELS:
        ratio = statistics.median(w / o for w, o in zip(wall[level], off))
        print(f"{level:<8} {statistics.median(wall[level]) * 1e3:>10.2f} {ratio:>38.3f}")


if __name__ == "__main__":
    main()
