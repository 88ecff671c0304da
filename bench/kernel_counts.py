"""Kernels per transformer layer of one model forward, eager and compiled by inductor, counted on the CPU.

    python bench/kernel_counts.py [--layers 2,4]

On a GPU each eager op costs some 15-20 µs of host time to launch, so at small batches a forward
takes its kernel count times that. The eager count (``dllm_local.experiments.kernels``: the ops
dispatched that launch a kernel) is what a GPU would launch: these ops dispatch alike on every
device. The compiled count is the launches in the code ``torch.compile`` (inductor) generates: on
the CPU C++ kernels, on CUDA Triton kernels, from the same fusion of pointwise ops (one C++ kernel
may run several loops that Triton would launch as a kernel each: CUDA's count may be a few more). Two
LLaDA-format random checkpoints of different depths split each count into kernels per layer and
the fixed rest (embedding, final norm, head, the forward's prologue). Float32, inference mode.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from dllm_local.arguments import COUNT, Counts  # noqa: E402
import dllm_local  # noqa: E402
from checkpoints import build_llada  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.experiments.kernels import count_compiled_kernels, count_eager_kernels, kernels_per_layer  # noqa: E402

SEQ_LEN = 96
STEP = slice(32, 64)  # the dual cache's step: one block of 32 positions recomputed over the cached rest


def full_forward(model: torch.nn.Module) -> Callable[[], Any]:
    """A forward of all ``SEQ_LEN`` positions, no cache."""
    ids = torch.arange(SEQ_LEN)[None]
    return lambda: model(ids)


def dual_step(model: torch.nn.Module) -> Callable[[], Any]:
    """A cached forward of the ``STEP`` block over a cache of ``SEQ_LEN`` positions, filled first
    by a cached forward of them all (as the dual cache's refresh does)."""
    ids, positions = torch.arange(SEQ_LEN)[None], torch.arange(SEQ_LEN)
    cache = model.new_cache(1, SEQ_LEN).alloc(SEQ_LEN)
    model(ids, positions, cache)
    return lambda: model(ids[:, STEP], positions[STEP], cache)


FORWARDS = {"full": full_forward, "dual step": dual_step}


def load_float32(directory: Path, n_layers: int) -> torch.nn.Module:
    """A random LLaDA-format model of ``n_layers``, written to ``directory``, in float32 (the
    checkpoint is bf16 and the loader may keep it so)."""
    return dllm_local.load(str(build_llada(directory, n_layers=n_layers)), device="cpu").model.float()


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=Counts(COUNT, size=2), default="2,4", help="the two checkpoint depths")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    shallow, deep = args.layers
    models = {n: load_float32(Path(tempfile.mkdtemp()), n) for n in (shallow, deep)}
    print(f"torch {torch.__version__}, {machine_name()}")
    print(f"kernels per forward of a LLaDA layer stack, split by depths {shallow} and {deep}; float32")
    print(f"{'forward':>10} {'eager/layer':>12} {'eager fixed':>12} {'compiled/layer':>15} {'compiled fixed':>15}")
    with torch.inference_mode():
        for name, build in FORWARDS.items():
            calls = {n: build(model) for n, model in models.items()}
            eager, compiled = (kernels_per_layer(count(calls[shallow]), shallow, count(calls[deep]), deep)
                               for count in (count_eager_kernels, count_compiled_kernels))
            print(f"{name:>10} {eager.per_layer:>12g} {eager.fixed:>12g} "
                  f"{compiled.per_layer:>15g} {compiled.fixed:>15g}")


if __name__ == "__main__":
    main()
