"""The GPU fast path, checked on the CPU (issue 58): a forward reads nothing back from the device,
compiles to one graph with no break, compiled decodes as eager without recompiling across blocks,
a run meets few shapes, and padding to those shapes changes no token of the golden traces."""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch

import dllm_local
from dllm_local import Settings
from dllm_local.experiments.probes import HostSyncCounter
from dllm_local.models.cache import CacheFork
from dllm_local.policies import registry
from dllm_local.runner import ForwardRunner, runner_for

PROMPT = "What is 3 + 4?"
# Every cache policy a masked model takes, with an unmasking policy that makes its extra forwards
# (self_verify's variant rows, flash_verify's read of the cache) where the pair allows one.
POLICIES = {
    "none": ("threshold", {}),
    "prefix": ("threshold", {}),
    "dual": ("threshold", {}),
    "freecache": ("threshold", {}),
    "adaptive": ("self_verify", {}),
    "drift_refresh": ("threshold", {}),
    "flash": ("flash_verify", {"block_size": 16}),
}


def _settings(cache: str, trace: str = "summary", gen_length: int = 64, **more) -> Settings:
    unmask, extra = POLICIES[cache]
    return Settings.from_dict({"gen_length": gen_length, "block_size": 32, "cache": cache, "unmask": unmask,
                               "trace": trace, **extra, **more})


@pytest.fixture(scope="module")
def handle():
    """A model of its own: these tests change its runners (padding, compiled), no other test sees them."""
    return dllm_local.load("tiny")


@contextmanager
def watching(runner: ForwardRunner) -> Iterator[list[tuple[tuple, HostSyncCounter]]]:
    """Each model call the runner makes: its arguments, and the host syncs counted around it alone."""
    calls, model_call = [], runner._eager

    def counted(*args):
        with HostSyncCounter() as syncs:
            out = model_call(*args)
        calls.append((args, syncs))
        return out

    runner._eager = counted
    try:
        yield calls
    finally:
        runner._eager = model_call


def test_the_policies_here_are_every_cache_policy_of_a_masked_model():
    assert set(POLICIES) == set(registry.for_model("masked", registry.CACHE))


@pytest.mark.parametrize("pads", [False, True], ids=["as computed", "padded to buckets"])
@pytest.mark.parametrize("trace", ["off", "summary"])
@pytest.mark.parametrize("cache", list(POLICIES))
def test_no_host_sync_inside_a_forward(handle, cache, trace, pads):
    runner = runner_for(handle.model, "auto")
    runner.pads = pads
    try:
        with watching(runner) as calls:
            result = dllm_local.generate(handle, PROMPT, _settings(cache, trace))
    finally:
        runner.pads = False
    assert len(calls) == result.stats.nfe + result.stats.store_forwards
    synced = [(i, dict(syncs.counts)) for i, (_, syncs) in enumerate(calls) if syncs.total]
    assert not synced, f"{cache}: host syncs inside the forward: {synced}"
    if cache in ("adaptive", "flash"):  # their verify forwards were among them, over a fork of the cache
        assert any(isinstance(args[2], CacheFork) for args, _ in calls)


def _explained(handle, cache: str, trace: str, fork: bool):
    """``torch._dynamo.explain`` of a cached step's forward (the third, the cache set up by then), or
    of the first forward over a fork of the cache (a verify forward), made as the run reaches it."""
    runner = runner_for(handle.model, "auto")
    model_call, seen, explained = runner._eager, [], []

    def explain_one(*args):
        seen.append(isinstance(args[2], CacheFork))
        if not explained and (seen[-1] if fork else seen.count(False) == 3 and not seen[-1]):
            torch._dynamo.reset()
            explained.append(torch._dynamo.explain(model_call)(*args))
        return model_call(*args)

    runner._eager = explain_one
    try:
        dllm_local.generate(handle, PROMPT, _settings(cache, trace))
    finally:
        runner._eager = model_call
    return explained[0]


@pytest.mark.parametrize("cache, trace, fork", [
    ("none", "off", False), ("prefix", "off", False), ("dual", "off", False), ("dual", "summary", False),
    ("flash", "off", False), ("flash", "off", True), ("drift_refresh", "summary", False),
], ids=["none", "prefix", "dual", "dual, trace summary", "flash", "flash's verify forward", "drift_refresh"])
def test_a_cached_forward_is_one_graph_without_a_break(handle, cache, trace, fork):
    explained = _explained(handle, cache, trace, fork)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


class GraphCounter:
    """A compiler backend that runs each graph as traced, and counts the graphs it was given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.GraphModule, inputs) -> callable:
        self.graphs += 1
        return graph.forward


def _compiled_as_eager(handle, settings: Settings):
    """The run in eager and in compiled mode, checked alike: the same tokens and commits, the
    confidences within float32's reach; the compiled run's result."""
    eager = dllm_local.generate(handle, PROMPT, settings)
    fast = dllm_local.generate(handle, PROMPT, settings.with_(forward_mode="compiled"))
    assert fast.stats.forward_mode == "compiled" and fast.stats.forward_notice == ""
    assert fast.token_ids == eager.token_ids
    for want, got in zip(eager.trace.steps, fast.trace.steps, strict=True):
        assert [c[:2] for c in got.committed] == [c[:2] for c in want.committed]
        assert [c[2] for c in got.committed] == pytest.approx([c[2] for c in want.committed], abs=1e-5)
    return fast


@pytest.mark.parametrize("cache", ["dual", "prefix", "flash"])
def test_compiled_decodes_as_eager_and_compiles_once_per_shape(cache):
    handle = dllm_local.load("tiny")  # a fresh model: the graphs counted are this test's
    torch._dynamo.reset()
    counter = GraphCounter()
    compiled = runner_for(handle.model, "compiled", backend=counter)
    settings = _settings(cache, gen_length=128)
    fast = _compiled_as_eager(handle, settings)
    # At most a graph per shape the run met (a second length compiles one generic in it), none per
    # block: a DualCache run's two shapes are two graphs, however many blocks.
    assert counter.graphs <= len(compiled.shapes)
    graphs = counter.graphs
    again = dllm_local.generate(handle, PROMPT, settings.with_(forward_mode="compiled", seed=1))
    assert again.token_ids == fast.token_ids and counter.graphs == graphs  # a new run: no new graph
    if cache != "dual":
        return
    assert graphs == 2
    # New prompt lengths: the first few compile graphs generic in the length, which the next reuse.
    for more in (" Answer in words.", " Answer in words, please.", " Answer in words, please, now."):
        dllm_local.generate(handle, PROMPT + more, settings.with_(forward_mode="compiled"))
    graphs = counter.graphs
    longest = dllm_local.generate(handle, PROMPT + " Answer in words, please, right now, thanks.",
                                  settings.with_(forward_mode="compiled"))
    assert longest.stats.forward_notice == "" and counter.graphs == graphs


def test_inductor_compiles_a_dual_run_that_decodes_as_eager():
    handle = dllm_local.load("tiny")
    torch._dynamo.reset()
    _compiled_as_eager(handle, _settings("dual", gen_length=64))


@pytest.mark.parametrize("cache, most", [("dual", {"CacheView": 2}), ("prefix", {"CacheView": 5}),
                                         ("flash", {"CacheView": 2, "CacheFork": 1})])
def test_a_padded_run_meets_few_shapes(handle, cache, most):
    runner = runner_for(handle.model, "auto")
    runner.pads, runner.shapes = True, set()
    try:
        result = dllm_local.generate(handle, PROMPT, _settings(cache, gen_length=256))
    finally:
        runner.pads = False
    kinds = {kind: sum(1 for k, _, _ in runner.shapes if k == kind) for kind in most}
    print(f"{cache}: {result.stats.nfe} forwards in {sorted(runner.shapes)}")
    assert all(kinds[kind] <= most[kind] for kind in most), runner.shapes
    assert result.stats.nfe > len(runner.shapes)


def test_a_mode_that_cannot_run_falls_back_to_eager_and_says_so():
    handle = dllm_local.load("tiny")

    def broken(graph, inputs):
        raise RuntimeError("no compiler here")

    runner_for(handle.model, "compiled", backend=broken)
    eager = dllm_local.generate(handle, PROMPT, _settings("dual"))
    fell_back = dllm_local.generate(handle, PROMPT, _settings("dual").with_(forward_mode="compiled"))
    assert fell_back.token_ids == eager.token_ids
    assert fell_back.stats.forward_mode == "eager"
    assert "compiled forward failed" in fell_back.stats.forward_notice and "no compiler here" in fell_back.stats.forward_notice


def test_the_golden_traces_hold_with_every_forward_padded_to_its_bucket():
    from golden import GOLDEN, PROMPTS

    golden = json.loads(GOLDEN.read_text())
    from golden import record

    recorded = record(pad_queries=True, prompts=range(len(PROMPTS)))
    assert recorded.keys() == golden.keys()
    for key, want in golden.items():
        got = recorded[key]
        assert got["tokens"] == want["tokens"], key
        assert [(s["g"], s["reads"]) for s in got["steps"]] == [(s["g"], s["reads"]) for s in want["steps"]], key
        for g, w in zip(got["steps"], want["steps"]):
            assert [c[:2] for c in sorted(g["committed"])] == [c[:2] for c in sorted(w["committed"])], key
            assert [c[2] for c in sorted(g["committed"])] == pytest.approx([c[2] for c in sorted(w["committed"])], abs=2e-4)


@pytest.mark.parametrize("unmask", ["threshold", "flash_verify"])
def test_flash_stays_token_identical_to_the_release_padded(unmask):
    from test_flash_parity import PROMPTS as FLASH_PROMPTS, _tiny, compare

    runner = runner_for(_tiny().model, "auto")
    runner.pads = True
    try:
        with watching(runner) as calls:
            for prompt in FLASH_PROMPTS[:3]:
                row = compare(unmask, 0.9, unmask == "flash_verify", 64, 4, 4, prompt)
                assert row["same_tokens"], row
    finally:
        runner.pads = False
    sink = calls[0][0][2].store.sink
    assert any(int(args[1][-1]) == sink for args, _ in calls)  # some forwards were padded


@pytest.mark.parametrize("cache, most", [("dual", 2), ("flash", 6)])
def test_a_step_reads_back_from_the_device_at_most_a_few_times(handle, cache, most):
    """Plan, draft, select and commit on the device, read back once with the step's record: dual +
    threshold makes 2 host syncs a step (7 before the fast path), flash + flash_verify at most 6 (20)."""
    steps = iter(dllm_local.stream(handle, PROMPT, _settings(cache, "off")))
    next(steps), next(steps)
    with HostSyncCounter() as syncs:
        next(steps)
    print(f"{cache}: {syncs.total} host syncs a step ({dict(syncs.counts)})")
    assert syncs.total <= most
