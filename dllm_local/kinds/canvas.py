"""Canvas diffusion (DiffusionGemma): a canvas of tokens refined as a whole, no mask token, its
block the whole answer; ``CanvasRun``'s loop, one request at a time."""
from __future__ import annotations

from .masked import MASKED
from .spec import ModelKind, register

CANVAS = register(ModelKind(
    name="canvas", label="canvas", run="dllm_local.canvas.run:CanvasRun", whole_answer_block=True, has_mask=False, canvas_steps=True,
    knobs=("canvas_params",),
    masked_tools_refusal="{what} works on masked-diffusion models (LLaDA, Dream, the tiny model); {name} is a "
                         "canvas model (DiffusionGemma), with its own sampler: decode it with generate or eval, one "
                         "request at a time, and set its knobs (--entropy-bound, --t-max, ...)",
    policies=MASKED.name, cache_refusal=MASKED.cache_refusal))  # its run takes none; the page lists these
