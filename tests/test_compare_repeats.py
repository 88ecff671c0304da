"""Speed that admits its noise: the repeat statistics (hand-computed), Compare's table and cards
over repeats, and the Compare tab on a real server: the preset's prompt, and Stop between repeats."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from test_page import OUT, _wait_done, browser, page, server  # noqa: F401 - the real page's fixtures
from ui import replay, tables
from ui.timing import NO_DIFFERENCE, REPEATS, speedup, spread, spread_text

TRACE_PATH = Path(__file__).parent / "data" / "trace_small.json"
STRAIGHT_HOUSE = "Teaching: straight house"

# Hand-computed: sorted A = 0.9 1.0 1.1 1.2 1.5 (median 1.1), B = 0.50 0.52 0.55 0.6 0.7 (median 0.55).
SLOW = [1.0, 1.2, 0.9, 1.1, 1.5]
FAST = [0.5, 0.6, 0.55, 0.7, 0.52]
NEAR = [0.8, 1.0, 0.95, 0.85, 0.9]  # median 0.9, range 0.8-1.0: touches SLOW's range (0.9-1.5)


def test_spread_is_the_median_and_the_range():
    assert spread(SLOW) == {"n": 5, "median": 1.1, "min": 0.9, "max": 1.5}
    assert spread([4.0, 1.0, 3.0, 2.0])["median"] == 2.5  # an even count: the mean of the middle two
    assert spread([]) == {"n": 0, "median": None, "min": None, "max": None}
    assert spread_text(spread(SLOW), ".3f", " s") == "1.100 s (0.900–1.500 s, 5 repeats)"
    assert spread_text(spread([0.25]), ".2f", " s") == "0.25 s (one run)"


def test_speedup_is_a_ratio_only_when_the_ranges_do_not_overlap():
    faster = speedup(SLOW, FAST)
    assert faster["verdict"] == "B faster" and not faster["overlap"]
    assert faster["ratio"] == pytest.approx(2.0)  # 1.1 / 0.55
    assert faster["low"] == pytest.approx(0.9 / 0.7) and faster["high"] == pytest.approx(3.0)  # 0.9/0.7, 1.5/0.5
    assert faster["text"] == "2.00× (range 1.29–3.00×)"

    slower = speedup(FAST, SLOW)
    assert slower["verdict"] == "B slower" and slower["ratio"] == pytest.approx(0.5)
    assert slower["text"] == "0.50× (range 0.33–0.78×)"  # 0.5/1.5, 0.7/0.9

    same = speedup(SLOW, NEAR)  # A's fastest, 0.9, equals B's slowest but one: the ranges share 0.9-1.0
    assert same["overlap"] and same["verdict"] == NO_DIFFERENCE
    assert same["ratio"] == pytest.approx(1.1 / 0.9)  # kept, but not claimed
    assert same["text"] == "no measurable difference (A 0.900–1.500 s, B 0.800–1.000 s)"
    touching = speedup([1.0, 2.0], [0.5, 1.0])
    assert touching["overlap"] and touching["verdict"] == NO_DIFFERENCE

    single = speedup([2.0], [1.0])
    assert single["verdict"] == "one run" and single["ratio"] == 2.0 and "no spread" in single["text"]
    assert speedup([], FAST)["verdict"] == "not measured"


def _repeats(trace: dict, walls: list[float], model_scale: float = 0.8) -> list[dict]:
    """Copies of ``trace`` that took ``walls`` seconds (model time ``model_scale`` of that)."""
    out = []
    for wall in walls:
        run = copy.deepcopy(trace)
        run["stats"].update(wall_s=wall, model_s=wall * model_scale,
                            content_tokens_per_s=run["stats"]["content_tokens"] / (wall * model_scale))
        out.append(run)
    return out


def test_compare_over_repeats_gives_medians_ranges_and_the_verdict():
    trace = json.loads(TRACE_PATH.read_text())
    runs_a, runs_b = _repeats(trace, SLOW), _repeats(trace, FAST)
    result = replay.compare(runs_a[-1], runs_b[-1], runs_a, runs_b)
    assert result["repeats_a"] == result["repeats_b"] == 5
    assert result["wall_s_a"] == pytest.approx(1.1) and result["wall_s_b"] == pytest.approx(0.55)
    assert result["timing_a"]["model_s"]["max"] == pytest.approx(1.2)
    assert result["speed_wall"]["verdict"] == result["speed_model"]["verdict"] == "B faster"
    assert result["speedup_wall"] == pytest.approx(2.0) and result["same_tokens_a"] and result["same_tokens_b"]
    table = tables.compare_html(result)
    assert "1.100 s (0.900–1.500 s, 5 repeats)" in table and "2.00× (range 1.29–3.00×)" in table
    assert "the same in every repeat of each side" in table

    near = _repeats(trace, NEAR)
    near[2]["final_ids"][0] += 1  # one repeat committed other tokens: said, not hidden
    result = replay.compare(runs_a[-1], near[-1], runs_a, near)
    assert not result["same_tokens_b"] and result["same_tokens_a"]
    table = tables.compare_html(result)
    assert "no measurable difference (A 0.900–1.500 s, B 0.800–1.000 s)" in table and "⚠ B committed different" in table
    assert "×" not in table.split("speedup of B (wall)")[1].split("</tr>")[0]  # no ratio where the ranges overlap


def test_the_headline_speed_says_one_run_or_shows_the_spread_over_repeats():
    trace = json.loads(TRACE_PATH.read_text())
    one_run = tables.numbers_html(replay.numbers(trace))
    assert "one run: timing varies run to run — Compare repeats" in one_run
    runs = _repeats(trace, SLOW, model_scale=1.0)
    timing = replay.compare(runs[0], runs[0], runs, runs)["timing_a"]
    cards = tables.numbers_html(replay.numbers(runs[0]), timing)
    speeds = sorted(trace["stats"]["content_tokens"] / wall for wall in SLOW)
    assert "one run" not in cards and f"median of 5 repeats, {speeds[0]:.1f}–{speeds[-1]:.1f}" in cards
    assert f">{speeds[2]:.1f}<" in cards  # the headline is the median
    assert ">1100<" in cards and "ms; median of 5 repeats, 900–1500" in cards  # model time in ms


# ---------------------------------------------------------------- the Compare tab on a real server

def test_browser_compare_runs_the_chosen_presets_prompt(page, tiny):  # noqa: F811
    """Both sides the straight house: the straight house's poker prompt runs, not the Run tab's
    arithmetic one (the stale state of issue 29)."""
    import dllm_local
    from dllm_local.settings import Settings
    from ui.presets import load_presets

    preset = load_presets()[0][STRAIGHT_HOUSE]
    run_prompt = page.input_value("#prompt textarea")
    assert run_prompt != preset["prompt"]
    page.get_by_role("tab", name="Compare").click()
    assert page.input_value("#cmp-prompt textarea") == run_prompt  # A is the Run tab's current settings
    for dropdown in ("#preset-a", "#preset-b"):
        page.click(f"{dropdown} input")
        page.locator(dropdown).get_by_role("option", name=STRAIGHT_HOUSE, exact=True).click()
    page.wait_for_function("(want) => document.querySelector('#cmp-prompt textarea').value === want",
                           arg=preset["prompt"])
    page.click("#cmp-btn")
    status = _wait_done(page, "#cmp-status", "Done.", timeout=300_000)
    assert f"{REPEATS} timed repeats of each side" in status
    expected = dllm_local.generate(tiny, preset["prompt"], Settings.from_dict(preset["settings"]))  # greedy: any seed
    table = page.inner_text("#cmp-table")
    assert table.count(expected.text) >= 2  # the answer row, both sides
    assert "the same in every repeat of each side" in table
    assert "one run" not in page.inner_text("#grid-a")  # the cards show the spread over the repeats
    assert f"median of {REPEATS} repeats" in page.inner_text("#grid-b")
    page.screenshot(path=str(OUT / "compare-repeats.png"), full_page=True)


def test_stop_between_repeats_ends_the_compare_and_says_so(server):  # noqa: F811
    from gradio_client import Client

    client = Client(server, verbose=False)
    job = client.submit(STRAIGHT_HOUSE, "LLaDA baseline", "gen_length=64, steps=64", "Ben has 9 coins, finds 8 "
                        "more, then gives away 9. How many now?", api_name="/compare")
    deadline = time.monotonic() + 600
    while not any("repeat 2 of 5, B" in str(o[-1]) for o in job.outputs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "Stopping" in client.predict(api_name="/compare_stop")
    final = job.result()
    status = final[-1]
    assert status.startswith("Stopped during B's repeat 2 of 5") and "Done" not in status
    assert "2 of A, 1 of B" in status  # the table covers the finished repeats, and says how many
    assert "one run" in final[2]  # B's single repeat has no spread: said in the verdict
