"""Memory per request in a batch: its K/V slot, its logits and its softmax temporaries, against a
float64 softmax over the whole vocabulary as Fast-dLLM's generators take it.

    python bench/batch_memory.py [--batch 16] [--n 32]

The tiny model decodes the mixed-length workload of bench/continuous_batching.py (answers of 32 to
256 tokens, DualCache, threshold 0.9) continuously in ``--batch`` slots. For each request, at its
largest step (the first: nothing cached, every position computed): the K/V slot it holds (the
cache's tensors over its slots), its rows of the forward's logits (G x vocabulary in the logits'
dtype), and the softmax temporaries of ``dllm_local.softmax`` (row blocks of CHUNK_ELEMENTS: a
float64 copy and its softmax). Fast-dLLM casts the step's logits to float64 and takes the softmax
of all of them (``F.softmax(logits.to(torch.float64), dim=-1)``): a copy and a result of G x
vocabulary x 8 bytes each. The same counts follow for LLaDA-8B's shape (its config.json: vocabulary
126,464, 32 layers, 32 K/V heads of 128, bf16), at prompt 256 + answer 256. Sizes are counted from
the tensors' shapes and dtypes, not read from an allocator: the CPU's has no peak counter.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dllm_local.arguments import COUNT, SLOT_COUNT  # noqa: E402
import dllm_local  # noqa: E402
from continuous_batching import workload  # noqa: E402
from dllm_local.decoding.batch import BatchRun  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.models.loading.loader import ASSETS  # noqa: E402
from dllm_local.softmax import CHUNK_ELEMENTS  # noqa: E402

MB = 2**20
FLOAT64 = 8


def per_request(kv_bytes: int, g: int, vocab: int, logits_itemsize: int) -> dict:
    """One request's largest step: ours (K/V, logits rows, bounded float64 chunks) and Fast-dLLM's
    float64 softmax of the same logits (a float64 copy and its result)."""
    logits = g * vocab * logits_itemsize
    ours_softmax = 2 * min(g * vocab, max(CHUNK_ELEMENTS, vocab)) * FLOAT64
    theirs_softmax = 2 * g * vocab * FLOAT64
    return {"kv_mb": kv_bytes / MB, "logits_mb": logits / MB, "softmax_mb": ours_softmax / MB,
            "total_mb": (kv_bytes + logits + ours_softmax) / MB, "fast_dllm_softmax_mb": theirs_softmax / MB,
            "fast_dllm_total_mb": (kv_bytes + logits + theirs_softmax) / MB}


def tiny_rows(batch: int, n: int) -> list[dict]:
    handle = dllm_local.load("tiny")
    prompts, settings = workload(n)
    run = BatchRun(handle, prompts, settings, share_budget=False, slots=batch)
    cache_bytes = 0
    for _ in run:
        if run.cache is not None:
            cache_bytes = sum(t.numel() * t.element_size() for t in (*run.cache.k, *run.cache.v))
    per_slot = cache_bytes / batch  # the cache holds the batch's slots
    vocab = handle.model.get_input_embeddings().weight.shape[0]
    itemsize = handle.model.get_input_embeddings().weight.element_size()
    rows = [per_request(per_slot, max(step.g for step in r.trace.steps), vocab, itemsize) for r in run.results]
    return [{"model": f"tiny (batch {batch}, {n} requests)", **{k: max(row[k] for row in rows) for k in rows[0]}}]


def llada_8b_row(prompt: int = 256, gen: int = 256) -> dict:
    config = json.loads((ASSETS / "reference" / "llada-8b-instruct" / "config.json").read_text())
    head_dim = config["d_model"] // config["n_heads"]
    length = prompt + gen
    kv = 2 * config["n_layers"] * config["n_kv_heads"] * head_dim * length * 2  # K and V, bf16
    # bf16 logits as the model returns them (Fast-dLLM's, and ours on a GPU in bf16)
    return {"model": f"LLaDA-8B shape (prompt {prompt} + answer {gen})",
            **per_request(kv, length, config["embedding_size"], 2)}


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=SLOT_COUNT, default=16)
    ap.add_argument("--n", type=COUNT, default=32, help="requests of the tiny model's workload")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    rows = tiny_rows(args.batch, args.n) + [llada_8b_row()]
    b = args.batch
    print(f"machine: {machine_name()}; per request, at its largest step (MB); a batch of {b} at once (GB)")
    print(f"{'model':>42} | {'K/V':>7} | {'logits':>7} | {'softmax':>7} | {'total':>7} | {'Fast-dLLM softmax':>17} | "
          f"{'Fast-dLLM total':>15} | {f'batch {b}: ours':>13} | {'Fast-dLLM':>9}")
    for r in rows:
        # A batch: every request's K/V slot and logits rows; our softmax blocks one request at a
        # time (one block live), Fast-dLLM's over the whole batch's logits at once.
        ours = (b * (r["kv_mb"] + r["logits_mb"]) + r["softmax_mb"]) / 1024
        theirs = b * r["fast_dllm_total_mb"] / 1024
        print(f"{r['model']:>42} | {r['kv_mb']:>7.2f} | {r['logits_mb']:>7.2f} | {r['softmax_mb']:>7.2f} | "
              f"{r['total_mb']:>7.2f} | {r['fast_dllm_softmax_mb']:>17.2f} | {r['fast_dllm_total_mb']:>15.2f} | "
              f"{ours:>13.2f} | {theirs:>9.2f}")
    print(f"softmax: ours in row blocks of {CHUNK_ELEMENTS:,} values, a float64 copy and its softmax at a time, one "
          "request after another; Fast-dLLM's over every scored position of the batch at once")


if __name__ == "__main__":
    main()
