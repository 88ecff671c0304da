"""What a request will decode, from its settings as they will run: the answer positions of its
longest run. The lab's length limit holds this, never the field that usually carries it: a trace
imported without ``gen_length`` runs at the default length, and a canvas model's answer region is
whole canvases, however short the ``gen_length`` asked. Torch-free: the page process reads it."""
from __future__ import annotations

from .. import kinds
from ..settings import Settings


def answer_positions(settings: dict | Settings, model: dict) -> int:
    """The answer region of one run of ``settings`` (a dict is read as the engine reads it: its
    defaults filled in, every knob checked) on ``model``, the engine's info on the loaded model."""
    settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
    if kinds.of(model.get("kind")).canvas_steps:  # whole canvases, as the canvas run allocates them
        canvas = (settings.canvas_params or {}).get("canvas_length") or model.get("canvas_length") or 1
        return -(-settings.gen_length // canvas) * canvas
    return settings.gen_length
