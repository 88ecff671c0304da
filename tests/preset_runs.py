"""Real runs of the embedded tiny model with a preset's prompt and settings, run once per test
session and shared by the tests that read the grid and the heatmaps of those runs."""
from __future__ import annotations

from functools import cache

import dllm_local
from dllm_local import Settings
from ui.parts.presets import load_presets

PRESETS, _ = load_presets()


@cache
def _tiny():
    return dllm_local.load("tiny")


@cache
def preset_trace(word: str, exact_drift: bool = False) -> dict:
    """The trace dict of the preset whose name holds ``word`` (case-insensitive), run on the tiny
    model; with ``exact_drift``, its settings measure the exact K/V too."""
    name = next(name for name in PRESETS if word.lower() in name.lower())
    preset = PRESETS[name]
    settings = {**preset["settings"], **({"exact_drift": True} if exact_drift else {})}
    return dllm_local.generate(_tiny(), preset["prompt"], Settings.from_dict(settings)).trace.to_dict()
