"""The model kind a trace or the engine's model info names, as the page's views read it: its
``ModelKind`` (``dllm_local.kinds``), whose facts pick the views; its name is never compared."""
from __future__ import annotations

from dllm_local import kinds
from dllm_local.kinds import ModelKind


def model_kind(model: dict) -> ModelKind:
    """The kind of ``model`` (the engine's info on the loaded model, or a trace's ``model``): one
    that names none (an older trace), or a kind this version does not know, is a masked model's."""
    return kinds.of(model.get("kind"))
