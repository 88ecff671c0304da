"""The same sweep in this process and on a local Ray instance with two workers, side by side in one
run: wall time end to end (model loading and Ray's start-up included), decoding time, and what a
unit costs on the Ray path beyond its decoding (handing it out, the answer's way back).

    python bench/cluster_sweep.py [--n 40] [--workers 2] [--chunk 4]

A benchmark, not a test: the figures are this machine's at this moment (its name and load are
printed with them). On a 2-core machine the two Ray workers share the cores with the driver and
Ray's own processes; the point is the overhead, not a speed-up.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT  # noqa: E402

from dllm_local.experiments.cluster import Cluster, ClusterRunner, connect  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.experiments.sweep import run_sweep, sweep_job  # noqa: E402
from dllm_local.experiments.units import LocalRunner, Results, Worker  # noqa: E402
from dllm_local.models.loading.loader import apply_threads, load  # noqa: E402
from dllm_local.settings import Settings  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=COUNT, default=40)
    ap.add_argument("--workers", type=COUNT, default=2)
    ap.add_argument("--chunk", type=COUNT, default=4)
    ap.add_argument("--task", default="arithmetic")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    base = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold")
    job = sweep_job(base, {"threshold": [0.5, 0.7, 0.9], "block_size": [16, 32]}, args.task, args.n)

    start = time.perf_counter()
    handle = load("tiny", device="cpu")
    apply_threads(None, handle)
    loaded = time.perf_counter()
    local = Results(job)
    run_sweep(job, LocalRunner(Worker(job, handle, None)), local, chunk=args.chunk)
    local_end = time.perf_counter()

    start_ray = time.perf_counter()
    connect(Cluster("local"))
    connected = time.perf_counter()
    runner = ClusterRunner(Cluster("local", workers=args.workers))
    remote = Results(job)
    run_sweep(job, runner, remote, chunk=args.chunk)
    ray_end = time.perf_counter()

    same = all(local.records[k]["token_ids"] == remote.records[k]["token_ids"] for k in local.records)
    units = len(runner.unit_seconds)
    overhead = [trip - decoding for trip, decoding in runner.unit_seconds]
    print(f"machine: {machine_name()} | load {os.getloadavg()[0]:.2f} | {job.total} problems "
          f"({len(job.points)} points x {args.n}), {units} units of {args.chunk}")
    print(f"{'run':<28} {'wall s':>8} {'start-up s':>11} {'decoding s':>11} {'problems/s':>11}")
    local_decode = local_end - loaded
    ray_decode = ray_end - connected - runner.ready_s
    print(f"{'this process':<28} {local_end - start:>8.1f} {loaded - start:>11.1f} {local_decode:>11.1f} "
          f"{job.total / local_decode:>11.1f}")
    print(f"{f'Ray, {args.workers} workers (local)':<28} {ray_end - start_ray:>8.1f} "
          f"{connected - start_ray + runner.ready_s:>11.1f} {ray_decode:>11.1f} {job.total / ray_decode:>11.1f}")
    print(f"Ray start-up: {connected - start_ray:.1f} s to start the instance, {runner.ready_s:.1f} s until every "
          "worker had loaded the model")
    print(f"per-unit overhead of the Ray path (hand-out to answer, less the worker's decoding): median "
          f"{statistics.median(overhead) * 1e3:.1f} ms, max {max(overhead) * 1e3:.1f} ms (the first unit of each "
          "worker includes its warm-up answer)")
    print(f"answers equal, problem for problem: {'yes' if same and len(local.records) == len(remote.records) else 'NO'}")


if __name__ == "__main__":
    main()
