"""The numbers card's cache hit rate and the recomputation verdict's share of G come from one
computation on the steps, rounded once: a hit rate of 0.65499 is 65% beside "35% of that", not the
66% of the stats' 4-place value (0.655) rounded again."""
from __future__ import annotations

from ui.lessons.verdicts import cache_saves_verdict
from ui.parts.replay import numbers

STATS = {"nfe": 1, "tokens_per_forward": 1.0, "content_tokens_per_forward": 1.0, "content_tokens": 1, "model_s": 1.0,
         "other_s": 0.0, "exact_s": 0.0, "tokens_per_s": 1.0, "content_tokens_per_s": 1.0, "wall_s": 1.0,
         "mean_g": 34501.0, "cache_hit_rate": 0.655}  # the recorder's round(0.65499, 4)


def test_a_finished_runs_hit_rate_and_the_verdicts_share_add_up_to_the_whole():
    trace = {"steps": [{"g": 34501, "reads": 65499, "committed": [], "forwards": 1}], "stats": STATS,
             "final_ids": [1], "prompt_ids": [0] * 36, "gen_length": 99964, "settings": {"cache": "dual"}}
    shown = numbers(trace)
    assert f"{shown['hit_rate']:.0%}" == "65%"
    assert cache_saves_verdict(trace).detail.endswith("35% of that")
