"""Host syncs per decoding step, by cache x unmasking policy and depth, counted on the CPU.

    python bench/host_syncs.py [--layers 6,24] [--trace off]

Each sync (a value read back, a data-sized op such as ``nonzero`` or boolean indexing) makes a
GPU's host wait until the device has caught up; the count is the same calls on any device, so
it is counted here (``dllm_local.experiments.probes.HostSyncCounter``) on LLaDA-format random
checkpoints of each depth. A count that grows with the layers would be a sync inside the layer loop.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from dllm_local.arguments import COUNT_LIST  # noqa: E402
import dllm_local  # noqa: E402
from checkpoints import build_llada  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.experiments.probes import HostSyncCounter  # noqa: E402
from dllm_local.policies import registry  # noqa: E402


def step_syncs(handle, cache: str, unmask: str, trace: str) -> HostSyncCounter | None:
    """Syncs of the third step (the first two set the cache up); None when the pair needs a guider
    or cannot decode together."""
    spec = registry.get("unmask", unmask)
    if spec.needs_guider or registry.pair_problem(registry.get("cache", cache), spec):
        return None
    settings = Settings.from_dict({"gen_length": 64, "block_size": 32, "cache": cache, "unmask": unmask, "trace": trace})
    steps = iter(dllm_local.stream(handle, "What is 3 + 4?", settings))
    next(steps), next(steps)
    with HostSyncCounter() as syncs:
        next(steps)
    return syncs


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=COUNT_LIST, default="6,24", help="checkpoint depths to compare")
    ap.add_argument("--trace", default="off", choices=["off", "summary", "full"])
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(1)
    depths = args.layers
    handles = {n: dllm_local.load(str(build_llada(Path(tempfile.mkdtemp()), n_layers=n)), device="cpu") for n in depths}
    print(f"host syncs per step (gen 64, block 32, trace {args.trace}); per kind at {depths[-1]} layers")
    print(f"{'cache':>14} {'unmask':>12} " + " ".join(f"{n:>4}L" for n in depths) + "  kinds")
    for cache in registry.for_model("masked", registry.CACHE):
        for unmask in registry.UNMASK:
            counts = [step_syncs(handles[n], cache, unmask, args.trace) for n in depths]
            if counts[0] is None:
                continue
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts[-1].counts.items()))
            print(f"{cache:>14} {unmask:>12} " + " ".join(f"{c.total:>5}" for c in counts) + f"  {kinds}")


if __name__ == "__main__":
    main()
