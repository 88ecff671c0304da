"""GPU check: per-step latency of the cache policies on a LLaDA-8B-shaped model with random weights.

    python bench/gpu_check.py                      # on a CUDA machine: bf16 and 4-bit, gen 256/512/1024
    python bench/gpu_check.py --tiny --device cpu  # a small shape on the CPU (exercises the code)

Needs nothing from the internet: the shape comes from assets/reference (LLaDA-8B-Instruct's
config.json) and the weights are random. For each generation length (prompt 256, block 32) it
times one representative decoding step of each policy (the middle block) and a full refresh,
and prints the roofline floor max(weight bytes / bandwidth, G x 2 params / FLOP rate) beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.experiments.costmodel import DEVICES, machine_name, measure_device, step_floor_s  # noqa: E402
from dllm_local.models.loader import ASSETS  # noqa: E402
from dllm_local.models import LLaDAConfig, LLaDAModelLM  # noqa: E402

REFERENCE = ASSETS / "reference" / "llada-8b-instruct" / "config.json"


def build(tiny: bool, device: torch.device, dtype: torch.dtype) -> LLaDAModelLM:
    raw = json.loads(REFERENCE.read_text())
    raw.pop("auto_map")
    if tiny:
        raw.update(d_model=256, n_heads=8, n_kv_heads=8, n_layers=4, mlp_hidden_size=768, vocab_size=4096,
                   embedding_size=4096, mask_token_id=4000, eos_token_id=1, pad_token_id=1)
    config = LLaDAConfig(**raw)
    with torch.device("meta"):
        model = LLaDAModelLM(config)
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def quantize_4bit(model: LLaDAModelLM) -> LLaDAModelLM:
    """Swap every block Linear for a bitsandbytes NF4 Linear4bit holding the same (random) weights."""
    import bitsandbytes as bnb

    for block in model.model.transformer.blocks:
        for name, child in list(block.named_children()):
            if isinstance(child, nn.Linear):
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=False,
                                      compute_dtype=torch.bfloat16, quant_type="nf4")
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
                q = q.to(child.weight.device)  # quantizes on the GPU
                setattr(block, name, q)
                del child
        torch.cuda.empty_cache()
    return model


def policy_positions(policy: str, prompt: int, gen: int, block: int) -> torch.Tensor:
    total = prompt + gen
    start = prompt + (gen // block // 2) * block  # the middle block: a representative step
    if policy in ("none", "refresh"):
        return torch.arange(total)
    if policy in ("prefix", "freecache"):
        return torch.arange(start, total)
    if policy == "dual":
        return torch.arange(start, start + block)
    raise ValueError(policy)


def time_step(model, ids, positions, cache, repeats: int, device: torch.device) -> float:
    times = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        model(ids[:, positions], positions, cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # warm-up
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile_for(device: torch.device, dtype: torch.dtype):
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        for key in ("H200", "H100", "A100", "RTX 4090", "RTX 3090", "L4"):
            if key.replace(" ", "").lower() in name.replace(" ", "").lower():
                return DEVICES[key]
    return measure_device(device, dtype)


@torch.inference_mode()
def check(model, label: str, lengths: list[int], prompt: int, block: int, repeats: int, device, profile) -> list[dict]:
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = model.get_memory_footprint()
    rows = []
    for gen in lengths:
        total = prompt + gen
        ids = torch.randint(0, model.config.vocab_size - 1, (1, total), device=device)
        cache = model.new_cache(1, total)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model(ids, torch.arange(total, device=device), cache)  # fill the cache
        for policy in ("refresh", "none", "prefix", "dual", "freecache"):
            positions = policy_positions(policy, prompt, gen, block).to(device)
            seconds = time_step(model, ids, positions, cache, repeats, device)
            floor = step_floor_s(weight_bytes, params, positions.numel(), profile)
            rows.append({"weights": label, "gen": gen, "policy": policy, "G": positions.numel(), "step_ms": seconds * 1e3,
                         "floor_ms": floor * 1e3, "of_floor": floor / seconds,
                         "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None})
        del cache
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a small shape (for a CPU smoke run)")
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-4bit", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = [int(x) for x in args.lengths.split(",")]
    profile = profile_for(device, dtype)
    t0 = time.perf_counter()
    model = build(args.tiny, device, dtype)
    print(f"machine: {machine_name()} | roofline: {profile.name} ({profile.bandwidth / 1e12:.3g} TB/s, "
          f"{profile.flops / 1e12:.3g} TFLOP/s) | model built in {time.perf_counter() - t0:.1f}s", flush=True)
    rows = check(model, str(dtype).replace("torch.", ""), lengths, args.prompt, args.block, args.repeats, device, profile)
    if device.type == "cuda" and not args.skip_4bit:
        rows += check(quantize_4bit(model), "nf4", lengths, args.prompt, args.block, args.repeats, device, profile)
    head = f"{'weights':>8} {'gen':>5} {'policy':>9} {'G':>5} {'step ms':>9} {'floor ms':>9} {'floor/step':>10} {'peak GB':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.1f}"
        print(f"{r['weights']:>8} {r['gen']:>5} {r['policy']:>9} {r['G']:>5} {r['step_ms']:>9.2f} {r['floor_ms']:>9.3f} "
              f"{r['of_floor']:>10.2f} {peak:>8}")
    print(f"total {time.perf_counter() - t0:.0f}s; 'refresh' is the full forward at a block start, the others one "
          f"step in the middle block")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
