"""Forward time against the size of the recompute set (the position-indexed cache's payoff).

    python bench/forward.py [--seq-len 512] [--repeats 20]

A small random model in the LLaDA format with LLaDA-8B's proportions (head dim 128, MLP 3x the
width); the cache holds all positions and each forward recomputes 1, 32 or all of them. Prints
medians, the ratio to the full forward and the share of the full forward's arithmetic that the
recompute set needs (n / seq_len): what is left above it is the weight read every forward pays
(about the 1-position time) and thin matrix products running below the CPU's peak.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.models import LLaDAConfig, LLaDAModelLM  # noqa: E402
from dllm_local.tiny_checkpoints.train import REFERENCE_CONFIG  # noqa: E402


@torch.no_grad()
def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=LENGTH, default=512)
    ap.add_argument("--repeats", type=COUNT, default=20)
    ap.add_argument("--d-model", type=COUNT, default=1024)
    ap.add_argument("--layers", type=COUNT, default=4)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    raw = json.loads(REFERENCE_CONFIG.read_text())
    raw.pop("auto_map")
    heads = max(1, args.d_model // 128)
    raw.update(d_model=args.d_model, n_heads=heads, n_kv_heads=heads, n_layers=args.layers,
               mlp_hidden_size=args.d_model * 3, vocab_size=4096, embedding_size=4096, mask_token_id=4095,
               eos_token_id=4094, pad_token_id=4094, max_sequence_length=args.seq_len)
    torch.manual_seed(0)
    model = LLaDAModelLM(LLaDAConfig(**raw)).eval()
    L = args.seq_len
    ids = torch.randint(0, 4000, (1, L))
    cache = model.new_cache(1, L)
    model(ids, torch.arange(L), cache)
    rows = []
    for n in (1, 32, L):
        positions = torch.arange(L // 2, L // 2 + n) if n < L else torch.arange(L)
        times = []
        for _ in range(args.repeats + 2):
            t = time.perf_counter()
            model(ids[:, positions], positions, cache)
            times.append(time.perf_counter() - t)
        rows.append((n, statistics.median(times[2:]) * 1e3))
    full = rows[-1][1]
    params = sum(p.numel() for p in model.parameters())
    print(f"machine: {machine_name()}; model: LLaDA format, {params / 1e6:.1f}M parameters, sequence {L}")
    print(f"{'recomputed positions':>22} | {'median ms':>10} | {'vs all':>7} | {'arithmetic share':>16}")
    for n, ms in rows:
        print(f"{n:>22} | {ms:>10.2f} | {ms / full:>7.3f} | {n / L:>16.3f}")


if __name__ == "__main__":
    main()
