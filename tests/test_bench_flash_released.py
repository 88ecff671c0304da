"""bench/flash_released.py (Flash-dLLM as released against Fast-dLLM, the write-up's pair and LLaDA
on the tiny model) and gpu_check's released rows, on tiny sizes."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flash_released_prints_every_pair_with_ratios_aup_and_verify_counts(tmp_path, capsys):
    flash_released = _bench("flash_released")
    out = tmp_path / "rows.json"
    report = flash_released.main(["--n", "2", "--quiet", "--json", str(out)])
    printed = capsys.readouterr().out
    rows = {r["key"]: r for r in report["rows"]}
    assert list(rows) == list(flash_released.PAIRS) and json.loads(out.read_text())["rows"] == report["rows"]
    assert [rows[k]["settings"]["cache"] + " + " + rows[k]["settings"]["unmask"] for k in rows] == [
        "flash + flash_verify", "flash + threshold", "dual + threshold", "dual + threshold", "adaptive + self_verify",
        "none + fixed"]
    assert rows["fast_dllm_early_stop"]["settings"]["early_stop"] and not rows["fast_dllm"]["settings"]["early_stop"]
    assert all(r["n"] == 2 and (r["settings"]["gen_length"], r["settings"]["block_size"]) == (64, 16)
               for r in rows.values())
    assert rows["llada"]["nfe"] == 64 and rows["llada"]["verify_forwards"] == 0
    assert rows["fast_dllm"]["ms_ratio"] == rows["fast_dllm"]["nfe_ratio"] == 1.0
    released = rows["released"]
    # Verify forwards are counted in the forwards, one at most per step.
    assert released["nfe"] == pytest.approx(released["steps"] + released["verify_forwards"])
    assert released["verify_forwards"] <= released["steps"] and rows["flash_threshold"]["verify_forwards"] == 0
    if released["verify_forwards"]:
        assert 0 <= released["accepted_per_verify"] <= released["drafts_per_verify"] <= 8  # block / 2 drafts at most
    assert released["rejected_per_verify"] == 0  # flash_verify only accepts
    for r in rows.values():  # one point per pair: AUP is its rectangle
        assert r["aup"] == pytest.approx(r["tau_content"] * r["accuracy"] * 100, abs=0.01)
    assert printed.startswith("$ python bench/flash_released.py --n 2")
    assert "machine:" in printed and "| flash 4 + flash_verify 0.9 0.8 |" in printed and "Verify forwards" in printed


def test_gpu_check_times_the_released_pair_forward_by_forward_alone_and_batched():
    import torch

    from dllm_local.devices import DEVICES

    gpu_check = _bench("gpu_check")
    model = gpu_check.build_random(gpu_check.reference_config(tiny=True), "cpu", torch.float32)
    handle = gpu_check.make_handle(model, "random", gpu_check.REFERENCE.parent)
    rows = {(r["batch"], r["pair"]): r for batch in (1, 2)
            for r in gpu_check.released_rows(handle, "float32", 64, 16, 16, batch, 2, DEVICES["H100"])}
    assert set(rows) == {(b, p) for b in (1, 2) for p in gpu_check.RELEASED_PAIRS}
    for batch in (1, 2):
        verify, plain = rows[batch, "flash + flash_verify"], rows[batch, "flash + threshold"]
        # Random weights: one token per request per step, a verify forward per request per step.
        assert verify["tokens_per_step"] == plain["tokens_per_step"] == batch
        assert verify["forwards"] == 1 + batch
        assert plain["forwards"] == rows[batch, "dual + threshold"]["forwards"] == 1
        assert verify["verify_ms"] > 0 and plain["verify_ms"] == 0
        assert verify["G"] == plain["G"] > rows[batch, "dual + threshold"]["G"] == 16 * batch  # window, tracked, masks
        assert verify["floor_ms_32L"] > plain["floor_ms_32L"]
    # A batch's forward packs every request's positions (a step's G may differ by one from step to step).
    assert rows[2, "flash + threshold"]["G"] == pytest.approx(2 * rows[1, "flash + threshold"]["G"], abs=2)
