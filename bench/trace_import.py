"""What reading a trace file through its schema costs: the time to check and parse full traces
of growing size (the page's Import trace), against the time to parse the same JSON alone.

    python bench/trace_import.py [--lengths 128,256,512] [--repeats 3]

Each trace is a real run of the tiny model (full trace, exact drift: the largest kind a run
writes), saved to a temporary file; the table gives the file's size and the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH_LIST  # noqa: E402

import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.trace import load_trace_file  # noqa: E402


def _median_s(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=LENGTH_LIST, default="128,256,512")
    ap.add_argument("--repeats", type=COUNT, default=3)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    model = dllm_local.load("tiny")
    print(f"machine: {machine_name()}")
    print(f"{'gen_length':>10} {'MB':>7} {'steps':>6} {'json s':>8} {'schema s':>9} {'schema/json':>12}")
    with tempfile.TemporaryDirectory() as folder:
        for length in args.lengths:
            settings = Settings(gen_length=length, block_size=32, cache="dual", trace="full", exact_drift=True)
            trace = dllm_local.generate(model, "Give two numbers whose sum is 9.", settings).trace
            path = Path(folder) / f"trace-{length}.json"
            path.write_text(trace.to_json())
            json_s = _median_s(lambda: json.loads(path.read_bytes()), args.repeats)
            whole_s = _median_s(lambda: load_trace_file(path), args.repeats)
            print(f"{length:>10} {path.stat().st_size / 2**20:>7.1f} {len(trace.steps):>6} {json_s:>8.3f} "
                  f"{whole_s:>9.3f} {whole_s / json_s:>12.2f}")


if __name__ == "__main__":
    main()
