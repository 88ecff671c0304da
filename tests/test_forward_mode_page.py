"""The forward mode on the page (issue 58): its control in the Run tab, the status line naming the
mode that ran and any fallback, Compare's sides by the mode each ran, and the cost panel's measured
steps against the roofline floor of the GPU a run ran on (CPU times said to be CPU times)."""
from __future__ import annotations

import copy
import json
import statistics

import pytest

import dllm_local
from dllm_local.analysis.costmodel import TargetModel
from dllm_local.devices import DEVICES
from dllm_local.policies import registry
from dllm_local.settings import Settings, knob
from dllm_local.trace import parse_trace
from ui.compare.comparison import compare, compare_html
from ui.compare.tab import apply_changes, side_line
from ui.parts.measured_steps import gpu_profile, measured_steps_html
from ui.run.status_line import run_status
from ui.run.views import show_cost

from test_page import OUT, _choose, _shown_run, _wait_run_ended, browser, server  # noqa: F401 - fixtures

PROMPT = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"
H100 = "NVIDIA H100 80GB HBM3"
CACHED_MS, FULL_MS = 5.0, 9.0  # the synthetic GPU run's step times


@pytest.fixture(scope="module")
def cpu_trace(tiny) -> dict:
    """A dual-cache run of the tiny model on the CPU: cached steps, and one full refresh a block."""
    settings = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold", forward_mode="eager")
    return dllm_local.generate(tiny, PROMPT, settings).trace.to_dict()


def _on_gpu(trace: dict, gpu_name: str) -> dict:
    """``trace`` as if it ran on the CUDA GPU ``gpu_name``: every cached step CACHED_MS, every full one FULL_MS."""
    gpu = copy.deepcopy(trace)
    gpu["model"].update(device="cuda:0", gpu_name=gpu_name)
    for step in gpu["steps"]:
        step["model_ms"] = FULL_MS if step["full_refresh"] else CACHED_MS
    return gpu


def _alone(trace: dict, full: bool) -> list[dict]:
    """The steps the panel measures: one forward each, past the prefill, of the kind asked."""
    return [s for s in trace["steps"] if s["step"] > 0 and s["forwards"] == 1 and s["full_refresh"] is full]


# ---------------------------------------------------------------- the status line

def test_the_status_line_names_the_mode_that_ran(cpu_trace):
    compiled = copy.deepcopy(cpu_trace)
    compiled["settings"]["forward_mode"] = "compiled"
    compiled["stats"].update(forward_mode="compiled", forward_notice="")
    status = run_status(compiled, "", None, True)
    assert "· forward: compiled)." in status and "⚠" not in status, status


def test_the_status_line_shows_a_fallback_before_the_answer(cpu_trace):
    fell_back = copy.deepcopy(cpu_trace)
    fell_back["settings"]["forward_mode"] = "compiled"
    notice = "compiled forward failed (RuntimeError: no compiler here); running eager"
    fell_back["stats"].update(forward_mode="eager", forward_notice=notice)
    status = run_status(fell_back, "", None, True)
    warning = f"⚠ **Forward mode compiled asked, eager ran:** {notice}."
    assert status.startswith(warning) and "· forward: eager)." in status, status


def test_a_trace_written_before_the_forward_modes_still_loads_and_reads_as_eager(cpu_trace):
    old = copy.deepcopy(cpu_trace)
    del old["settings"]["forward_mode"], old["stats"]["forward_mode"], old["stats"]["forward_notice"]
    assert "forward:" not in run_status(old, "", None, True)  # the raw dict says nothing: nothing said
    loaded = parse_trace(old).to_dict()
    assert loaded["stats"]["forward_mode"] == "eager" and loaded["stats"]["forward_notice"] == ""
    assert "· forward: eager)." in run_status(loaded, "", None, True)


def test_compare_shows_the_mode_each_side_ran_and_its_fallback(cpu_trace):
    b = Settings.from_dict(apply_changes(cpu_trace["settings"], "forward_mode=compiled", registry.all_specs()))
    assert side_line(b).endswith("· seed 0 · forward compiled") and "forward" not in side_line(Settings())
    fell_back = copy.deepcopy(cpu_trace)
    fell_back["stats"].update(forward_mode="eager", forward_notice="graphs forward failed (no GPU)")
    table = compare_html(compare(cpu_trace, fell_back))
    assert "<td>forward mode (ran)</td><td>eager</td><td>eager (⚠ graphs forward failed (no GPU))</td>" in table


# ---------------------------------------------------------------- the cost panel's measured steps

def test_the_cost_panel_holds_a_gpu_runs_steps_to_the_floor_of_its_gpu(cpu_trace):
    gpu = _on_gpu(cpu_trace, H100)
    model, h100 = gpu["model"], DEVICES["H100"]
    target = TargetModel("tiny", model["arithmetic_parameters"], model["weight_read_mb"] * 2**20)
    html = show_cost(gpu, "LLaDA-8B-Instruct", "H100")
    assert f"Measured steps on {H100}" in html and "H100 SXM5 profile" in html and "(forward: eager)" in html
    for kind, full, ms in (("cached", False, CACHED_MS), ("full refresh", True, FULL_MS)):
        steps = _alone(gpu, full)
        assert steps, kind
        g = statistics.median(s["g"] for s in steps)
        floor_ms = target.floor_s(g, h100) * 1e3
        row = (f"<tr><td>{kind} ({len(steps)})</td><td>{g:g}</td><td>{ms:.2f} ms</td>"
               f"<td>{floor_ms * 1e3:.1f} µs</td><td><b>{ms / floor_ms:,.0f}×</b></td></tr>")
        assert row in html, (row, html)


def test_the_cost_panel_says_cpu_times_are_cpu_times_and_gives_no_floor(cpu_trace):
    html = measured_steps_html(cpu_trace)
    assert "Measured steps: CPU times" in html and "the roofline above is a GPU projection" in html
    assert "× floor" not in html.split("</div>", 1)[1]  # no such column
    steps = _alone(cpu_trace, False)
    assert f"<td>cached ({len(steps)})</td>" in html


def test_a_gpu_without_a_profile_or_a_name_has_an_unknown_floor(cpu_trace):
    t4 = measured_steps_html(_on_gpu(cpu_trace, "Tesla T4"))
    assert "the floor is unknown for this GPU: no device profile matches Tesla T4" in t4 and "<th>floor</th>" not in t4
    unnamed = _on_gpu(cpu_trace, H100)
    del unnamed["model"]["gpu_name"]  # a CUDA run's trace written before the info named its GPU
    assert "the trace does not name its GPU" in measured_steps_html(unnamed)
    assert gpu_profile("NVIDIA A100-SXM4-80GB") is DEVICES["A100"] and gpu_profile("NVIDIA L40S") is None


# ---------------------------------------------------------------- a real browser

def test_browser_forward_mode_control_runs_eager_and_says_so(browser, server, cpu_trace, tmp_path):  # noqa: F811
    """The control, a run in eager, its status line and its measured steps (CPU times); then a GPU
    run's trace imported: its steps against the H100's floor."""
    pg = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        pg.goto(server)
        pg.wait_for_selector("#forward-mode")
        assert knob("forward_mode").label in pg.inner_text("#forward-mode")
        assert pg.input_value("#forward-mode input") == knob("forward_mode").default
        _choose(pg, "#forward-mode", "eager")
        before = _shown_run(pg)
        pg.click("#run-btn")
        status = _wait_run_ended(pg, before)
        assert "· forward: eager)" in status and "⚠" not in status, status
        pg.get_by_text("Cost model: this run projected onto a real model").first.click()
        pg.wait_for_function("() => (document.querySelector('#cost-model')?.innerText || '').includes('CPU times')")
        pg.screenshot(path=str(OUT / "run-forward-mode.png"))
        gpu_trace = tmp_path / "h100.json"
        gpu_trace.write_text(json.dumps(_on_gpu(cpu_trace, H100)))
        with pg.expect_file_chooser() as chooser:
            pg.click("#import-btn")
        chooser.value.set_files(str(gpu_trace))
        pg.wait_for_function("(gpu) => (document.querySelector('#cost-model')?.innerText || '').includes("
                             "`Measured steps on ${gpu}`)", arg=H100)
        assert "× floor" in pg.inner_text("#cost-model .dl-measured-steps")
    finally:
        pg.close()
