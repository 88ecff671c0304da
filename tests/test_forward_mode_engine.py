"""What the page reads of a run's forwards, from the engine (issue 58): the loaded model's GPU by name
and the parameters its arithmetic uses in its info, and a batch's packed forward compiled: one graph
without a break, a graph per number of requests, the same tokens as eager, the trace naming the mode
(and a run that names a compiled mode runs alone, in it)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch

import dllm_local
from dllm_local.decoding.batch import BatchRun
from dllm_local.models.attention import Segment
from dllm_local.runner import ForwardRunner, runner_for
from dllm_local.runner.forward import POOLED
from dllm_local.serving.scheduler import Request, Scheduler
from dllm_local.settings import Settings, knob
from test_fast_path import GraphCounter

PROMPT = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"
H100 = "NVIDIA H100 80GB HBM3"


def test_the_model_info_names_a_cuda_gpu_and_the_parameters_its_arithmetic_uses(tiny, monkeypatch):
    info = tiny.summary()
    assert "gpu_name" not in info and 0 < info["arithmetic_parameters"] < info["parameters"]  # the untied embedding
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"{H100} ({device})")
    assert replace(tiny, device=torch.device("cuda:0")).summary()["gpu_name"] == f"{H100} (cuda:0)"


PROMPTS = [PROMPT, "Give two numbers whose sum is 9.", "Name a color.", "What is 2 + 2?", "Count to three."]


def _batch(handle, settings: Settings) -> list[BatchRun]:
    """``PROMPTS`` decoded continuously in 3 slots: requests join as others finish, so the packed
    forwards meet 1 to 3 requests, prefills packed with steps."""
    batch = BatchRun(handle, PROMPTS, settings, slots=3)
    list(batch)
    return batch


def test_a_batch_compiles_its_packed_forward_and_decodes_as_eager(tiny):
    handle = dllm_local.load("tiny")  # a model of its own: its compiled runner is this test's
    torch._dynamo.reset()
    counter = GraphCounter()
    runner = runner_for(handle.model, "compiled", backend=counter)
    settings = Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold")
    eager = _batch(handle, settings)
    fast = _batch(handle, settings.with_(forward_mode="compiled"))
    assert [r.token_ids for r in fast.results] == [r.token_ids for r in eager.results]
    for result in fast.results:
        assert result.stats.forward_mode == "compiled" and result.stats.forward_notice == "", result.stats
        assert result.stats.batch_size >= 2
    packed = {shape for shape in runner.shapes if shape[0] == "packed"}
    assert {requests for _, requests, _ in packed} >= {2, 3}
    print(f"{counter.graphs} graphs for {sorted(runner.shapes)}")
    assert counter.graphs <= len(runner.shapes), (counter.graphs, sorted(runner.shapes))
    graphs = counter.graphs
    again = _batch(handle, settings.with_(forward_mode="compiled", seed=1))
    assert [r.token_ids for r in again.results] == [r.token_ids for r in fast.results]
    assert counter.graphs == graphs  # the same compositions again: no new graph


def test_a_packed_forward_is_one_graph_without_a_break():
    handle = dllm_local.load("tiny")
    runner, explained = runner_for(handle.model, "auto"), []  # the batch's settings: auto, eager on a CPU
    model_call = runner._eager_packed

    def explain_one(input_ids, positions, segments: list[Segment]):
        if not explained and len(segments) > 1:
            torch._dynamo.reset()
            explained.append(torch._dynamo.explain(model_call)(input_ids, positions, segments))
        return model_call(input_ids, positions, segments)

    runner._eager_packed = explain_one
    try:
        _batch(handle, Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold"))
    finally:
        del runner._eager_packed
    assert explained[0].graph_break_count == 0, [str(b.reason) for b in explained[0].break_reasons]
    assert explained[0].graph_count == 1


def test_a_run_that_names_a_compiled_mode_is_not_batched(tiny):
    settings = Settings(gen_length=32, block_size=32, cache="dual", unmask="threshold")
    scheduler = Scheduler(SimpleNamespace(handle=tiny), conn=None)
    asked = {mode: scheduler._batchable(Request("r", "run", {"settings": settings.with_(forward_mode=mode)}))
             for mode in knob("forward_mode").choices}
    assert asked == {"auto": True, "eager": True, "compiled": False, "graphs": False}


def test_the_runner_reuses_every_cache_an_invariant_batch_freed_and_keeps_few_idle(tiny):
    """An invariant batch's requests each take a cache of their own: all of them come back to the
    runner's pool, so the next requests replay graphs on the same addresses; idle ones are capped."""
    runner = ForwardRunner(tiny.model, "eager")
    views = [runner.new_cache(1, 64).alloc(64) for _ in range(3)]
    stores = {id(view.store) for view in views}
    assert len(stores) == 3
    for view in views:
        view.store.free(view)
    again = [runner.new_cache(1, 64).alloc(64) for _ in range(3)]
    assert {id(view.store) for view in again} == stores
    for view in again:
        view.store.free(view)
    runner.new_cache(1, 32)  # a new shape: the idle ones beyond the pool's few are let go
    assert sum(store.in_use == 0 for store in runner._pool) == POOLED
