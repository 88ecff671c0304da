"""Packed against invariant batching (app.py --batch-mode) on the same prompts, side by side in one run.

    python bench/batch_invariance.py [--n 24] [--batch 8] [--rounds 2] [--threads 1] [--model tiny] [--device cpu]

The tiny model's tasks with mixed answer lengths (bench/continuous_batching.py's workload: DualCache,
threshold 0.9, block 32, each problem its own seed). Each problem is first decoded alone (its
tokens the reference); then, rounds alternated, as one continuous batch of ``--batch`` slots packed
(one forward for every request a step), as static batches packed, and as one continuous batch
invariant (each request's own forward, the call it makes alone). Prints answer tokens per second
of each (answer positions decoded over wall time, the median round), the invariant mode's against
packed continuous, the forwards each ran, and how many problems each gave the same tokens as alone:
on the CPU in float32 all of them in every mode; on a GPU in bf16 packed batching may not (the
kernels follow the packed shape), invariant always does (bench/gpu_fast_path.py counts it there).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dllm_local.arguments import COUNT, LENGTH_LIST, SLOT_COUNT  # noqa: E402
import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.models.loading.loader import ModelHandle  # noqa: E402
from dllm_local.models.loading.placement import apply_threads  # noqa: E402
from continuous_batching import LENGTHS, decode, workload  # noqa: E402

# The schedules compared: (batch mode, continuous).
SCHEDULES = {"packed continuous": ("packed", True), "packed static": ("packed", False),
             "invariant": ("invariant", True)}


def compare(handle: ModelHandle, prompts: list[str], settings: list[Settings], batch: int, rounds: int = 1) -> dict:
    """Each schedule's answer tokens per second (the median of ``rounds``, alternated), forwards, and
    problems with the same tokens as alone; ``invariant_x_packed``: invariant's tokens/s over packed
    continuous's (its cost: below 1 is slower)."""
    alone = [dllm_local.generate(handle, p, s).token_ids for p, s in zip(prompts, settings)]
    times: dict[str, list[float]] = {name: [] for name in SCHEDULES}
    tokens, forwards = {}, {}
    for _ in range(rounds):
        for name, (mode, continuous) in SCHEDULES.items():
            start = time.perf_counter()
            tokens[name], forwards[name] = decode(handle, prompts, settings, batch, continuous, mode)
            times[name].append(time.perf_counter() - start)
    answer = sum(len(t) for t in alone)
    rows = [{"schedule": name, "tokens_per_s": answer / statistics.median(times[name]), "forwards": forwards[name],
             "same_as_alone": sum(a == b for a, b in zip(tokens[name], alone)), "n": len(prompts)}
            for name in SCHEDULES]
    by_name = {r["schedule"]: r for r in rows}
    return {"batch": batch, "rows": rows,
            "invariant_x_packed": by_name["invariant"]["tokens_per_s"] / by_name["packed continuous"]["tokens_per_s"]}


def print_comparison(result: dict) -> None:
    print(f"{'schedule':<17} | {'answer tokens/s':>15} | {'forwards':>8} | same tokens as alone")
    for r in result["rows"]:
        print(f"{r['schedule']:<17} | {r['tokens_per_s']:>15.1f} | {r['forwards']:>8} | "
              f"{r['same_as_alone']} of {r['n']}")
    print(f"invariant / packed continuous tokens/s: {result['invariant_x_packed']:.2f} (batch {result['batch']})")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=COUNT, default=24, help="problems in the workload")
    ap.add_argument("--batch", type=SLOT_COUNT, default=8, help="slots of each batch")
    ap.add_argument("--rounds", type=COUNT, default=2, help="timed rounds of each schedule, alternated")
    ap.add_argument("--lengths", type=LENGTH_LIST, default=",".join(map(str, LENGTHS)), help="answer lengths drawn from")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=COUNT, default=None,
                    help="torch threads (default: every core; on a CPU shared with other work, 1 keeps the "
                         "OpenMP team from stalling at its barriers)")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    handle = dllm_local.load(args.model, device=args.device)
    apply_threads(args.threads, handle, batched=True)
    lengths = tuple(args.lengths)
    prompts, settings = workload(args.n, lengths=lengths)
    decode(handle, prompts[:4], settings[:4], 4, True)  # first-call costs out of the timings
    mix = ", ".join(f"{sum(s.gen_length == length for s in settings)} x {length}" for length in lengths)
    print(f"machine: {machine_name()} | {handle.name} on {handle.device}, {handle.summary()['dtype']} | {args.n} "
          f"problems, answer lengths {mix} | median of {args.rounds} rounds")
    print_comparison(compare(handle, prompts, settings, args.batch, args.rounds))


if __name__ == "__main__":
    main()
