"""How close the K/V a cache reuses stay to exact, on the tiny model: the measurement behind the
"why caching works" preset.

    python bench/kv_exactness.py [--prompts arithmetic records poker] [--layers 1 2 3 4 5 mean]
                                 [--caches dual prefix] [--shapes 64/16 64/32 128/16 128/32] [--threads 1]

Each run decodes with the exact-drift diagnostic (a full uncached forward beside every step) and
the full trace, one token per step (the fixed schedule, steps = gen_length) and at threshold 0.9.
Per layer and K or V, the table gives the cache-vs-exact cosine of every entry the cache reused
(positions not recomputed at that step; a full refresh reuses nothing), pooled over the run, by
position kind: the prompt, answer positions decoded before the step, answer positions still
masked. The figures and the verdict are ``ui.lessons.verdicts.kv_reuse_verdict``'s, the page's own.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, Counts, LENGTH  # noqa: E402

import torch  # noqa: E402

import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from ui.lessons.verdicts import KINDS, kv_reuse_verdict  # noqa: E402

PROMPTS = {
    "arithmetic": "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?",
    "records": "Make a record from these facts. Leo lives in Oslo. Leo is 42 years old. Leo works as a pilot.",
    "poker": "Kate is playing cards. Name a poker hand Kate could hold.",
}
UNMASKS = {"one per step": {"unmask": "fixed"},
           "threshold 0.9": {"unmask": "threshold", "unmask_params": {"threshold": 0.9}}}


def kinds_cell(summary: dict, kind: str) -> str:
    s = summary.get(kind)
    return f"{s['mean']:.4f} / {s['min']:.4f} ({s['count']})" if s else "–"


def closer_than_masked(summary: dict) -> str:
    """Whether the prompt's and the decoded positions' mean cosines are both above the masked ones'."""
    if "masked" not in summary or not ({"prompt", "decoded"} & set(summary)):
        return "–"
    return "yes" if all(summary[k]["mean"] > summary["masked"]["mean"] for k in ("prompt", "decoded") if k in summary) else "no"


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    ap.add_argument("--layers", nargs="+", default=["1", "2", "3", "4", "5", "mean"])
    ap.add_argument("--caches", nargs="+", default=["dual", "prefix"])
    ap.add_argument("--shapes", type=Counts(LENGTH, sep="/", size=2), nargs="+",
                    default=[[64, 16], [64, 32], [128, 16], [128, 32]],
                    help="gen_length/block_size pairs")
    ap.add_argument("--threads", type=COUNT, default=1)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    handle = dllm_local.load("tiny")
    header = ["prompt", "decoding", "cache", "gen/block", "forwards", "layer", "K/V",
              *(f"{kind} mean / min (n)" for kind in KINDS), "verdict", "prompt, decoded > masked"]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for prompt_name in args.prompts:
        for decoding, unmask in UNMASKS.items():
            for cache in args.caches:
                for shape in args.shapes:
                    gen_length, block_size = shape
                    settings = Settings(gen_length=gen_length, block_size=block_size, cache=cache, trace="full",
                                        exact_drift=True, **unmask)
                    trace = dllm_local.generate(handle, PROMPTS[prompt_name], settings).trace.to_dict()
                    last = len(trace["steps"]) - 1
                    for layer in args.layers:
                        for which in ("k", "v"):
                            verdict = kv_reuse_verdict(trace, last, layer, which)
                            run = verdict.numbers.get("run", {})
                            row = [prompt_name, decoding, cache, f"{gen_length}/{block_size}", str(last + 1), layer, which.upper(),
                                   *(kinds_cell(run, kind) for kind in KINDS), verdict.status,
                                   closer_than_masked(run)]
                            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
