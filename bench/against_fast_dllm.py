"""The project's sampler against a generator in the shape of Fast-dLLM's ``generate_with_dual_cache``:
the same model, the same forwards, side by side in one run.

    python bench/against_fast_dllm.py [--runs 15] [--gen-length 128] [--block-size 32] [--threads 1]

The reference loop below is written here after Fast-dLLM's published algorithm (its dual cache
with the confidence threshold): per block, one forward over the whole sequence fills the cache
and commits; then forwards over the block alone, reading the cache, until the block has no
masks. Like Fast-dLLM's, it takes the confidence from a float64 softmax of every position the
forward scored and picks the commits with top-k then a Python loop over the threshold. Its
model calls are the project's own (the tiny model's forward with our KV cache), so the two
columns differ only in what happens around the model. Both must give the same tokens: the bench
checks it. Runs are interleaved (reference, trace default, trace off, ...) so a noisy machine
slows each alike; the table gives medians and the median of per-round ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH, SHARE  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.prompts import encode_prompt  # noqa: E402
from dllm_local.tiny.tasks import make_problems  # noqa: E402


def transfer_index(logits, mask_index, x, threshold):
    """Fast-dLLM's threshold rule at temperature 0: the most confident masked position always,
    the others at or above ``threshold``."""
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    count = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select = torch.topk(confidence[j], k=int(count[j]))
        transfer[j, select] = True
        for k in range(1, int(count[j])):
            if confidence[j, select[k]] < threshold:
                transfer[j, select[k]] = False
    return x0, transfer


@torch.inference_mode()
def dual_cache_generate(handle, prompt_ids: list[int], gen_length: int, block_size: int, threshold: float):
    model, mask_id = handle.model, handle.mask_id
    P = len(prompt_ids)
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt_ids)
    everything = torch.arange(x.shape[1])
    nfe = 0
    for block in range(gen_length // block_size):
        start, end = P + block * block_size, P + (block + 1) * block_size
        cache = model.new_cache(1, x.shape[1])
        cache.seq_len = x.shape[1]
        logits = model(x, everything, cache, sequence=x).logits  # the whole sequence: the cache refreshed
        nfe += 1
        mask_index = x == mask_id
        mask_index[:, end:] = False
        x0, transfer = transfer_index(logits, mask_index, x, threshold)
        x[transfer] = x0[transfer]
        block_positions = torch.arange(start, end)
        while (x[:, start:end] == mask_id).any():
            logits = model(x[:, start:end], block_positions, cache, sequence=x).logits  # the block alone
            nfe += 1
            mask_index = x[:, start:end] == mask_id
            x0, transfer = transfer_index(logits, mask_index, x[:, start:end], threshold)
            x[:, start:end][transfer] = x0[transfer]
    return x[0, P:].tolist(), nfe


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=COUNT, default=15)
    ap.add_argument("--gen-length", type=LENGTH, default=128)
    ap.add_argument("--block-size", type=LENGTH, default=32)
    ap.add_argument("--threshold", type=SHARE, default=0.9)
    ap.add_argument("--threads", type=COUNT, default=1)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    handle = dllm_local.load("tiny", device="cpu")
    prompt = make_problems("arithmetic", 1, 1000)[0].prompt
    prompt_ids = encode_prompt(handle, prompt)
    base = Settings(gen_length=args.gen_length, block_size=args.block_size, cache="dual", unmask="threshold",
                    unmask_params={"threshold": args.threshold})
    columns = {
        "fast-dllm shape": lambda: dual_cache_generate(handle, prompt_ids, args.gen_length, args.block_size, args.threshold),
        f"dllm-local, trace {base.trace}": lambda: _ours(handle, prompt, base),
        "dllm-local, trace off": lambda: _ours(handle, prompt, base.with_(trace="off")),
    }
    outputs = {name: run() for name, run in columns.items()}  # warm-up, and the tokens to compare
    reference, nfe = outputs["fast-dllm shape"]
    for name, (tokens, forwards) in list(outputs.items())[1:]:
        if tokens != reference or forwards != nfe:
            sys.exit(f"{name} decodes otherwise than the reference loop ({forwards} vs {nfe} forwards): not comparable")
    wall: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(args.runs):
        for name, run in columns.items():
            t = time.perf_counter()
            run()
            wall[name].append(time.perf_counter() - t)
    ref = wall["fast-dllm shape"]
    print(f"machine: {machine_name()}; tiny model, dual + threshold {args.threshold:g}, gen {args.gen_length}, "
          f"block {args.block_size}, {args.threads} thread(s), {nfe} forwards per answer, same tokens; "
          f"{args.runs} interleaved runs")
    print(f"{'generator':<26} {'median ms':>10} {'speed vs fast-dllm shape (median of per-round ratios)':>55}")
    for name in columns:
        ratio = statistics.median(r / w for r, w in zip(ref, wall[name]))
        print(f"{name:<26} {statistics.median(wall[name]) * 1e3:>10.2f} {ratio:>55.3f}x")


def _ours(handle, prompt: str, settings: Settings) -> tuple[list[int], int]:
    result = dllm_local.generate(handle, prompt, settings)
    return result.token_ids, result.stats.nfe


if __name__ == "__main__":
    main()
