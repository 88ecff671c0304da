"""Speed and trace overhead of this tree against an earlier revision, side by side in one run.

    python bench/before_after.py --base c502180 [--rounds 4] [--runs 3]
    python bench/before_after.py --modes [--runs 3]     # this tree: eager against compiled, one process

The earlier revision is checked out in a temporary git worktree. Each round runs one process per
tree (their order alternating, so a noisy machine slows both alike); each process loads the tiny
model, warms up, then times ``generate`` ``--runs`` times for every case, interleaved. The table
gives the median over rounds of each process's median, the ratio after/before, whether both trees
gave the same tokens, and each tree's trace overhead (summary and full against trace off).

``--modes`` compares the forward modes of this tree instead (``dllm_local/runner/modes.py``), in one
process, their runs interleaved: each case's first run (a compiled mode's compiling included, the
price a user pays once per shape), the median of the runs after it, and whether the tokens agree.
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
sys.path.insert(0, str(ROOT))
from dllm_local.arguments import COUNT  # noqa: E402
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


MODES = ("eager", "compiled")


def measure_modes(runs: int) -> None:
    """Print each case's first and steady run per forward mode, side by side."""
    import torch

    import dllm_local
    from dllm_local import Settings
    from dllm_local.tiny.tasks import make_problems

    torch.set_num_threads(1)
    handle = dllm_local.load("tiny")
    prompt = make_problems("arithmetic", 1, 1000)[0].prompt
    cases = {name: case for name, case in CASES.items() if case["trace"] != "full"}
    first: dict[tuple[str, str], float] = {}
    times: dict[tuple[str, str], list[float]] = {(c, m): [] for c in cases for m in MODES}
    tokens: dict[tuple[str, str], list[int]] = {}
    for r in range(runs + 1):
        for case, settings in cases.items():
            for mode in MODES:
                s = Settings.from_dict({"gen_length": 128, "block_size": 32, **settings, "forward_mode": mode})
                t = time.perf_counter()
                result = dllm_local.generate(handle, prompt, s)
                seconds = time.perf_counter() - t
                if r == 0:
                    first[case, mode], tokens[case, mode] = seconds, result.token_ids
                    if result.stats.forward_notice:
                        print(f"{case} {mode}: {result.stats.forward_notice}", file=sys.stderr)
                else:
                    times[case, mode].append(seconds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); tiny model, gen 128, block 32; "
          f"median of {runs} runs after the first")
    print(f"{'case':26} {'eager first s':>13} {'compiled first s':>16} {'eager s':>8} {'compiled s':>10} "
          f"{'compiled/eager':>14}  same tokens")
    for case in cases:
        e, c = (statistics.median(times[case, m]) for m in MODES)
        print(f"{case:26} {first[case, 'eager']:13.2f} {first[case, 'compiled']:16.2f} {e:8.3f} {c:10.3f} "
              f"{c / e:14.3f}  {tokens[case, 'eager'] == tokens[case, 'compiled']}")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the earlier revision (any git revision)")
    ap.add_argument("--modes", action="store_true", help="compare this tree's forward modes instead")
    ap.add_argument("--rounds", type=COUNT, default=4)
    ap.add_argument("--runs", type=COUNT, default=3)
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # a worker: measure the tree at this path
    return ap


def main() -> None:
    ap = build_parser()
    args = ap.parse_args()
    if args.measure:
        # The flags' types came from this tree's package: forget it, so the tree measured is --measure's.
        for name in [name for name in sys.modules if name.partition(".")[0] == "dllm_local"]:
            del sys.modules[name]
        sys.path.insert(0, args.measure)
        print(json.dumps(measure(args.runs)))
        return
    if args.modes:
        measure_modes(args.runs)
        return
    if not args.base:
        ap.error("--base REVISION, or --modes")
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
