"""What the page reads of a run's forwards, from the engine (issue 58): the loaded model's GPU by name
and the parameters its arithmetic uses in its info, and the engine's batch never claiming a compiled
mode its packed forwards did not run (a run that names one runs alone)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch

import dllm_local
from dllm_local.decoding.batch import stream_batch
from dllm_local.runner import runner_for
from dllm_local.serving.scheduler import Request, Scheduler
from dllm_local.settings import Settings, knob

PROMPT = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"
H100 = "NVIDIA H100 80GB HBM3"


def test_the_model_info_names_a_cuda_gpu_and_the_parameters_its_arithmetic_uses(tiny, monkeypatch):
    info = tiny.summary()
    assert "gpu_name" not in info and 0 < info["arithmetic_parameters"] < info["parameters"]  # the untied embedding
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"{H100} ({device})")
    assert replace(tiny, device=torch.device("cuda:0")).summary()["gpu_name"] == f"{H100} (cuda:0)"


def test_a_batched_run_never_claims_a_compiled_mode_and_a_compiled_run_is_not_batched(tiny):
    handle = dllm_local.load("tiny")  # a model of its own: its compiled runner is this test's
    runner_for(handle.model, "compiled", backend="eager")  # dynamo's graph run as it is: no compile time
    settings = Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold", forward_mode="compiled")
    batch = stream_batch(handle, [PROMPT, "Give two numbers whose sum is 9."], settings)
    list(batch)
    for run in batch.runs:
        stats = run.recorder.trace.stats
        assert stats.forward_mode == "eager" and "engine's batch" in stats.forward_notice, stats
    scheduler = Scheduler(SimpleNamespace(handle=tiny), conn=None)
    asked = {mode: scheduler._batchable(Request("r", "run", {"settings": settings.with_(forward_mode=mode)}))
             for mode in knob("forward_mode").choices}
    assert asked == {"auto": True, "eager": True, "compiled": False, "graphs": False}
