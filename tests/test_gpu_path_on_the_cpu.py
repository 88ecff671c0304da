"""What a CUDA GPU would show, proven on the CPU: host syncs per step, where each layer's K/V
lives, the memory a full-trace step allocates, the order of a model switch, how GPU failures are
classified, the dtype picked per GPU, and the quantized path (bitsandbytes runs on the CPU too).
Tests that need a GPU are marked and skipped here with the reason."""
from __future__ import annotations

import gc
import multiprocessing
import threading
import weakref

import pytest
import torch

import dllm_local
from checkpoints import build_dream, build_llada
from dllm_local import Settings
from dllm_local.errors import EngineError, ModelLoadError, OutOfMemory
from dllm_local.experiments.probes import AllocationPeak, HostSyncCounter
from dllm_local.models.attention import BIDIRECTIONAL, Attention, ForwardObserver, Segment
from dllm_local.models.loading.loader import auto_cuda_dtype, pick_device, pick_dtype
from dllm_local.serving import engine as engine_module
from dllm_local.serving import failures

PROMPT = "What is 3 + 4?"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _step_syncs(handle, settings: dict) -> HostSyncCounter:
    """Host syncs of the third step of a run (the first two set the cache up), trace off: the
    trace's own read-backs are the price of the views, not of decoding."""
    run = dllm_local.stream(handle, PROMPT, Settings.from_dict({"gen_length": 64, "block_size": 32, "trace": "off",
                                                                **settings}))
    steps = iter(run)
    next(steps), next(steps)
    with HostSyncCounter() as syncs:
        next(steps)
    return syncs


# ---------------------------------------------------------------- host syncs
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_step_costs_a_few_host_syncs_however_many_layers(family, tmp_path):
    build = build_llada if family == "llada" else build_dream
    layers = (6, 24) if family == "llada" else (2, 8)
    counts = {}
    for n in layers:
        key = "n_layers" if family == "llada" else "num_hidden_layers"
        handle = dllm_local.load(str(build(tmp_path / f"{family}{n}", **{key: n})))
        counts[n] = {policy: _step_syncs(handle, settings) for policy, settings in {
            "dual + threshold": {"cache": "dual", "unmask": "threshold"},
            "prefix + fixed": {"cache": "prefix", "unmask": "fixed"},
            "adaptive + threshold": {"cache": "adaptive", "unmask": "threshold"},
        }.items()}
    for policy in counts[layers[0]]:
        few, many = counts[layers[0]][policy], counts[layers[1]][policy]
        print(f"{family} {policy}: {few.total} syncs at {layers[0]} layers, {many.total} at {layers[1]} "
              f"({dict(many.counts)})")
        assert few.counts == many.counts  # nothing per layer: the loop over layers never waits for the device
        assert many.total <= 16  # Dream's shifted predecessors cost it a few more than LLaDA
    assert counts[layers[1]]["dual + threshold"].total <= 12  # the default pair (bench/host_syncs.py)


def test_the_counter_sees_every_kind_of_sync():
    x = torch.arange(6)
    with HostSyncCounter() as syncs:
        int(x[0]), bool((x > 2).any()), x.tolist(), x.nonzero(), x.unique(), x[x > 2]
    assert dict(syncs.counts) == {"readback": 2, "tolist": 1, "nonzero": 1, "_unique2": 1, "boolean index": 1}


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_8bit_runs_pure_int8_without_a_sync_per_linear(tiny):
    """bitsandbytes' default outlier split (threshold 6.0) finds outlier columns with a sync per
    Linear per forward on CUDA (its CPU kernels do not sync, so the threshold itself is checked);
    the project loads 8-bit with threshold 0, and a step syncs as in full precision."""
    eight = dllm_local.load("tiny", quantization="8bit")
    linears = [m for m in eight.model.modules() if type(m).__name__ == "Linear8bitLt"]
    assert linears and all(m.state.threshold == 0.0 for m in linears)
    settings = {"cache": "dual", "unmask": "threshold"}
    assert _step_syncs(eight, settings).total == _step_syncs(tiny, settings).total


# ---------------------------------------------------------------- where the cache lives
def test_each_layers_kv_is_allocated_on_its_blocks_device(tiny):
    """device_map spreads blocks over GPUs; with one device here, block 3 is moved to "meta" (a
    second device that allocates nothing) to stand for another GPU."""
    handle = dllm_local.load("tiny")
    blocks = handle.model.model.transformer.blocks
    blocks[3].to("meta")
    cache = handle.model.new_cache(1, 64)
    assert [k.device.type for k in cache.k] == ["cpu", "cpu", "cpu", "meta", "cpu", "cpu"]
    assert [v.device.type for v in cache.v] == [k.device.type for k in cache.k]
    assert cache.valid.device.type == "cpu"
    # A forward writes each layer's K/V where the layer is: positions and the key mask follow.
    view, seen = cache.alloc(64), {}

    class Where(ForwardObserver):
        def on_attend(self, layer, q, keys, key_mask):
            seen[layer] = (keys.device.type, key_mask.device.type)

    positions = torch.tensor([0, 2, 5])
    attention = Attention(positions, [Segment(view, positions, (Where(),))], BIDIRECTIONAL)
    shape = (1, cache.k[3].shape[1], 3, cache.k[3].shape[3])
    assert attention(3, *(torch.ones(shape, device="meta") for _ in range(3))).device.type == "meta"
    attention(0, *(torch.ones(shape) for _ in range(3)))
    assert seen == {3: ("meta", "meta"), 0: ("cpu", "cpu")} and bool(cache.k[0][0, :, 2].eq(1).all())


# ---------------------------------------------------------------- memory of a full-trace step
def test_a_full_trace_step_allocates_less_than_the_kv_cache(tmp_path):
    """At 1,280 positions on a narrow, deep model (KV far larger than the logits), a full
    recompute with trace "full" and the exact-drift diagnostic allocates under 0.75x the cache:
    the drift comes from dot products per layer, never from a copy of the cache."""
    path = build_llada(tmp_path / "deep", n_layers=48, d_model=128, n_heads=4, n_kv_heads=4, mlp_hidden_size=32,
                       max_sequence_length=1400)
    handle = dllm_local.load(str(path))
    for cache_policy, exact in (("none", False), ("prefix", False), ("none", True)):
        # One step per block: the second step starts block 1, where prefix recomputes everything.
        settings = Settings.from_dict({"gen_length": 1264, "block_size": 316, "steps": 4, "cache": cache_policy,
                                       "unmask": "fixed", "trace": "full", "exact_drift": exact})
        run = dllm_local.stream(handle, PROMPT, settings)
        steps = iter(run)
        next(steps)
        kv_bytes = sum(t.numel() * t.element_size() for t in run.cache.k + run.cache.v)
        with AllocationPeak() as memory:
            record = next(steps)
        assert run.cache.seq_len == 1280 and record.g == 1280  # a full recompute
        print(f"{cache_policy}, exact drift {exact}: peak {memory.peak_bytes / 2**20:.1f} MB, "
              f"KV cache {kv_bytes / 2**20:.1f} MB")
        assert 0 < memory.peak_bytes < 0.75 * kv_bytes


def test_the_allocation_peak_counts_new_storage_only():
    kept = torch.zeros(1000)
    with AllocationPeak() as memory:
        kept.add_(1)  # in place: nothing new
        view = kept[10:]  # a view: nothing new
        big = torch.ones(4000)  # 16,000 bytes
        del big
        small = torch.ones(10)
    assert memory.peak_bytes == 16000 and memory.live_bytes == 40
    assert view.numel() == 990 and small.numel() == 10


# ---------------------------------------------------------------- switching models
def test_switch_model_releases_the_old_model_before_loading(monkeypatch):
    engine = engine_module.Engine(threading.Event(), "tiny")
    old = weakref.ref(engine.handle.model)
    old_alive_at_load = []
    real_load = engine_module.load

    def load(*args, **kwargs):
        gc.collect()
        old_alive_at_load.append(old() is not None)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load", load)
    engine.switch_model("tiny")
    assert old_alive_at_load == [False]
    # A model that fails to load leaves the engine serving the previous one.
    with pytest.raises(ModelLoadError):
        engine.switch_model("/nonexistent/model")
    assert engine.handle.name == "tiny" and engine.describe()["info"]["family"] == "llada"


# ---------------------------------------------------------------- GPU failures
@pytest.mark.parametrize("error, kind", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "oom"),
    (RuntimeError("Error: out of memory in bitsandbytes"), "oom"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "fatal"),
    (RuntimeError("CUDA error: device-side assert triggered"), "fatal"),
    (RuntimeError("shape mismatch"), None),
    (ValueError("out of memory"), None),
])
def test_gpu_failures_are_classified(error, kind):
    assert failures.failure_kind(error) == kind


def _serve_in_a_thread(**spec):
    """The engine's real request loop on a thread (the page's end of the pipe, the thread), with
    this process's thread count, once it has said ``ready``."""
    page, engine_end = multiprocessing.Pipe()
    spec = {"model": "tiny", "threads": torch.get_num_threads(), **spec}
    loop = threading.Thread(target=engine_module.serve, args=(engine_end, threading.Event(), spec), daemon=True)
    loop.start()
    assert page.recv()[1] == "ready"
    return page, loop


@pytest.mark.parametrize("message, expected, engine_ends", [
    ("CUDA error: an illegal memory access was encountered", EngineError, True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", OutOfMemory, False),
])
def test_the_engine_loop_recovers_from_oom_and_ends_on_a_lost_gpu_context(monkeypatch, message, expected, engine_ends):
    """The real request loop, with a run that fails as the GPU would (no GPU can fail here)."""
    def failing_run(self, prompt, settings, emit):
        raise RuntimeError(message)

    monkeypatch.setattr(engine_module.Engine, "run", failing_run)
    page, loop = _serve_in_a_thread()
    try:
        page.send(("1", "run", {"prompt": PROMPT, "settings": {}}, {"alone": True}))
        request_id, kind, error = page.recv()
        assert request_id == "1" and kind == "error" and isinstance(error, expected)
        if engine_ends:  # a lost context ends the process; the session starts a new one
            loop.join(10)
            assert not loop.is_alive()
        else:  # the engine goes on serving
            page.send((None, "close", {}, {}))
            loop.join(10)
            assert not loop.is_alive()
    finally:
        page.close()


def test_the_memory_cap_goes_to_the_allocator_of_the_engines_gpu(monkeypatch):
    """Session(memory_fraction=...) caps the engine process on its GPU. "cuda" names no index,
    which the allocator call requires: the current device's is passed. (CUDA is faked: the
    allocator call is recorded and the model loads on the CPU.)"""
    calls = []
    monkeypatch.setattr(engine_module, "pick_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *args: calls.append(args))
    page, loop = _serve_in_a_thread(memory_fraction=1)
    page.send((None, "close", {}, {}))
    loop.join(10)
    page.close()
    assert calls == [(1.0, 0)] and type(calls[0][0]) is float


def test_a_switch_that_cannot_bring_the_old_model_back_ends_the_engine(monkeypatch):
    page, loop = _serve_in_a_thread()
    try:
        def no_model(*args, **kwargs):
            raise ModelLoadError("the disk is gone")

        monkeypatch.setattr(engine_module, "load", no_model)
        page.send(("1", "switch_model", {"name": "tiny"}, {}))
        _, kind, error = page.recv()
        while kind == "event":  # {"queued": 0}: its turn has come
            _, kind, error = page.recv()
        assert kind == "error" and "the disk is gone" in str(error)
        loop.join(10)
        assert not loop.is_alive()  # no model to serve: the session restarts the engine with its old spec
    finally:
        page.close()


# ---------------------------------------------------------------- dtypes and quantization
def test_auto_dtype_is_bf16_only_where_the_gpu_computes_in_it():
    assert auto_cuda_dtype((7, 5)) == torch.float16  # T4, RTX 20
    assert auto_cuda_dtype((7, 0)) == torch.float16  # V100
    assert auto_cuda_dtype((8, 0)) == torch.bfloat16 and auto_cuda_dtype((9, 0)) == torch.bfloat16
    cpu = torch.device("cpu")
    assert pick_dtype("auto", cpu) == torch.float32 and pick_dtype("auto", cpu, "8bit") == torch.float16


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_4bit_computes_in_the_models_dtype():
    four = dllm_local.load("tiny", quantization="4bit")
    linears = [m for m in four.model.modules() if type(m).__name__ == "Linear4bit"]
    assert linears and all(m.compute_dtype == torch.float32 for m in linears)  # not a hard-coded bf16
    result = dllm_local.generate(four, PROMPT, Settings(gen_length=32))
    assert result.stats.nfe == 32


# ---------------------------------------------------------------- the suite on a CUDA machine
def test_the_suite_runs_on_the_cpu_even_where_a_gpu_is():
    """conftest sets DLLM_LOCAL_DEVICE=cpu: "auto" then means the CPU, in this process and in the
    engine and CLI processes the tests start, so float32 tolerances hold on a CUDA machine too."""
    assert pick_device("auto") == torch.device("cpu")
    assert dllm_local.load("tiny").device.type == "cpu"


@needs_cuda
def test_tiny_on_cuda_in_float32_decodes_as_on_the_cpu(tiny):
    gpu = dllm_local.load("tiny", device="cuda", dtype="float32")
    for cache in ("none", "dual"):
        settings = Settings(gen_length=64, cache=cache)
        assert dllm_local.generate(gpu, PROMPT, settings).token_ids == dllm_local.generate(tiny, PROMPT, settings).token_ids


def test_the_page_takes_a_gpu_memory_share_and_refuses_a_wrong_one(capsys):
    import app

    assert app.parse_args(["--gpu-memory-fraction", "0.5"]).gpu_memory_fraction == 0.5
    assert app.parse_args([]).gpu_memory_fraction is None
    for wrong in ("0", "1.5", "half"):
        with pytest.raises(SystemExit):
            app.parse_args(["--gpu-memory-fraction", wrong])
        assert "share of the GPU's memory in (0, 1]" in capsys.readouterr().err
