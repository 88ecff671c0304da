"""The plots on the screen they are shown on (``figure_style.on_screen``): the font scale reaches
every text of a real run's figures, and on the dark theme every text that was dark turns light on
a dark ground, at 4.5:1 or better, while the data's colours stay."""
from __future__ import annotations

import pytest

import dllm_local
from dllm_local import Settings
from ui import figures as run_figures
from ui.parts.figure_style import COLOUR_BAR_SCALE, _luminance, on_screen


@pytest.fixture(scope="module")
def figures(tiny):
    trace = dllm_local.generate(tiny, "Give two numbers whose sum is 9.",
                                Settings.from_dict({"gen_length": 32, "block_size": 8, "steps": 16, "cache": "dual",
                                                    "unmask": "fixed", "trace": "full"})).trace.to_dict()
    return [run_figures.confidence_heatmap(trace), run_figures.kv_heatmap(trace, layer="mean", which="v"),
            run_figures.cache_panel(trace)]


def fonts(node, key=""):
    """Every (key, font dict) in a figure's JSON."""
    if isinstance(node, dict):
        if key.endswith("font") and "size" in node:
            yield key, node
        for k, v in node.items():
            yield from fonts(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from fonts(v, key)


def contrast(a: str, b: str) -> float:
    la, lb = _luminance(a), _luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def test_the_font_scale_reaches_every_text(figures):
    """Every text 1.5× larger, but a colour bar's: its labels grow to ``COLOUR_BAR_SCALE`` at most
    (long ones, "≥ 0.9999 same", would leave the heatmap a strip of a narrow panel)."""
    def sizes(fig) -> list[float]:
        spec = fig.to_plotly_json()
        bars = [t.pop("colorbar", None) or (t.get("marker") or {}).pop("colorbar", None) or {} for t in spec["data"]]
        return [font["size"] for _, font in fonts(spec)], [font["size"] for _, font in fonts(bars)]

    for fig in figures:
        (before, _), (after, bar) = sizes(fig), sizes(on_screen(fig, 1.5))
        assert before and len(after) == len(before)
        assert sorted(after) == pytest.approx(sorted(1.5 * size for size in before))
        assert all(size == pytest.approx(14 * COLOUR_BAR_SCALE) for size in bar)
        assert on_screen(fig, 1.0) is fig  # nothing to do, nothing copied


def test_the_dark_theme_is_readable_and_keeps_the_data(figures):
    for fig in figures:
        dark = on_screen(fig, 1.0, "dark").to_plotly_json()
        ground = dark["layout"]["paper_bgcolor"]
        assert _luminance(ground) < 0.05
        for key, font in fonts(dark):
            if isinstance(font.get("color"), str) and key != "insidetextfont":
                assert contrast(font["color"], ground) >= 4.5, (key, font)
        assert [t.get("z") is not None for t in dark["data"]] == [getattr(t, "z", None) is not None for t in fig.data]
        assert [getattr(t, "colorscale", None) for t in on_screen(fig, 1.0, "dark").data] == \
            [getattr(t, "colorscale", None) for t in fig.data]
