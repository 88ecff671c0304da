"""Benchmarks, sweeps and the tau/G cost model."""
from __future__ import annotations

import json
import threading

import pytest

from dllm_local.experiments.side_by_side import Strategy, format_table, run_bench
from dllm_local.experiments.problems import SCORERS, jsonl_problems, task_problems
from dllm_local.devices import DEVICES, reuse_beats_recompute
from dllm_local.analysis.costmodel import TARGET_MODELS, crossover_positions, project, step_floor_s
from dllm_local.errors import DllmError, SettingsError
from dllm_local.settings import Settings
from dllm_local.experiments.sweep import apply, grid, pareto, run_sweep, sweep_job
from dllm_local.experiments.units import LocalRunner, Worker


def test_cost_model_reproduces_the_cost_write_up_table():
    h100 = DEVICES["H100"]
    assert (h100.bandwidth, h100.flops) == (3.352e12, 989.4e12)
    weights, params = 1.4e10, 7e9  # 7B in bf16
    assert step_floor_s(weights, params, 1, h100) * 1e3 == pytest.approx(4.18, abs=0.005)
    per_position_ms = 2 * params / h100.flops * 1e3
    assert per_position_ms == pytest.approx(0.01415, abs=1e-5)
    assert crossover_positions(weights, params, h100) == pytest.approx(295, abs=1)
    # Past the crossover the arithmetic bound takes over.
    assert step_floor_s(weights, params, 600, h100) == pytest.approx(600 * per_position_ms / 1e3)


def test_a_run_projected_onto_llada_8b_on_an_h100():
    stats = {"mean_g": 32.0, "content_tokens_per_forward": 2.0, "content_tokens": 20}
    run, baseline, ar = project(stats, 40, 256, TARGET_MODELS["LLaDA-8B-Instruct"], DEVICES["H100"])
    # 8.016 B parameters, less the 0.518 B of the input embedding a forward only gathers from.
    read_ms = 2 * 7.498e9 / 3.352e12 * 1e3  # the weight read: 4.47 ms
    assert run["floor_ms"] == pytest.approx(read_ms) and run["bound"] == "bandwidth"
    assert run["compute_ms"] == pytest.approx(32 * 2 * 7.498e9 / 989.4e12 * 1e3)
    assert run["tokens_per_s"] == pytest.approx(2.0 / read_ms * 1e3) and run["speedup_vs_ar"] == pytest.approx(2.0)
    # The baseline recomputes prompt + answer (296 positions) every forward: past the crossover.
    assert baseline["g"] == 296 and baseline["bound"] == "compute"
    assert baseline["tau"] == pytest.approx(20 / 256) and baseline["speedup_vs_ar"] < 0.1
    assert (ar["g"], ar["tau"], ar["speedup_vs_ar"]) == (1.0, 1.0, 1.0)


def test_reusing_kv_beats_recomputing_on_every_listed_gpu_for_an_8b_model():
    kv_bytes = 2 * 32 * 4096 * 2  # K and V, 32 layers, 4096 wide, bf16
    assert all(reuse_beats_recompute(kv_bytes, 8e9, d) for d in DEVICES.values())


def test_pareto_front_matches_hand_computed_case():
    pts = [
        {"nfe": 40, "accuracy": 0.90},  # 0: most accurate
        {"nfe": 20, "accuracy": 0.85},  # 1: front
        {"nfe": 30, "accuracy": 0.80},  # 2: beaten by 1
        {"nfe": 10, "accuracy": 0.60},  # 3: fewest forwards
        {"nfe": 10, "accuracy": 0.50},  # 4: beaten by 3 (tie on forwards)
        {"nfe": 40, "accuracy": 0.90},  # 5: duplicate of 0: neither beats the other
    ]
    assert pareto(pts) == [0, 1, 3, 5]


def test_timing_noise_alone_beats_no_point():
    """Two settings that take the same forwards to the same accuracy are tied, whatever their
    measured tokens/s: the faster of them by timing noise does not push the other off the front."""
    same = {"accuracy": 0.6, "nfe": 12.0, "tau_content": 2.5}
    rows = [{**same, "model_tok_s": 101.0}, {**same, "model_tok_s": 97.0},
            {"accuracy": 0.6, "nfe": 16.0, "tau_content": 2.0, "model_tok_s": 140.0}]  # faster, yet more forwards
    assert pareto(rows) == [0, 1]


def test_sweep_points_set_the_right_knobs_and_reject_unknown_ones():
    base = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold")
    s = apply(base, {"threshold": 0.7, "block_size": 16, "refresh_every": 4})
    assert s.unmask_params["threshold"] == 0.7 and s.block_size == 16 and s.cache_params == {"refresh_every": 4}
    assert base.unmask_params == {}  # the base is untouched
    assert len(grid({"threshold": [0.5, 0.9], "block_size": [8, 16, 32]})) == 6
    with pytest.raises(SettingsError, match="cannot sweep 'colour'"):
        apply(base, {"colour": 1})
    with pytest.raises(SettingsError, match="block_size 24 does not divide"):
        apply(base, {"block_size": 24})


def _here(tiny, job):
    return LocalRunner(Worker(job, tiny, None))


def test_sweep_on_the_tiny_model_marks_a_front_and_can_be_cancelled(tiny):
    base = Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold")
    job = sweep_job(base, {"threshold": [0.5, 1.0], "block_size": [16, 32]}, "arithmetic", 4)
    report = run_sweep(job, _here(tiny, job))
    rows = report["rows"]
    assert len(rows) == 4 and any(r["pareto"] for r in rows) and not report["cancelled"]
    one_per_step = [r for r in rows if r["point"]["threshold"] == 1.0]
    assert all(r["nfe"] == 32 for r in one_per_step)
    assert all(r["nfe"] < 32 for r in rows if r["point"]["threshold"] == 0.5)
    cancel = threading.Event()
    seen = []

    def stop_after_first(p):
        seen.append(p)
        cancel.set()

    job = sweep_job(base, {"threshold": [0.5, 0.9, 1.0]}, "arithmetic", 4)
    partial = run_sweep(job, _here(tiny, job), cancel=cancel, on_point=stop_after_first)
    assert len(partial["rows"]) == 1 and partial["cancelled"] and seen[0].total == 3


def test_bench_table_reports_speedup_against_the_first_row(tiny):
    problems = task_problems("arithmetic", 3, 1000)
    report = run_bench(tiny, problems, [Strategy({"cache": "none"}),
                                        Strategy({"cache": "dual", "unmask": "threshold"})],
                       Settings(gen_length=32, block_size=32), progress=False)
    first, second = report["rows"]
    assert first["speedup"] == 1.0 and first["nfe"] == 32 and second["nfe"] < 32
    assert second["speedup"] == pytest.approx(first["wall_s"] / second["wall_s"])
    table = format_table(report)
    assert "machine:" in table and "dual + threshold 0.9" in table


def test_user_jsonl_sets_and_scorers(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text(json.dumps({"prompt": "2+2?", "answer": "4"}) + "\n\n" + json.dumps({"prompt": "Capital?", "answer": "Paris"}) + "\n")
    probs = jsonl_problems(f, "contains")
    assert len(probs) == 2 and probs[1].is_correct("It is paris.") and not probs[1].is_correct("Rome")
    assert SCORERS["exact_number"]("so the total is 1,204.", "1204") and not SCORERS["exact_number"]("12", "4")
    assert SCORERS["exact_string"](" Paris ", "Paris")
    f.write_text('{"prompt": "x"}\n')
    with pytest.raises(DllmError, match="line 1"):
        jsonl_problems(f, "contains")
    with pytest.raises(DllmError, match="scorer must be one of"):
        jsonl_problems(f, "fuzzy")


def test_gpu_check_script_runs_its_cpu_smoke_shape(tmp_path):
    import importlib.util
    from pathlib import Path

    from dllm_local.policies import registry

    path = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--lengths", "64", "--prompt", "16", "--repeats", "1",
                           "--generate-budget", "5", "--quantized", "no", "--continuous-batches", "3",
                           "--continuous-n", "5", "--json", str(out)]) == 0
    continuous = json.loads(out.read_text())["continuous"]
    assert [(r["batch"], r["same"], r["n"]) for r in continuous] == [(3, 5, 5)]  # both schedules, the same tokens
    assert continuous[0]["forwards_static"] > continuous[0]["forwards_continuous"]
    rows = {r["policy"]: r for r in json.loads(out.read_text())["policies"]}
    assert list(rows) == list(registry.for_model("masked", registry.CACHE))  # every cache policy, each through the real sampler
    total = rows["none"]["G_first"]
    assert rows["none"]["G"] == total == rows["dual"]["G_first"]  # a refresh recomputes everything
    assert rows["dual"]["G"] == 32 and rows["freecache"]["G_first"] < total
