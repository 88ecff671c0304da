"""The cost model's concurrency curves against the dLLM cost write-up's teaching example.

The write-up (手算一次账, 再看多条请求并发): a 7B model (1.4e10 bytes of bf16 weights, 2N = 1.4e10
FLOPs per position) on an H100 SXM5 (3.352 TB/s, 989.4 TFLOPS), block diffusion with G = 32 and
τ = 4. "扩散在约 9 条并发时就把算力用满（9×32=288 个位置），此后封顶在 8,834 tok/s，正好是 AR
封顶值 70,671 的 1/8 ... 约 37 条并发时 AR 追平，之后 AR 更快。"
"""
from __future__ import annotations

import math

import pytest

from dllm_local.devices import DEVICES
from dllm_local.analysis.costmodel import (CONCURRENCY_MODELS, TARGET_MODELS, TEACHING_EXAMPLE, TEACHING_MODEL,
                                           concurrency_crossovers, concurrency_curve)

H100 = DEVICES["H100"]
B_ALL = list(range(1, 1025))


def _teaching(**change) -> tuple:
    g, tau = change.get("g", TEACHING_EXAMPLE.g), change.get("tau", TEACHING_EXAMPLE.tau)
    return TEACHING_MODEL, DEVICES[change.get("device", TEACHING_EXAMPLE.device)], g, tau


def test_the_teaching_example_is_the_write_ups():
    assert (TEACHING_MODEL.weight_bytes, TEACHING_MODEL.params) == (1.4e10, 7e9)
    assert (TEACHING_EXAMPLE.model, TEACHING_EXAMPLE.device, TEACHING_EXAMPLE.g, TEACHING_EXAMPLE.tau) == (
        TEACHING_MODEL, "H100", 32, 4)
    assert (H100.bandwidth, H100.flops) == (3.352e12, 989.4e12)
    # The page offers the teaching model first, then the real models.
    assert list(CONCURRENCY_MODELS) == [TEACHING_MODEL.name, *TARGET_MODELS]


def test_diffusion_saturates_at_about_9_and_ar_overtakes_at_about_37_on_an_h100():
    c = concurrency_crossovers(*_teaching())
    assert round(c["diffusion_saturates"]) == 9 and c["diffusion_saturates"] == pytest.approx(295.17 / 32, abs=0.01)
    assert round(c["ar_overtakes"]) == 37 and c["ar_overtakes"] == pytest.approx(295.17 * 4 / 32, abs=0.01)
    assert c["ar_saturates"] == pytest.approx(295.17, abs=0.01)
    # "9×32=288 个位置": 9 requests still fit under the crossover, 10 do not.
    assert 9 * 32 < c["crossover_positions"] < 10 * 32


def test_the_curve_matches_the_write_ups_own_script():
    # The write-up's lines, as it prints them: "并发 b 时 AR、扩散的 tok/s".
    W = 1.4e10 / 3.352e12 * 1e3
    C = 1.4e10 / 989.4e12 * 1e3

    def step(n):
        return max(W, n * C)

    rows = {r["concurrency"]: r for r in concurrency_curve(*_teaching(), [1, 8, 64, 295, 1024])}
    for b in (1, 8, 64, 295):
        assert rows[b]["ar_tokens_per_s"] == pytest.approx(b / step(b) * 1e3)
        assert rows[b]["diffusion_tokens_per_s"] == pytest.approx(4 * b / step(32 * b) * 1e3)
        assert rows[b]["ar_step_ms"] == pytest.approx(step(b)) and rows[b]["diffusion_step_ms"] == pytest.approx(step(32 * b))
    # "此后封顶在 8,834 tok/s，正好是 AR 封顶值 70,671 的 1/8".
    assert round(rows[64]["diffusion_tokens_per_s"]) == 8834 and round(rows[1024]["ar_tokens_per_s"]) == 70671
    assert rows[1024]["speedup"] == pytest.approx(4 / 32)
    # One request: both wait for the weight read (4.18 ms), diffusion commits τ = 4 tokens in it.
    assert rows[1]["speedup"] == pytest.approx(4) and rows[1]["diffusion_ms_per_token"] == pytest.approx(W / 4)
    assert rows[1]["ar_ms_per_token"] == pytest.approx(W)


def test_diffusion_rises_until_it_saturates_then_stays_flat():
    c = concurrency_crossovers(*_teaching())
    rows = concurrency_curve(*_teaching(), B_ALL)
    below = [r for r in rows if r["concurrency"] <= c["diffusion_saturates"]]
    above = [r for r in rows if r["concurrency"] > c["diffusion_saturates"]]
    assert [r["concurrency"] for r in below] == list(range(1, 10))
    assert all(r["diffusion_bound"] == "bandwidth" for r in below) and all(r["diffusion_bound"] == "compute" for r in above)
    one = below[0]["diffusion_tokens_per_s"]
    assert all(r["diffusion_tokens_per_s"] == pytest.approx(r["concurrency"] * one) for r in below)  # linear in B
    cap = above[0]["diffusion_tokens_per_s"]
    assert cap > below[-1]["diffusion_tokens_per_s"]
    assert all(r["diffusion_tokens_per_s"] == pytest.approx(cap) for r in above)  # flat: more requests, no more tokens
    # Flat throughput means each request waits longer: its latency per token grows with B.
    latency = [r["diffusion_ms_per_token"] for r in above]
    assert latency == sorted(latency) and latency[-1] > 10 * latency[0]


def test_ar_rises_linearly_until_its_own_saturation_and_crosses_diffusion_at_the_crossover():
    c = concurrency_crossovers(*_teaching())
    rows = concurrency_curve(*_teaching(), B_ALL)
    one = rows[0]["ar_tokens_per_s"]
    for r in rows:
        if r["concurrency"] <= c["ar_saturates"]:
            assert r["ar_bound"] == "bandwidth" and r["ar_tokens_per_s"] == pytest.approx(r["concurrency"] * one)
        else:
            assert r["ar_bound"] == "compute" and r["ar_tokens_per_s"] == pytest.approx(rows[-1]["ar_tokens_per_s"])
    behind = [r["concurrency"] for r in rows if r["ar_tokens_per_s"] < r["diffusion_tokens_per_s"]]
    ahead = [r["concurrency"] for r in rows if r["ar_tokens_per_s"] > r["diffusion_tokens_per_s"]]
    assert behind == list(range(1, 37)) and ahead == list(range(37, 1025))
    assert max(behind) < c["ar_overtakes"] < min(ahead)
    # At the crossover itself the two throughputs meet.
    at = concurrency_curve(*_teaching(), [c["ar_overtakes"]])[0]
    assert at["ar_tokens_per_s"] == pytest.approx(at["diffusion_tokens_per_s"])


@pytest.mark.parametrize("g, tau", [(32, 8), (64, 4), (16, 2), (128, 3)])
def test_the_crossovers_move_with_tau_and_g(g, tau):
    base = concurrency_crossovers(*_teaching())
    moved = concurrency_crossovers(*_teaching(g=g, tau=tau))
    # Saturation depends on G alone; AR's overtaking point scales with τ / G.
    assert moved["diffusion_saturates"] == pytest.approx(base["diffusion_saturates"] * 32 / g)
    assert moved["ar_overtakes"] == pytest.approx(base["ar_overtakes"] * (tau / 4) * (32 / g))
    assert moved["ar_saturates"] == pytest.approx(base["ar_saturates"])
    # And the curves really cross there.
    x = moved["ar_overtakes"]
    before, at, after = concurrency_curve(*_teaching(g=g, tau=tau), [0.9 * x, x, 1.1 * x])
    assert before["ar_tokens_per_s"] < before["diffusion_tokens_per_s"]
    assert at["ar_tokens_per_s"] == pytest.approx(at["diffusion_tokens_per_s"])
    assert after["ar_tokens_per_s"] > after["diffusion_tokens_per_s"]


def test_doubling_tau_doubles_where_ar_overtakes_and_leaves_saturation():
    base, doubled = concurrency_crossovers(*_teaching()), concurrency_crossovers(*_teaching(tau=8))
    assert doubled["ar_overtakes"] == pytest.approx(2 * base["ar_overtakes"])
    assert round(doubled["ar_overtakes"]) == 74
    assert doubled["diffusion_saturates"] == pytest.approx(base["diffusion_saturates"])


def test_the_gpu_sets_the_crossovers_through_its_flop_to_byte_ratio():
    for name, device in DEVICES.items():
        c = concurrency_crossovers(*_teaching(device=name))
        # 2 bytes per parameter: the crossover is the device's FLOP rate over its bandwidth.
        assert c["ar_saturates"] == pytest.approx(device.flops / device.bandwidth), name
        assert c["ar_overtakes"] == pytest.approx(device.flops / device.bandwidth * 4 / 32), name


def test_no_overtaking_when_tau_reaches_g_and_always_ahead_when_tau_is_at_most_one():
    never = concurrency_crossovers(*_teaching(g=8, tau=8))
    assert math.isinf(never["ar_overtakes"])
    rows = concurrency_curve(*_teaching(g=8, tau=8), B_ALL)
    assert all(r["ar_tokens_per_s"] <= r["diffusion_tokens_per_s"] * (1 + 1e-12) for r in rows)
    always = concurrency_crossovers(*_teaching(g=32, tau=0.5))
    assert always["ar_overtakes"] == 0.0
    rows = concurrency_curve(*_teaching(g=32, tau=0.5), B_ALL)
    assert all(r["ar_tokens_per_s"] > r["diffusion_tokens_per_s"] for r in rows)


@pytest.mark.parametrize("g, tau", [(0.5, 4), (32, 0), (32, -1), (math.nan, 4), (32, math.inf)])
def test_impossible_g_or_tau_is_refused(g, tau):
    with pytest.raises(ValueError, match="G|τ"):
        concurrency_crossovers(TEACHING_MODEL, H100, g, tau)
    with pytest.raises(ValueError, match="G|τ"):
        concurrency_curve(TEACHING_MODEL, H100, g, tau, [1])


@pytest.mark.parametrize("g, tau, message", [
    (1e308, 4.0, "G (positions recomputed per forward) must be from 1 to 1,000,000, not 1e+308"),
    (32.0, 1e308, "τ (tokens committed per forward) must be above 0 and at most 10,000, not 1e+308"),
    (float("nan"), 4.0, "G (positions recomputed per forward) must be from 1 to 1,000,000, not nan"),
])
def test_the_concurrency_view_answers_any_number_with_a_message(g, tau, message):
    """Called directly (an API client), G = 1e308 passed the check and ended in a math domain error."""
    from ui.tune.tab import show_concurrency

    plot, line = show_concurrency("H100", "LLaDA-8B-Instruct", g, tau)
    assert line == f"⚠ {message}"
