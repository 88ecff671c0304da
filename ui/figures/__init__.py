"""The Run tab's figures, one module per family: ``confidence`` (the confidence heatmap), ``kv`` (KV
cosine on the colour scale of ``cosine_scale``, its input changes and drift probes) and ``cache`` (G
and hit rate), on the shared grid of ``axes``; a canvas model's trace gets ``canvas_entropy``'s and
``canvas_kv``'s under the same three names. Each is a pure function of the trace (trace dict in,
plotly figure out) and shows the answer region (a canvas's KV view the prompt too; see
``ui.parts.replay``); a block-diffusion run's KV view draws its stored blocks exact (``stored``),
and a mixture of experts' steps list their routed experts (``experts``). May import ``ui.block``,
``ui.canvas`` and ``ui.parts``, dllm_local's torch-free leaves, gradio and plotly; never torch."""
from __future__ import annotations

from ..block.parts import is_block_model
from ..canvas.parts import is_canvas_model
from . import cache, canvas_entropy, canvas_kv, confidence, kv
from .axes import axis_ticks
from .cache import cache_panel
from .confidence import confidence_heatmap
from .experts import experts_html
from .kv import SUMMARY_MESSAGE, VIEW_NAMES as KV_VIEW_NAMES, kv_heatmap

__all__ = ["BLOCK_CAPTIONS", "CANVAS_CAPTIONS", "CAPTIONS", "KV_VIEW_NAMES", "SUMMARY_MESSAGE", "axis_ticks",
           "cache_panel", "captions_for", "confidence_heatmap", "experts_html", "kv_heatmap"]

CAPTIONS: dict[str, str] = {"confidence": confidence.CAPTION, "kv": kv.CAPTION, "cache": cache.CAPTION}
# A canvas model's trace (DiffusionGemma) draws these figures of its own under the same names.
CANVAS_CAPTIONS: dict[str, str] = {"confidence": canvas_entropy.CAPTION, "kv": canvas_kv.KV_CAPTION,
                                   "cache": canvas_kv.CACHE_CAPTION}
# A block-diffusion model's: its KV view says what its stored blocks are.
BLOCK_CAPTIONS: dict[str, str] = {**CAPTIONS, "kv": kv.BLOCK_CAPTION}


def captions_for(model: dict) -> dict[str, str]:
    """The figures' captions for the kind of ``model`` (the engine's info on it)."""
    return CANVAS_CAPTIONS if is_canvas_model(model) else BLOCK_CAPTIONS if is_block_model(model) else CAPTIONS
