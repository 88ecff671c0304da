"""The `drift_refresh` cache policy: DualCache that refreshes when the block's attention drifts."""
from __future__ import annotations

import dllm_local
from dllm_local import Settings
from dllm_local.tiny.tasks import make_problems

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
