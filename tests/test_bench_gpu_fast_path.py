"""bench/gpu_fast_path.py (eager against the fast path, the lent GPU's one script) on its CPU dry
run: the tiny shape, one length, batches 1 and 2, compiled with aot_eager (seconds, not inductor's
minute)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_the_cpu_dry_run_times_every_policy_eager_and_compiled_with_the_same_tokens(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    import gpu_fast_path as fast_path

    from dllm_local.policies import registry

    out = tmp_path / "fast_path.json"
    table = fast_path.main(["--tiny", "--device", "cpu", "--lengths", "64", "--prompt", "32", "--batches", "1,2",
                            "--repeats", "1", "--batch-steps", "2", "--fast", "compiled", "--backend", "aot_eager",
                            "--time-budget", "600", "--invariance", "4", "--invariance-batch", "2",
                            "--out", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(table))
    assert not table["skipped"] and not table["failed"]

    rows = {r["policy"]: r for r in table["policies"]}
    assert sorted(rows) == sorted(registry.for_model("masked", registry.CACHE)) and len(table["policies"]) == len(rows)
    for policy, r in rows.items():
        assert r["gen"] == 64 and r["eager_ms"] > 0 and r["fast_ms"] > 0 and r["floor_ms"] > 0, policy
        assert r["same_tokens"] and r["differ_at"] is None, policy
        assert r["forward_mode"] == "compiled" and r["notice"] == "", policy  # no fallback to eager
    assert rows["dual"]["shapes_new"] > 0 and rows["dual"]["shapes"] >= rows["dual"]["shapes_new"]

    assert [(r["mode"], r["step"]) for r in table["profile"]] == [("eager", rows["dual"]["timed_step"]),
                                                                 ("compiled", rows["dual"]["timed_step"])]
    assert sorted((r["batch"], r["mode"]) for r in table["batches"]) == [
        (1, "compiled"), (1, "eager"), (2, "compiled"), (2, "eager")]
    assert all(r["step_ms"] > 0 and r["floor_ms"] > 0 for r in table["batches"])

    invariance = table["invariance"][0]
    assert [r["schedule"] for r in invariance["rows"]] == ["packed continuous", "packed static", "invariant"]
    assert all(r["n"] == 4 and r["tokens_per_s"] > 0 for r in invariance["rows"])
    assert invariance["rows"][-1]["same_as_alone"] == 4 and invariance["invariant_x_packed"] > 0  # float32, or any: exact
    assert "same tokens as alone" in printed and "invariant / packed continuous tokens/s" in printed

    verdicts = {t["target"].split(" <=")[0].split(" >=")[0]: t for t in table["targets"]}
    assert verdicts["batch-32 dual step"]["met"] is None and verdicts["flash + flash_verify"]["met"] is None
    assert verdicts["DualCache step, batch 1"]["figure"] == rows["dual"]["fast_x_floor"]
    assert printed.startswith("device: ") and "torch " in printed
    assert "$ python bench/gpu_fast_path.py --tiny" in printed and "one per number of requests and packed length" in printed
    assert "targets:" in printed and "not measured (no --released)" in printed
