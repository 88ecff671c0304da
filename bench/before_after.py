"""Speed and trace overhead of this tree against an earlier revision, side by side in one run.

    python bench/before_after.py --base c502180 [--rounds 4] [--runs 3]

The earlier revision is checked out in a temporary git worktree. Each round runs one process per
tree (their order alternating, so a noisy machine slows both alike); each process loads the tiny
model, warms up, then times ``generate`` ``--runs`` times for every case, interleaved. The table
gives the median over rounds of each process's median, the ratio after/before, whether both trees
gave the same tokens, and each tree's trace overhead (summary and full against trace off).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name: settings (gen 128, block 32)
    "dual+threshold off": {"cache": "dual", "unmask": "threshold", "trace": "off"},
    "dual+threshold summary": {"cache": "dual", "unmask": "threshold", "trace": "summary"},
    "dual+threshold full": {"cache": "dual", "unmask": "threshold", "trace": "full"},
    "none+fixed off": {"cache": "none", "unmask": "fixed", "trace": "off"},
    "adaptive+self_verify off": {"cache": "adaptive", "unmask": "self_verify", "trace": "off"},
}


def measure(runs: int) -> dict:
    """In the tree this process imports: each case's median seconds and its tokens."""
    import torch

    import dllm_local
    from dllm_local import Settings
    from dllm_local.tiny.tasks import make_problems

    torch.set_num_threads(1)
    handle = dllm_local.load("tiny")
    prompt = make_problems("arithmetic", 1, 1000)[0].prompt
    settings = {name: Settings.from_dict({"gen_length": 128, "block_size": 32, **case}) for name, case in CASES.items()}
    for s in settings.values():
        dllm_local.generate(handle, prompt, s)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    tokens = {}
    for _ in range(runs):
        for name, s in settings.items():
            t = time.perf_counter()
            tokens[name] = dllm_local.generate(handle, prompt, s).token_ids
            times[name].append(time.perf_counter() - t)
    return {"seconds": {name: statistics.median(t) for name, t in times.items()}, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the earlier revision (any git revision)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # a worker: measure the tree at this path
    args = ap.parse_args()
    if args.measure:
        sys.path.insert(0, args.measure)
        print(json.dumps(measure(args.runs)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            trees = {f"before ({args.base})": base, "after (this tree)": ROOT}
            results: dict[str, list[dict]] = {name: [] for name in trees}
            for r in range(args.rounds):
                for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                    out = subprocess.run([sys.executable, __file__, "--base", args.base, "--runs", str(args.runs),
                                          "--measure", str(trees[name])], capture_output=True, text=True,
                                         cwd=trees[name], check=True)
                    results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    before, after = (results[name] for name in trees)

    def median(rows: list[dict], case: str) -> float:
        return statistics.median(row["seconds"][case] for row in rows)

    print(f"{'case':26} {'before s':>9} {'after s':>9} {'after/before':>13}  same tokens")
    for case in CASES:
        b, a = median(before, case), median(after, case)
        print(f"{case:26} {b:9.3f} {a:9.3f} {a / b:13.3f}  {before[0]['tokens'][case] == after[0]['tokens'][case]}")
    for name, rows in zip(trees, (before, after)):
        off = median(rows, "dual+threshold off")
        print(f"{name}: trace overhead summary {median(rows, 'dual+threshold summary') / off:.3f}, "
              f"full {median(rows, 'dual+threshold full') / off:.3f}")


if __name__ == "__main__":
    main()
