"""The `drift_refresh` cache policy: DualCache that refreshes when the block's attention drifts."""
from __future__ import annotations

import pytest

import dllm_local
from dllm_local import Settings, SettingsError
from dllm_local.tiny.tasks import make_problems
from ui.parts.presets import load_presets

PROMPT = make_problems("arithmetic", 1, 7)[0].prompt
BASE = Settings(gen_length=64, block_size=16, unmask="threshold", unmask_params={"threshold": 0.9}, trace="full")


def _run(tiny, cache, **params):
    return dllm_local.generate(tiny, PROMPT, BASE.with_(cache=cache, cache_params=params))


def _shape(result):
    return result.token_ids, [(s.g, s.reads, s.full_refresh) for s in result.trace.steps]


def test_gamma_one_refreshes_every_step_like_no_cache(tiny):
    drift, none = _run(tiny, "drift_refresh", gamma=1.0), _run(tiny, "none")
    assert drift.token_ids == none.token_ids and drift.stats.nfe == none.stats.nfe
    assert all(s.full_refresh for s in drift.trace.steps)


def test_gamma_zero_is_dual_cache(tiny):
    assert _shape(_run(tiny, "drift_refresh", gamma=0.0)) == _shape(_run(tiny, "dual"))


def test_the_drift_decides_the_refresh_and_is_in_the_trace(tiny):
    one_per_step = BASE.with_(unmask="fixed", unmask_params={}, cache="drift_refresh", cache_params={"gamma": 0.99})
    steps = dllm_local.generate(tiny, PROMPT, one_per_step).trace.steps
    measured = [s for s in steps if s.policy["drift"] is not None]
    assert measured and all(0.0 <= s.policy["drift"] <= 1.0 + 1e-6 for s in measured)
    for before, after in zip(steps, steps[1:]):
        if after.step_in_block:  # inside a block: refreshed exactly when the step before said so
            assert after.full_refresh == (before.policy["drift"] is not None and before.policy["drift"] < 0.99)
    # The attention drifts as a block fills: some steps inside blocks refresh, most reuse.
    inside = [s for s in steps if s.step_in_block]
    refreshed = sum(s.full_refresh for s in inside)
    assert 0 < refreshed < len(inside) / 2


def test_the_kv_panel_marks_each_decision_next_to_its_drift(tiny):
    from ui import figures

    preset = next(p for p in load_presets()[0].values() if p["settings"]["cache"] == "drift_refresh")
    trace = dllm_local.generate(tiny, preset["prompt"], Settings.from_dict(preset["settings"])).trace.to_dict()
    probe = next(t for t in figures.kv_heatmap(trace, layer=3).data if t.name == "attention drift probe")
    measured = [(i, s["policy"]["drift"], s["policy"]["refresh_next"]) for i, s in enumerate(trace["steps"])
                if s["policy"].get("drift") is not None]
    assert list(probe.y) == [i for i, _, _ in measured]
    decided = [i for i, _, refresh in measured if refresh]
    assert decided, "the preset should show at least one drift-triggered refresh"
    for i in decided:  # a refresh decision is followed by a full-refresh row
        assert trace["steps"][i + 1]["full_refresh"]
        assert "the next step refreshes" in probe.hovertext[[j for j, _, _ in measured].index(i)]


def test_a_probe_layer_past_the_model_is_refused_not_clamped(tiny):
    """A probe layer of 999 was clamped to the last layer while the trace recorded 999."""
    with pytest.raises(SettingsError, match=r"probe_layer 999 is past this model's \d+ layers"):
        dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="drift_refresh",
                                                   cache_params={"probe_layer": 999}))
    first = dllm_local.generate(tiny, PROMPT, Settings(gen_length=32, block_size=16, cache="drift_refresh",
                                                       cache_params={"probe_layer": 0}))
    assert first.trace.settings["cache_params"] == {"probe_layer": 0}
