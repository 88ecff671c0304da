"""Speed that admits its noise: the repeat statistics (hand-computed), Compare's table and cards
over repeats, and the Compare tab on a real server: its repeat count, B at A's length, the
preset's prompt, and Stop between repeats (the rank test itself: test_compare_rank_test.py). On
that server too: true refused at every numeric input of every endpoint (issue 61)."""
from __future__ import annotations

import copy
import json
import re
import urllib.request
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from test_compare_like_with_like import answer_tokens
from test_page import OUT, _wait_done, browser, page, server  # noqa: F401 - the real page's fixtures
from ui.parts import replay
from ui.parts import tables
from ui.parts.presets import CURRENT_RUN
from ui.compare.comparison import compare, compare_html
from ui.parts.timing import NO_DIFFERENCE, REPEATS, speedup, spread, spread_text

TRACE_PATH = Path(__file__).parent / "data" / "trace_small.json"
STRAIGHT_HOUSE = "Teaching: straight house"
DEFAULT = "Fast-dLLM DualCache (paper default)"  # the Run tab's settings on first load: Compare's A

# Hand-computed: sorted A = 0.9 1.0 1.1 1.2 1.5 (median 1.1), B = 0.50 0.52 0.55 0.6 0.7 (median 0.55).
SLOW = [1.0, 1.2, 0.9, 1.1, 1.5]
FAST = [0.5, 0.6, 0.55, 0.7, 0.52]
NEAR = [0.8, 1.0, 0.95, 0.85, 0.9]  # median 0.9, range 0.8-1.0: 5 of SLOW's 25 pairs out of order (ties half)


def test_spread_is_the_median_and_the_range():
    assert spread(SLOW) == {"n": 5, "median": 1.1, "min": 0.9, "max": 1.5}
    assert spread([4.0, 1.0, 3.0, 2.0])["median"] == 2.5  # an even count: the mean of the middle two
    assert spread([]) == {"n": 0, "median": None, "min": None, "max": None}
    assert spread_text(spread(SLOW), ".3f", " s") == "1.100 s (0.900–1.500 s, 5 repeats)"
    assert spread_text(spread([0.25]), ".2f", " s") == "0.25 s (one run)"


def test_speedup_is_the_ratio_of_medians_with_the_rank_tests_verdict():
    faster = speedup(SLOW, FAST)  # every A slower than every B: p = 2 / C(10, 5)
    assert faster["verdict"] == "B faster" and faster["ratio"] == pytest.approx(2.0)  # 1.1 / 0.55
    assert faster["p"] == pytest.approx(2 / 252)
    assert faster["text"] == "2.00× faster (median 0.550 s vs A's 1.100 s, 5 runs each; rank test p = 0.008)"

    slower = speedup(FAST, SLOW)
    assert slower["verdict"] == "B slower" and slower["ratio"] == pytest.approx(0.5)
    assert slower["text"] == "2.00× slower (median 1.100 s vs A's 0.550 s, 5 runs each; rank test p = 0.008)"

    same = speedup(SLOW, NEAR)  # medians 1.1 and 0.9, but 5 of the 25 pairs are out of order
    assert same["verdict"] == NO_DIFFERENCE and same["ratio"] == pytest.approx(1.1 / 0.9)  # kept, not claimed
    assert same["p"] == pytest.approx(16 / 252)  # 16 of the 252 splits of the ten times lie as far out
    assert same["text"] == (f"{NO_DIFFERENCE} (median 0.900 s vs A's 1.100 s, 5 runs each, ratio 1.22×; "
                            "rank test p = 0.063, not below 0.05)")

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
    result = compare(runs_a[-1], runs_b[-1], runs_a, runs_b)
    assert result["repeats_a"] == result["repeats_b"] == 5
    assert result["wall_s_a"] == pytest.approx(1.1) and result["wall_s_b"] == pytest.approx(0.55)
    assert result["timing_a"]["model_s"]["max"] == pytest.approx(1.2)
    assert result["speed_wall"]["verdict"] == result["speed_model"]["verdict"] == "B faster"
    assert result["speedup_wall"] == pytest.approx(2.0) and result["same_tokens_a"] and result["same_tokens_b"]
    table = compare_html(result)
    assert "1.100 s (0.900–1.500 s, 5 repeats)" in table and "2.00× faster (median 0.550 s vs A&#x27;s" in table
    assert "the same in every repeat of each side" in table

    near = _repeats(trace, NEAR)
    near[2]["final_ids"][0] += 1  # one repeat committed other tokens: said, not hidden
    result = compare(runs_a[-1], near[-1], runs_a, near)
    assert not result["same_tokens_b"] and result["same_tokens_a"]
    table = compare_html(result)
    assert "⚠ B committed different" in table
    wall = table.split("speedup of B (wall)")[1].split("</tr>")[0]
    assert NO_DIFFERENCE in wall and "p = 0.063, not below 0.05" in wall and "faster" not in wall


def test_the_headline_speed_says_one_run_or_shows_the_spread_over_repeats():
    trace = json.loads(TRACE_PATH.read_text())
    one_run = tables.numbers_html(replay.numbers(trace))
    assert "one run: timing varies run to run — Compare repeats" in one_run
    runs = _repeats(trace, SLOW, model_scale=1.0)
    timing = compare(runs[0], runs[0], runs, runs)["timing_a"]
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
    from ui.parts.presets import load_presets

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
    assert page.input_value("#cmp-repeats input[type=number]") == str(REPEATS)
    page.locator("#cmp-repeats input[type=range]").fill("3")  # the repeat count is the user's
    page.wait_for_function("() => document.querySelector('#cmp-repeats input[type=number]').value === '3'")
    page.click("#cmp-btn")
    status = _wait_done(page, "#cmp-status", "Done.", timeout=300_000)
    assert "3 timed repeats of each side" in status and "B runs at" not in status  # one length: nothing moved
    expected = dllm_local.generate(tiny, preset["prompt"], Settings.from_dict(preset["settings"]))  # greedy: any seed
    table = page.inner_text("#cmp-table")
    assert table.count(expected.text) >= 2  # the answer row, both sides
    assert "the same in every repeat of each side" in table
    assert "one run" not in page.inner_text("#grid-a")  # the cards show the spread over the repeats
    assert "median of 3 repeats" in page.inner_text("#grid-b") and "3 runs each" in table
    page.screenshot(path=str(OUT / "compare-repeats.png"), full_page=True)


def test_stop_between_repeats_ends_the_compare_and_says_so(server):  # noqa: F811
    from gradio_client import Client

    client = Client(server, verbose=False)
    job = client.submit(STRAIGHT_HOUSE, "LLaDA baseline", "steps=32", "Ben has 9 coins, finds 8 "
                        "more, then gives away 9. How many now?", api_name="/compare")  # B at A's 32, a step each
    deadline = time.monotonic() + 600
    while not any("repeat 2 of 5, B" in str(o[-1]) for o in job.outputs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "Stopping" in client.predict(api_name="/compare_stop")
    final = job.result()
    status = final[-1]
    # The Stop meets the repeat going when it arrives: B's second, or (on a loaded machine) a later one.
    ended = re.match(r"Stopped (during|before) (A|B)'s repeat (\d) of 5", status)
    assert ended and "Done" not in status, status
    side, repeat = ended[2], int(ended[3])
    assert repeat > 2 or (repeat, side) == (2, "B"), status
    finished_a, finished_b = (repeat if side == "B" else repeat - 1), repeat - 1
    assert f"({finished_a} of A, {finished_b} of B)" in status  # the table covers the finished repeats, and says how many
    if finished_b == 1:
        assert "one run" in final[2]  # B's single repeat has no spread: said in the verdict


def test_the_default_pair_runs_b_at_a_length_and_compares_the_answers(server, tiny):  # noqa: F811
    """Current settings (128 positions) against the LLaDA baseline (64): once "token agreement
    50.0%", "first difference: answer position 64" and a speed ratio across the two lengths."""
    from gradio_client import Client

    import dllm_local
    from dllm_local.settings import Settings
    from ui.parts.presets import load_presets

    presets = load_presets()[0]
    prompt = presets[DEFAULT]["prompt"]
    # B's fixed schedule of 32 steps is slow at 128 on the tiny model: threshold decoding keeps the test short
    job = Client(server, verbose=False).submit(CURRENT_RUN, "LLaDA baseline", "unmask=threshold", prompt, 2,
                                               api_name="/compare")
    *_, table, status = job.result(timeout=600)
    assert status.startswith("Done. 2 timed repeats of each side") and "generation length 128" in status
    assert "B runs at A's generation length 128 (its own length is 64; steps 32 → 64, the same tokens per step)" in status
    assert "<td>generation length</td><td>128</td><td>128</td>" in table
    assert "cannot tell from 2 runs each" in table  # the chosen count reached the verdict
    b = dict(presets["LLaDA baseline"]["settings"], gen_length=128, steps=64, unmask="threshold", unmask_params={})
    answers = [answer_tokens(dllm_local.generate(tiny, prompt, Settings.from_dict(s)).trace.to_dict())  # greedy: any seed
               for s in (presets[DEFAULT]["settings"], b)]
    compared = max(map(len, answers))
    agreement = sum(x == y for x, y in zip(*answers)) / compared
    assert f"{agreement:.1%} of the {compared} answer positions up to the end of text" in table
    if answers[0] == answers[1]:
        assert "none: the same answer" in table


def test_compare_refuses_what_it_cannot_compare_and_checks_its_repeat_count(server):  # noqa: F811
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server, verbose=False)
    prompt = "Ben has 9 coins, finds 8 more, then gives away 9. How many now?"
    *_, status = client.predict(CURRENT_RUN, "LLaDA baseline", "gen_length=64", prompt, api_name="/compare")
    assert status.startswith("⚠ Not compared: Changes to B set its generation length to 64 and A's is 128")
    *_, status = client.predict(STRAIGHT_HOUSE, "LLaDA baseline", "block_size=64", prompt, api_name="/compare")
    assert status.startswith("⚠ B cannot run at A's generation length 32 (its own length is 64; steps 32 → 16")
    assert "block_size 64 does not divide gen_length 32" in status
    # A change B refuses at any length: the change is named, not the length (issue 59, item 3).
    *_, status = client.predict(STRAIGHT_HOUSE, "LLaDA baseline", "threshold=0.5", prompt, api_name="/compare")
    assert "threshold" in status and "generation length" not in status and "block_size" not in status, status
    for repeats, message in ((31, "greater than maximum value 30"), (1, "less than minimum value 2"),
                             (2.5, "repeats must be a valid integer")):
        with pytest.raises(AppError, match=message):
            client.predict(STRAIGHT_HOUSE, STRAIGHT_HOUSE, "", prompt, repeats, api_name="/compare")


@pytest.fixture(scope="module")
def numeric_api(server):  # noqa: F811
    """A client of the page, and every (endpoint, numeric argument, arguments) of its public API."""
    from gradio_client import Client

    config = json.load(urllib.request.urlopen(server + "config"))
    components = {c["id"]: c for c in config["components"]}
    found = []
    for dep in (d for d in config["dependencies"] if d.get("api_visibility") == "public"):
        sent = [components[i] for i in dep["inputs"] if components[i]["type"] != "state"]  # the client's arguments
        found += [(dep["api_name"], at, sent) for at, c in enumerate(sent) if c["type"] in ("number", "slider")]
    return Client(server, verbose=False), found


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_true_is_refused_at_any_numeric_input_of_any_api_endpoint(numeric_api, data):
    """Gradio's Number and Slider round true to 1 before a handler sees it (a branch ran at step 1):
    the page's own (``ui.parts.inputs.number_box``, ``number_slider``) refuse it as sent, by name."""
    from gradio_client.exceptions import AppError

    client, inputs = numeric_api
    assert len(inputs) > 30
    branch_step = next(i for i in inputs if i[0] == "branch_force" and i[2][i[1]]["props"]["label"] == "Step")
    for api_name, at, sent in (branch_step, data.draw(st.sampled_from(inputs))):
        label = sent[at]["props"]["label"]
        with pytest.raises(AppError, match=re.escape(f"{label}: must be a finite number, not true")):
            client.predict(*[True if i == at else c["props"].get("value") for i, c in enumerate(sent)],
                           api_name=f"/{api_name}")
