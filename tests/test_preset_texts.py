"""A preset's name and description say what to look for, never what a run measured: every number
in them is one of the preset's own settings (a figure written by hand goes stale, issue 29)."""
from __future__ import annotations

import re

import pytest

from ui.parts.presets import load_presets

PRESETS, _ = load_presets()
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
# Numbers that are names or notation, not values: the theorem's name, its bound, the token-only layer, a release.
STRUCTURAL = ("Theorem 1", "(n + 1)", "≤ 1", "layer 0", "LLaDA 2.1")


def setting_values(value) -> set[float]:
    """Every number among a preset's settings, its policies' parameters and its view, at any depth
    (numbers written as text too, as a view's layer is)."""
    if isinstance(value, dict):
        return set().union(*map(setting_values, value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*map(setting_values, value)) if value else set()
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, (int, float)):
        return {float(value)}
    return {float(n) for n in NUMBER.findall(str(value))}


def foreign_numbers(preset: dict) -> list[str]:
    """The numbers in the preset's name and description that are none of its settings."""
    allowed = setting_values([preset["settings"], preset.get("view", {})])
    text = f"{preset['name']}\n{preset.get('description', '')}"
    for phrase in STRUCTURAL:
        text = text.replace(phrase, " ")
    return [n for n in NUMBER.findall(text) if float(n) not in allowed]


def test_the_check_catches_a_measured_figure_and_passes_settings():
    preset = {"name": "p", "settings": {"block_size": 16, "unmask_params": {"threshold": 0.9}},
              "view": {"layer": "2"}}
    assert foreign_numbers({**preset, "description": "threshold 0.90, block 16, layer 2, Theorem 1"}) == []
    assert foreign_numbers({**preset, "description": "7 forwards, hit rate 34% at threshold 0.9"}) == ["7", "34"]
    assert foreign_numbers({**preset, "description": "ε = 0.58"}) == ["0.58"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_no_preset_text_states_a_figure_that_is_not_a_setting(name):
    assert foreign_numbers(PRESETS[name]) == [], f"{name}: numbers that are not its settings"
