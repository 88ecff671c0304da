"""The Run tab's figures, one module per family: ``confidence`` (the confidence heatmap),
``kv`` (KV cosine on the colour scale of ``cosine_scale``, its input changes and drift probes) and
``cache`` (G and hit rate), on the shared grid of ``axes``; a canvas model's trace gets ``canvas_entropy``'s and
``canvas_kv``'s under the same three names. Each is a pure function of the trace (trace dict in, plotly figure out)
and shows the answer region (a canvas's KV view the prompt too; see ``ui.replay``)."""
from __future__ import annotations

from . import cache, canvas_entropy, canvas_kv, confidence, kv
from .axes import axis_ticks
from .cache import cache_panel
from .confidence import confidence_heatmap
from .kv import SUMMARY_MESSAGE, kv_heatmap

__all__ = ["CANVAS_CAPTIONS", "CAPTIONS", "SUMMARY_MESSAGE", "axis_ticks", "cache_panel", "confidence_heatmap", "kv_heatmap"]

CAPTIONS: dict[str, str] = {"confidence": confidence.CAPTION, "kv": kv.CAPTION, "cache": cache.CAPTION}
# A canvas model's trace (DiffusionGemma) draws these figures of its own under the same names.
CANVAS_CAPTIONS: dict[str, str] = {"confidence": canvas_entropy.CAPTION, "kv": canvas_kv.KV_CAPTION,
                                   "cache": canvas_kv.CACHE_CAPTION}
