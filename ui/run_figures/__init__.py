"""The Run tab's figures, one module per family: ``confidence`` (the confidence heatmap),
``kv`` (KV cosine on the colour scale of ``cosine_scale``, its input changes and drift probes) and
``cache`` (G and hit rate), on the shared grid of ``axes``. Each is a pure function of the trace (trace dict in, plotly figure out)
and shows the answer region only (see ``ui.replay``)."""
from __future__ import annotations

from . import cache, confidence, kv
from .axes import axis_ticks
from .cache import cache_panel
from .confidence import confidence_heatmap
from .kv import SUMMARY_MESSAGE, kv_heatmap

__all__ = ["CAPTIONS", "SUMMARY_MESSAGE", "axis_ticks", "cache_panel", "confidence_heatmap", "kv_heatmap"]

CAPTIONS: dict[str, str] = {"confidence": confidence.CAPTION, "kv": kv.CAPTION, "cache": cache.CAPTION}
