"""How a forward runs: eager, compiled, or compiled with CUDA graphs.

- ``eager``: the model's Python forward, op by op. Every op costs the host ~15-20 µs on a GPU, which
  is most of a small step's time there (``docs/performance.md``).
- ``compiled``: ``torch.compile(fullgraph=True)``: the forward is one graph (the model reads nothing
  back from the device), inductor fuses its pointwise ops (norms, rotary, residuals) into a few
  kernels. The first shape compiles a graph for it; a second length of the same forward compiles one
  generic in that length (dynamo's automatic dynamic shapes), which every later length reuses: a new
  prompt length costs no compile after the first few.
- ``graphs``: the compiled forward replayed as a CUDA graph (inductor's ``reduce-overhead``): the
  host issues one launch per forward instead of one per kernel. The KV cache is marked as a static
  address, so a graph writes the cache in place instead of copying it.
- ``auto``: graphs on a CUDA GPU, eager elsewhere (on a CPU, compiling costs more than a run of the
  tiny model gains: ``bench/before_after.py --modes``).
"""
from __future__ import annotations

from typing import Callable

import torch

MODES = ("auto", "eager", "compiled", "graphs")


def resolve_mode(mode: str, device: torch.device) -> str:
    """The mode ``auto`` stands for on ``device``; a named mode as it is."""
    if mode not in MODES:
        raise ValueError(f"forward mode {mode!r}: one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    return "graphs" if device.type == "cuda" else "eager"


def compile_forward(forward: Callable, mode: str, backend: str | Callable | None = None) -> Callable:
    """``forward`` compiled as one graph; with CUDA graphs for ``graphs``. ``backend``: inductor
    unless named (tests check the graph with ``aot_eager``, which compiles in seconds)."""
    options = {"mode": "reduce-overhead"} if mode == "graphs" and backend in (None, "inductor") else {}
    return torch.compile(forward, fullgraph=True, backend=backend or "inductor", **options)


def graph_skips() -> int:
    """How many times inductor declined to capture a CUDA graph so far (a CPU input, a mutated
    input not marked static, ...): each one a compiled forward that replays without a graph."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]
