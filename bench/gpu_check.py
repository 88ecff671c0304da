"""GPU check: per-step latency of every cache policy on a LLaDA-8B-shaped model, through the real sampler.

    python bench/gpu_check.py                                          # CUDA: bf16 8B, then bf16/4-bit/8-bit
    python bench/gpu_check.py --tiny --device cpu --lengths 64 --prompt 32 --batches 1,4   # a small shape on the CPU
    (add --quantized yes to run the quantized rows on the CPU too; --quantized no skips them)

Needs nothing from the internet: the shape comes from assets/reference (LLaDA-8B-Instruct's
config.json), the weights are random and the tokenizer is the tiny model's (its ids are a subset
of the real vocabulary; the ids it has no text for are banned from drafts, as for any model).

For each generation length (prompt about 256 tokens, block 32) every registered cache policy
decodes through ``dllm_local.stream`` up to the middle block; the steps of that block are
timed from the step records (``model_ms``: device-synchronised forwards). Rows give the block's
first step (a full refresh for all but freecache, whose is the finished block's hand-over) and the
median of its later steps (``flash`` slides a window instead: its prefill and the steps after it), beside the roofline floor max(weight bytes / bandwidth, G x 2 params
/ FLOP rate). A ``generate`` run (dual + threshold 0.9) at each ``--traces`` level (summary
by default) follows end to end, stopped at a time budget: random weights never reach the
threshold, so it commits one token per step, the slowest case.

Quantized weights go through the project's own path: a checkpoint in the LLaDA on-disk format
(safetensors, 8B width, ``--quant-layers`` blocks: writing all 32 would be 16 GB of disk) is
loaded by ``dllm_local.load`` in bf16, 4-bit and 8-bit (transformers' BitsAndBytesConfig). The
blocks are timed apart, so those rows are also projected onto 32 layers (embedding, head and
sampler cost the same at any depth; the blocks scale with it).

The batch sweep (``--batches``, default 1-32) decodes B requests together through
``dllm_local.stream_batch`` on the bf16 model and on the 4-bit checkpoint: a cached step's time
and tokens/s against B, beside the floor of B x block positions (the weight read, shared by the
batch, until the arithmetic overtakes it).

Flash-dLLM as released (``flash`` + ``flash_verify``, the authors' block 16, ``--released-block``)
follows beside Fast-dLLM's pair (``dual`` + ``threshold`` 0.9) and the released cache without its
verify forward (``flash`` + ``threshold`` 0.9), on the bf16 model: batch 1 at every length, and the
other ``--released-batches`` (default 32) at the first. Each forward is timed apart, so a step's
main forward (packed for the whole batch) and its verify forwards (one per request, as
``dllm_local.decoding.batch`` runs an unmasking policy's extra forwards) show separately.

A DiffusionGemma-shaped random model (``--diffusiongemma``, CUDA only): transformers'
DiffusionGemmaConfig with gemma-4-26B-A4B's layer sizes (costmodel.DIFFUSIONGEMMA_26B_A4B_TEXT: 128
experts of width 704, 8 routed per token, a dense MLP beside them) but ``--dg-layers`` of its 30
layers (6 keeps its five sliding layers to one full), written to disk and loaded by
``dllm_local.load`` in bf16 and in 4-bit. Per load: the modules bitsandbytes quantized (only
``nn.Linear`` outside transformers' kept list: the text layers are tied encoder to decoder, so
kept, and the experts are 3-D parameters), the memory beside ``footprint.loaded_bytes``' count and
projected to 30 layers, and a canvas run's decoder passes against the roofline floor
(TargetModel.floor_s: the dense weights, every expert a canvas routes, and the routed arithmetic).

Continuous batching (``--continuous-batches``, default 32; bench/continuous_batching.py): the tiny
tasks' prompts with answers of 32 to 256 tokens (``--continuous-n`` of them) on the bf16 8B shape,
static batches against one continuous batch of as many slots: answers per second, the same tokens,
the forwards each ran.

Block diffusion (``--block-shapes``, CUDA only; bench/gpu_block.py): an SDAR-8B-shaped dense model
(block 4) and a LLaDA2.0-mini-shaped mixture of experts (256 experts, 8 routed, block 32), each with
``--block-layers`` layers, decoded with the exact block cache; their forwards over one block beside
the roofline floor, and the experts routed per layer beside the uniform-routing estimate.

As a library (bench/cuda_smoke.py): ``check(parse_args([...]), probe)`` returns every row, with
the random model's build time and peak memory, and ``probe``'s measurement of each model loaded.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its block-diffusion shapes beside it, however it is loaded
from dllm_local.arguments import COUNT, Counts, LENGTH, LENGTH_LIST, SECONDS, SLOT_COUNT  # noqa: E402
import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import DEVICES, DeviceProfile, machine_name, measure_device  # noqa: E402
from dllm_local.analysis.costmodel import DIFFUSIONGEMMA_26B_A4B_TEXT, Experts, TargetModel, step_floor_s
from dllm_local.models.loading.footprint import loaded_bytes, logical_parameters, stored_bytes, weight_read_bytes
from dllm_local.models import LLaDAConfig, LLaDAModelLM  # noqa: E402
from dllm_local.models import family as families  # noqa: E402
from dllm_local.models.loading.loader import ASSETS, TINY_MODEL, ModelHandle, free_device_memory, load_tokenizer  # noqa: E402
from dllm_local.policies import registry  # noqa: E402
from dllm_local.prompts import encode_prompt  # noqa: E402
from continuous_batching import compare, print_rows, workload  # noqa: E402
from gpu_block import BLOCK_COLUMNS, block_rows, draw_weights  # noqa: E402

REFERENCE = ASSETS / "reference" / "llada-8b-instruct" / "config.json"
REAL_LAYERS = 32  # LLaDA-8B's depth, what the shallow checkpoints are projected onto
# A small shape with the same proportions, for a run on the CPU.
TINY_SHAPE = dict(d_model=256, n_heads=8, n_kv_heads=8, n_layers=4, mlp_hidden_size=768, vocab_size=4096,
                  embedding_size=4096, mask_token_id=4000, eos_token_id=1, pad_token_id=1)
PROMPT_SENTENCE = "Emma has 7 apples. Emma gets 5 more. How many apples does Emma have now? "


# ---------------------------------------------------------------- models
def reference_config(tiny: bool = False, **changes) -> LLaDAConfig:
    """LLaDA-8B-Instruct's config (or the tiny shape), with ``changes`` applied."""
    raw = json.loads(REFERENCE.read_text())
    raw.pop("auto_map")  # names remote code; our own class implements the architecture
    if tiny:
        raw.update(TINY_SHAPE)
    raw.update(changes)
    return LLaDAConfig(**raw)


def build_random(config: LLaDAConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> LLaDAModelLM:
    """A model with random weights, allocated once, directly in ``dtype`` on ``device``.

    Built on the meta device and cast there (free), so ``to_empty`` allocates each tensor in its
    final dtype: materialising in fp32 and casting after would peak at 1.5x the bf16 size (48 GB
    for 8B). The weights are then drawn in place on the device: no CPU copy, no chunking."""
    with torch.device("meta"):
        model = LLaDAModelLM(config)
    model = model.to(dtype).to_empty(device=device)
    draw_weights(model, device, seed)
    return model.eval()


def make_handle(model: torch.nn.Module, name: str, path: Path, quantization: str | None = None) -> ModelHandle:
    """A handle for a model built here rather than loaded, with the tiny model's tokenizer."""
    tokenizer = load_tokenizer(TINY_MODEL, families.get("llada"))
    vocab = tokenizer.get_vocab()
    eos = tokenizer.eos_token_id
    param = next(model.parameters())
    values = dict(
        name=name, path=path, family="llada", model=model, tokenizer=tokenizer, mask_id=model.config.mask_token_id,
        eos_id=eos, stop_ids=tuple(dict.fromkeys([eos] + [vocab[t] for t in ("<|eot_id|>",) if t in vocab])),
        device=param.device, dtype=param.dtype, quantization=quantization, num_parameters=logical_parameters(model),
        memory_bytes=model.get_memory_footprint(), max_length=model.config.max_positions, trained_length=None,
    )
    return ModelHandle(**values)


def write_checkpoint(path: Path, layers: int = 4, tiny: bool = False, device: str | torch.device = "cpu") -> Path:
    """A random LLaDA checkpoint as ``dllm_local.load`` reads one: config.json, bf16 safetensors and
    tokenizer files (the tiny model's), with ``layers`` blocks at the 8B width (or the tiny shape).
    The weights are drawn on ``device`` (fast on a GPU) and written from a CPU copy."""
    path = Path(path)
    if (path / "config.json").exists():
        return path  # written by an earlier section or run
    path.mkdir(parents=True, exist_ok=True)
    model = build_random(reference_config(tiny, n_layers=layers), device, torch.bfloat16)
    state = {k: v.to("cpu") for k, v in model.state_dict().items()}
    model.save_pretrained(path, state_dict=state)
    load_tokenizer(TINY_MODEL, families.get("llada")).save_pretrained(path)
    del model, state
    free_device_memory()
    return path


def quantized_types(model: torch.nn.Module) -> dict[str, int]:
    """How many modules of each Linear kind the blocks hold (Linear4bit, Linear8bitLt or Linear)."""
    kinds = Counter(type(m).__name__ for m in model.model.transformer.blocks.modules())
    return {k: v for k, v in kinds.items() if "Linear" in k}


# ---------------------------------------------------------------- timing
class BlockTimer:
    """Times the transformer blocks of every forward (CUDA events on a GPU, the clock on the CPU),
    so that a model shallower than the real one can be projected onto it. With ``whole``, each
    forward of the model from end to end instead (a step's main forward and its verify forwards
    apart: ``take_each``)."""

    def __init__(self, model: torch.nn.Module, whole: bool = False) -> None:
        self.blocks = model.model.transformer.blocks
        self._first, self._last = (model, model) if whole else (self.blocks[0], self.blocks[-1])
        self.cuda = next(model.parameters()).device.type == "cuda"
        self._spans: list[tuple] = []
        self._hooks: list = []

    def __enter__(self) -> "BlockTimer":
        self._hooks = [self._first.register_forward_pre_hook(lambda m, a: self._mark(start=True)),
                       self._last.register_forward_hook(lambda m, a, o: self._mark(start=False))]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()

    def _mark(self, start: bool) -> None:
        if self.cuda:
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
        else:
            mark = time.perf_counter()
        if start:
            self._spans.append((mark, None))
        else:
            self._spans[-1] = (self._spans[-1][0], mark)

    def take(self) -> float:
        """Milliseconds in the blocks since the last call (the recorder has synchronised by then)."""
        return sum(self.take_each())

    def take_each(self) -> list[float]:
        """Milliseconds of each forward since the last call, in order."""
        each = []
        for begin, end in self._spans:
            if end is None:
                continue
            if self.cuda:
                end.synchronize()
                each.append(begin.elapsed_time(end))
            else:
                each.append((end - begin) * 1e3)
        self._spans.clear()
        return each


def profile_for(device: torch.device, dtype: torch.dtype) -> DeviceProfile:
    """The roofline's device: a named GPU's datasheet figures, else this machine measured."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).replace(" ", "").lower()
        for key in ("H200", "H100", "A100", "RTX 4090", "RTX 3090", "L4"):
            if key.replace(" ", "").lower() in name:
                return DEVICES[key]
    return measure_device(device, dtype)


def prompt_text(handle: ModelHandle, tokens: int) -> str:
    """A prompt that encodes to about ``tokens`` ids through the chat template."""
    tok = handle.tokenizer
    overhead = len(encode_prompt(handle, "x")) - len(tok("x", add_special_tokens=False)["input_ids"])
    ids = tok(PROMPT_SENTENCE * (tokens // 8 + 1), add_special_tokens=False)["input_ids"]
    return tok.decode(ids[: max(1, tokens - overhead)])


def _peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def middle_block_steps(handle: ModelHandle, settings: Settings, prompt: str, timer: BlockTimer,
                       sliding_steps: int = 4) -> list[tuple]:
    """``(record, blocks_ms)`` for each step of the middle block of a real run with ``settings``;
    the run is closed as soon as that block is done. A sliding window (``flash``) has no blocks:
    its first ``sliding_steps`` steps instead, the first of them its one full forward (the prefill;
    what a later step recomputes does not depend on where the window is)."""
    middle = settings.num_blocks // 2
    steps = []
    run = dllm_local.stream(handle, prompt, settings)
    it = iter(run)
    try:
        for record in it:
            blocks_ms = timer.take()
            if run.settings.cache_spec.slides:
                if record.step >= sliding_steps:
                    break
                steps.append((record, blocks_ms))
                continue
            if record.block > middle:
                break
            if record.block == middle:
                steps.append((record, blocks_ms))
    finally:
        it.close()  # ends the generator inside the sampler, so its frame lets go of the cache
        run.release()
    return steps


def policy_settings(policy: str, gen: int, block: int, repeats: int, **changes) -> Settings:
    """A policy row's settings: the fixed schedule with ``repeats + 1`` steps per block (the middle
    block reached in few forwards; the cache policy alone decides what a step recomputes), or, for a
    sliding window, which takes no fixed schedule, threshold 1 (near one token per step); trace off.
    ``changes``: other settings (a forward mode)."""
    slides = registry.CACHE[policy].slides
    return Settings(gen_length=gen, block_size=block, cache=policy, trace="off",
                    steps=None if slides else min(gen, (repeats + 1) * (gen // block)),
                    unmask="threshold" if slides else "fixed", unmask_params={"threshold": 1.0} if slides else {},
                    **changes)


def policy_rows(handle: ModelHandle, label: str, lengths: list[int], prompt: int, block: int, repeats: int,
                profile: DeviceProfile, policies: tuple[str, ...] | None = None) -> list[dict]:
    """One row per cache policy and length: the middle block's first step and the median of its
    next ``repeats`` steps (the fixed schedule with ``repeats + 1`` steps per block gets there in
    few forwards; the cache policy alone decides what a step recomputes)."""
    model, device = handle.model, handle.device
    layers = model.config.n_layers
    blocks = model.model.transformer.blocks
    block_bytes, block_params = stored_bytes(blocks[0]), logical_parameters(blocks[0])
    # What the real depth would weigh: the same non-block part plus REAL_LAYERS blocks.
    read_bytes = weight_read_bytes(model) + (REAL_LAYERS - layers) * block_bytes
    params = logical_parameters(model) + (REAL_LAYERS - layers) * block_params
    text = prompt_text(handle, prompt)
    rows = []
    for gen in lengths:
        for policy in policies or tuple(registry.for_model("masked", registry.CACHE)):
            settings = policy_settings(policy, gen, block, repeats)
            _reset_peak(device)
            with BlockTimer(model) as timer:
                steps = middle_block_steps(handle, settings, text, timer, repeats + 1)
            first, rest = steps[0], steps[1:] or steps[:1]
            step_ms = statistics.median(r.model_ms for r, _ in rest)
            blocks_ms = statistics.median(b for _, b in rest)
            projected = step_ms + (REAL_LAYERS - layers) / layers * blocks_ms
            g = int(statistics.median(r.g for r, _ in rest))
            floor_ms = step_floor_s(read_bytes, params, g, profile) * 1e3
            rows.append({
                "weights": label, "layers": layers, "gen": gen, "prompt": len(encode_prompt(handle, text)),
                "policy": policy, "G_first": first[0].g, "first_ms": first[0].model_ms, "G": g, "step_ms": step_ms,
                "blocks_ms": blocks_ms, "other_ms": statistics.median(r.other_ms for r, _ in rest),
                "step_ms_32L": projected, "floor_ms_32L": floor_ms, "of_floor": floor_ms / projected if projected else 0.0,
                "peak_gb": _peak_gb(device),
            })
    return rows


def generate_run(handle: ModelHandle, gen: int, prompt: int, block: int = 32, trace: str = "summary",
                 budget_s: float = 20.0) -> dict:
    """``generate`` end to end (dual cache, threshold 0.9) through ``dllm_local.stream``, stopped
    between steps once ``budget_s`` has passed: per-step model and other time, the refresh
    forwards apart, and the peak memory."""
    settings = Settings(gen_length=gen, block_size=block, cache="dual", unmask="threshold",
                        unmask_params={"threshold": 0.9}, trace=trace)
    _reset_peak(handle.device)
    run = dllm_local.stream(handle, prompt_text(handle, prompt), settings)
    records, start = [], time.perf_counter()
    for record in run:
        records.append(record)
        if time.perf_counter() - start > budget_s:
            run.stop()  # ends the run before its next step; the result is still built
    wall = time.perf_counter() - start
    stats = run.result.stats
    run.release()
    cached = [r for r in records if not r.full_refresh] or records
    refresh = [r for r in records if r.full_refresh]
    committed = sum(len(r.committed) for r in records)
    return {
        "gen": gen, "trace": trace, "steps": len(records), "finished": not stats.stopped, "wall_s": wall,
        "tokens_per_step": committed / max(1, len(records)),
        "refresh_ms": statistics.median(r.model_ms for r in refresh) if refresh else None,
        "model_ms": statistics.median(r.model_ms for r in cached),
        "other_ms": statistics.median(r.other_ms for r in cached),
        # One token per step: the full run takes about gen steps and a refresh per block.
        "full_run_s_est": (gen * statistics.median(r.model_ms + r.other_ms for r in cached)
                           + (gen // block) * (statistics.median(r.model_ms for r in refresh) if refresh else 0.0)) / 1e3,
        "peak_gb": _peak_gb(handle.device),
    }


def batch_rows(handle: ModelHandle, label: str, batches: list[int], gen: int, prompt: int, block: int,
               profile: DeviceProfile, steps: int = 4) -> list[dict]:
    """The batch sweep: ``B`` requests decoded together (dual cache, one token per step, as random
    weights give) for each ``B``; per forward, the median of ``steps`` cached steps after the
    first refresh, beside the roofline floor of ``B`` x block positions. Tokens/s is ``B`` per
    step: the weight read is shared until the arithmetic of the batch's positions overtakes it."""
    model, device = handle.model, handle.device
    layers = model.config.n_layers
    blocks = model.model.transformer.blocks
    read_bytes = weight_read_bytes(model) + (REAL_LAYERS - layers) * stored_bytes(blocks[0])
    params = logical_parameters(model) + (REAL_LAYERS - layers) * logical_parameters(blocks[0])
    settings = Settings(gen_length=gen, block_size=block, cache="dual", unmask="fixed", trace="off")
    text = prompt_text(handle, prompt)
    rows = []
    for batch in batches:
        _reset_peak(device)
        run = dllm_local.stream_batch(handle, [text] * batch, settings)
        forwards: dict[int, tuple[bool, float]] = {}  # step -> (a refresh, model ms), from request 0
        it = iter(run)
        try:
            for request, record in it:
                if request == 0:
                    forwards[record.step] = (record.full_refresh, record.model_ms)
                if len(forwards) > steps + 1:
                    break
        finally:
            it.close()
        refresh = [ms for full, ms in forwards.values() if full]
        cached = [ms for full, ms in forwards.values() if not full] or refresh
        step_ms = statistics.median(cached)
        floor_ms = step_floor_s(read_bytes, params, batch * block, profile) * 1e3
        rows.append({"weights": label, "layers": layers, "gen": gen, "batch": batch, "refresh_ms": refresh[0] if refresh else None,
                     "step_ms": step_ms, "tokens_per_s": batch / step_ms * 1e3, "floor_ms_32L": floor_ms,
                     "bound": "compute" if batch * block * 2 * params / profile.flops > read_bytes / profile.bandwidth else "read",
                     "peak_gb": _peak_gb(device)})
        del run, it
        free_device_memory()
    return rows


# Flash-dLLM as released (cache flash, unmasking flash_verify, the authors' defaults) beside
# Fast-dLLM's pair and the released cache without its verify forward, at the authors' block size.
RELEASED_PAIRS = {
    "dual + threshold": {"cache": "dual", "unmask": "threshold", "unmask_params": {"threshold": 0.9}},
    "flash + threshold": {"cache": "flash", "unmask": "threshold", "unmask_params": {"threshold": 0.9}},
    "flash + flash_verify": {"cache": "flash", "unmask": "flash_verify", "unmask_params": {}},
}


def released_rows(handle: ModelHandle, label: str, gen: int, prompt: int, block: int, batch: int, steps: int,
                  profile: DeviceProfile) -> list[dict]:
    """The released pair and its two references, ``batch`` requests of the same prompt decoded
    together (``dllm_local.stream`` at 1, ``stream_batch`` above): per step, after the first (the
    prefill), the main forward, the verify forwards (each timed apart: a batch's main forward is
    packed, its verify forwards run per request), the step's wall time and the tokens it
    committed, medians over ``steps`` steps that refresh nothing. Random weights never reach the
    threshold: one token per request per step, and flash_verify checks block / 2 drafts every step
    and accepts none, so its rows are the verify forward's cost without its gain. The floor: the
    main forward's at its G, plus one weight read (at 2 x block rows) per verify forward."""
    model, device = handle.model, handle.device
    layers = model.config.n_layers
    blocks = model.model.transformer.blocks
    read_bytes = weight_read_bytes(model) + (REAL_LAYERS - layers) * stored_bytes(blocks[0])
    params = logical_parameters(model) + (REAL_LAYERS - layers) * logical_parameters(blocks[0])
    text = prompt_text(handle, prompt)
    rows = []
    for pair, changes in RELEASED_PAIRS.items():
        settings = Settings(gen_length=gen, block_size=block, trace="off", **changes)
        _reset_peak(device)
        run = (dllm_local.stream(handle, text, settings) if batch == 1
               else dllm_local.stream_batch(handle, [text] * batch, settings))
        per_step: dict[int, dict] = {}  # step -> what the batch's step did
        with BlockTimer(model, whole=True) as timer:
            it = iter(run)
            last = time.perf_counter()
            try:
                for item in it:
                    request, record = item if batch > 1 else (0, item)
                    if request == 0:  # a step's records all come after its forwards
                        if len(per_step) > steps:
                            break
                        now = time.perf_counter()
                        spans = timer.take_each()
                        per_step[record.step] = {"wall_ms": (now - last) * 1e3, "main_ms": spans[0] if spans else 0.0,
                                                 "verify_ms": sum(spans[1:]), "forwards": len(spans),
                                                 "refresh": record.full_refresh, "g": 0, "committed": 0}
                        last = now
                    step = per_step.get(record.step)
                    if step is not None:
                        step["g"] += record.g
                        step["committed"] += len(record.committed)
            finally:
                it.close()
                run.release()
        timed_steps = [v for k, v in per_step.items() if k > 0 and not v["refresh"]] or list(per_step.values())
        median = lambda key: statistics.median(v[key] for v in timed_steps)  # noqa: E731
        g, forwards = int(median("g")), statistics.mean(v["forwards"] for v in timed_steps)
        floor_ms = (step_floor_s(read_bytes, params, g, profile)
                    + (forwards - 1) * step_floor_s(read_bytes, params, 2 * block, profile)) * 1e3
        step_ms = median("wall_ms")
        tokens = statistics.mean(v["committed"] for v in timed_steps)
        rows.append({"weights": label, "layers": layers, "gen": gen, "block": block, "batch": batch, "pair": pair,
                     "steps": len(timed_steps), "prefill_ms": per_step[0]["wall_ms"] if 0 in per_step else None,
                     "G": g, "forwards": forwards, "main_ms": median("main_ms"), "verify_ms": median("verify_ms"),
                     "step_ms": step_ms, "tokens_per_step": tokens, "tokens_per_s": tokens / step_ms * 1e3,
                     "floor_ms_32L": floor_ms, "peak_gb": _peak_gb(device)})
        del run, it
        free_device_memory()
    return rows


# ---------------------------------------------------------------- the report
def _print_table(columns: list[tuple[str, int, str]], rows: list[dict]) -> None:
    """Columns as (row key, width, format spec); a None value prints as "-"."""
    head = " ".join(f"{key:>{width}}" for key, width, _ in columns)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(" ".join(f"{'-' if r[key] is None else format(r[key], spec):>{width}}" for key, width, spec in columns))


def print_policy_rows(rows: list[dict]) -> None:
    _print_table([("weights", 13, ""), ("layers", 6, ""), ("gen", 5, ""), ("prompt", 6, ""), ("policy", 13, ""),
                  ("G_first", 7, ""), ("first_ms", 9, ".2f"), ("G", 5, ""), ("step_ms", 8, ".2f"),
                  ("blocks_ms", 9, ".2f"), ("other_ms", 8, ".2f"), ("step_ms_32L", 11, ".2f"),
                  ("floor_ms_32L", 12, ".3f"), ("of_floor", 8, ".2f"), ("peak_gb", 7, ".1f")], rows)


def print_generate_rows(rows: list[dict]) -> None:
    _print_table([("weights", 10, ""), ("gen", 5, ""), ("trace", 8, ""), ("steps", 5, ""), ("finished", 8, ""),
                  ("tokens_per_step", 15, ".2f"), ("refresh_ms", 10, ".2f"), ("model_ms", 8, ".2f"),
                  ("other_ms", 8, ".2f"), ("full_run_s_est", 14, ".1f"), ("peak_gb", 7, ".1f")], rows)


def print_batch_rows(rows: list[dict]) -> None:
    _print_table([("weights", 10, ""), ("layers", 6, ""), ("gen", 5, ""), ("batch", 5, ""), ("refresh_ms", 10, ".2f"),
                  ("step_ms", 8, ".2f"), ("tokens_per_s", 12, ".1f"), ("floor_ms_32L", 12, ".3f"), ("bound", 7, ""),
                  ("peak_gb", 7, ".1f")], rows)


def print_released_rows(rows: list[dict]) -> None:
    _print_table([("weights", 10, ""), ("gen", 5, ""), ("block", 5, ""), ("batch", 5, ""), ("pair", 20, ""),
                  ("G", 5, ""), ("forwards", 8, ".1f"), ("prefill_ms", 10, ".2f"), ("main_ms", 8, ".2f"),
                  ("verify_ms", 9, ".2f"), ("step_ms", 8, ".2f"), ("tokens_per_s", 12, ".1f"),
                  ("floor_ms_32L", 12, ".3f"), ("peak_gb", 7, ".1f")], rows)


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a small shape (for a CPU smoke run)")
    ap.add_argument("--lengths", type=LENGTH_LIST, default="256,512,1024")
    ap.add_argument("--prompt", type=COUNT, default=256, help="prompt tokens (about: the chat template's included)")
    ap.add_argument("--block", type=LENGTH, default=32)
    ap.add_argument("--repeats", type=COUNT, default=3, help="timed steps per policy after the block's first")
    ap.add_argument("--generate-budget", type=SECONDS, default=20.0, help="seconds per generate run")
    ap.add_argument("--traces", default="summary", help="the trace levels of the generate runs, comma-separated")
    ap.add_argument("--quantized", choices=("auto", "yes", "no"), default="auto",
                    help="bf16/4-bit/8-bit rows from a checkpoint on disk; auto: on CUDA only (bitsandbytes on "
                         "the CPU is slow, and the CPU run is a smoke test)")
    ap.add_argument("--quant-layers", type=COUNT, default=4, help="blocks in the checkpoint for the quantized rows")
    ap.add_argument("--quant-checkpoint", default=None,
                    help="folder for that checkpoint (reused when it holds one); default: a temporary folder")
    ap.add_argument("--batches", type=Counts(SLOT_COUNT, empty=True), default="1,2,4,8,16,32",
                    help="the batch sweep's sizes (empty: no sweep), at the first --lengths, bf16 and 4-bit")
    ap.add_argument("--released-batches", type=Counts(SLOT_COUNT, empty=True), default="1,32",
                    help="Flash-dLLM as released beside dual + threshold and flash + threshold: batch 1 at every "
                         "--lengths, the larger sizes at the first (empty: none)")
    ap.add_argument("--released-block", type=LENGTH, default=16, help="their block size (16: the authors')")
    ap.add_argument("--released-steps", type=COUNT, default=4, help="timed steps per released row, after the prefill")
    ap.add_argument("--diffusiongemma", choices=("auto", "no"), default="auto",
                    help="the DiffusionGemma-shaped rows (26B-A4B layer sizes, bf16 and 4-bit); auto: on CUDA only "
                         "(its layers are 26B-wide)")
    ap.add_argument("--dg-layers", type=COUNT, default=6, help="layers of the DiffusionGemma-shaped model (of 30)")
    ap.add_argument("--dg-steps", type=COUNT, default=4, help="decoder passes timed per DiffusionGemma load")
    ap.add_argument("--block-shapes", choices=("auto", "no"), default="auto",
                    help="the block-diffusion shapes (SDAR-8B, LLaDA2.0-mini; bench/gpu_block.py): auto runs them on CUDA")
    ap.add_argument("--block-layers", type=COUNT, default=4, help="layers of each block-diffusion shape")
    ap.add_argument("--block-gen", type=LENGTH, default=128, help="answer tokens of each block-diffusion run")
    ap.add_argument("--continuous-batches", type=Counts(SLOT_COUNT, empty=True), default="32",
                    help="static against continuous batching at these sizes (empty: none)")
    ap.add_argument("--continuous-n", type=COUNT, default=64, help="problems of the continuous-batching workload")
    ap.add_argument("--json", default=None, help="also write the rows here")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


Probe = Callable[[ModelHandle], dict]


def check(args: argparse.Namespace, probe: Probe | None = None) -> dict:
    """Every measurement of the module docstring, printed as it goes and returned as rows.
    ``probe``, when given, measures more of each model (the random one and each checkpoint load)
    while it is loaded; its results are kept under "probes", by the model's weights label."""
    batches = args.batches
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = args.lengths
    profile = profile_for(device, dtype)
    t0 = time.perf_counter()

    _reset_peak(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    model = build_random(reference_config(args.tiny), device, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # What building added at its highest: the weights alone, if nothing was made in fp32 first.
    build = {"seconds": time.perf_counter() - t0, "weights_gb": weights / 2**30,
             "peak_gb": None if device.type != "cuda" else (torch.cuda.max_memory_allocated(device) - before) / 2**30}
    handle = make_handle(model, "random-8b-shape", REFERENCE.parent)
    del model
    label = str(dtype).replace("torch.", "")
    peak = "" if build["peak_gb"] is None else f", peak while building {build['peak_gb']:.2f} GB"
    print(f"machine: {machine_name()} | roofline: {profile.name} ({profile.bandwidth / 1e12:.3g} TB/s, "
          f"{profile.flops / 1e12:.3g} TFLOP/s) | {handle.num_parameters / 1e9:.2f}B parameters built in "
          f"{build['seconds']:.1f}s, {build['weights_gb']:.2f} GB{peak}", flush=True)
    rows = policy_rows(handle, label, lengths, args.prompt, args.block, args.repeats, profile)
    generated = [{"weights": label, **generate_run(handle, gen, args.prompt, args.block, trace, args.generate_budget)}
                 for gen in lengths for trace in args.traces.split(",")]
    swept = batch_rows(handle, label, batches, lengths[0], args.prompt, args.block, profile)
    released = [row for gen in lengths for batch in args.released_batches if batch == 1 or gen == lengths[0]
                for row in released_rows(handle, label, gen, args.prompt, args.released_block, batch,
                                         args.released_steps, profile)]
    continuous = continuous_rows(handle, args)
    probes = {label: probe(handle)} if probe else {}
    del handle
    free_device_memory()

    quantized: list[dict] = []
    if args.quantized == "yes" or (args.quantized == "auto" and device.type == "cuda"):
        quantized = check_quantized(args, device, lengths, profile, rows, batches, swept, probes, probe)

    canvas = diffusiongemma_rows(args, device, profile)
    blocks = (block_rows(args.block_layers, args.block_gen, PROMPT_SENTENCE, device, profile)
              if args.block_shapes == "auto" and device.type == "cuda" else [])

    print_policy_rows(rows)
    print()
    print_generate_rows(generated)
    print()
    print_batch_rows(swept)
    if released:
        print()
        print_released_rows(released)
    for q in quantized:
        print(f"{q['weights']}: {q['types']}; {q['params_true'] / 1e9:.3f}B parameters (handle says "
              f"{q['params_handle'] / 1e9:.3f}B); footprint {q['footprint_gb']:.2f} GB, projected to {REAL_LAYERS} layers "
              f"{q['footprint_gb_32L']:.2f} GB")
    print(f"total {time.perf_counter() - t0:.0f}s. 'first' is the middle block's first step (a full refresh for every "
          f"policy but freecache; for flash, which slides a window instead of blocks, its one full forward, the "
          f"prefill), 'step' the median of its later steps; '32L' projects the blocks onto {REAL_LAYERS} layers")
    if released:
        print("released rows: Flash-dLLM as released (flash + flash_verify) beside dual + threshold 0.9 and flash + "
              "threshold 0.9; per step after the prefill: G and forwards over the whole batch, main_ms the (packed) "
              "main forward, verify_ms the verify forwards (one per request), step_ms the step's wall time; random "
              "weights commit one token per request per step and flash_verify accepts none")
    if continuous:
        print()
        print_rows(continuous)
        print("continuous rows: the tiny tasks' prompts, answers of 32 to 256 tokens, dual + threshold 0.9 (random "
              "weights: one token a step), static batches against one continuous batch of as many slots")
    if canvas:
        print()
        print_diffusiongemma_rows(canvas)
    if blocks:
        print()
        _print_table(BLOCK_COLUMNS, blocks)
        print("block rows: the block cache + threshold 0.9 (random weights: one token a step); step_ms the median "
              "forward over one block (denoising and K/V stores alike), floor_ms the roofline of the same shallow "
              "model (dense weights, the experts G tokens choose), experts_read the distinct experts a step's tokens "
              "routed per layer; step_ms_real projects linearly to the release's depth, beside its floor")
    out = {"build": build, "policies": rows, "generate": generated, "quantized": quantized, "batches": swept,
           "continuous": continuous,
           "released": released, "probes": probes, "diffusiongemma": canvas, "block": blocks}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


def continuous_rows(handle: ModelHandle, args: argparse.Namespace) -> list[dict]:
    """Static against continuous batching (bench/continuous_batching.py) on the 8B shape, at each
    ``--continuous-batches``; a failure is printed and leaves the other rows standing."""
    prompts, settings = workload(args.continuous_n)
    rows = []
    for batch in args.continuous_batches:
        try:
            rows.append(compare(handle, prompts, settings, batch))
        except Exception as exc:  # noqa: BLE001 - the first CUDA run of this path: say what broke, keep the rest
            print(f"continuous batching at batch {batch} failed: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"continuous batching at batch {batch}: {rows[-1]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    check(parse_args(argv))
    return 0


def check_quantized(args: argparse.Namespace, device: torch.device, lengths: list[int], profile: DeviceProfile,
                    rows: list[dict], batches: list[int], swept: list[dict], probes: dict, probe: Probe | None) -> list[dict]:
    """The checkpoint on disk loaded by ``dllm_local.load`` as is, in 4-bit and in 8-bit; appends
    their dual-cache rows to ``rows`` (4-bit's batch sweep to ``swept``, ``probe``'s results to
    ``probes``) and returns what each load holds."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        print("quantized rows skipped: bitsandbytes is not installed", flush=True)
        return []
    folder = Path(args.quant_checkpoint) if args.quant_checkpoint else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    out = []
    try:
        t = time.perf_counter()
        write_checkpoint(folder, args.quant_layers, args.tiny, device)
        print(f"checkpoint ({args.quant_layers} layers) ready in {time.perf_counter() - t:.1f}s", flush=True)
        for quantization in (None, "4bit", "8bit"):
            try:
                handle = dllm_local.load(str(folder), device=str(device), quantization=quantization)
            except dllm_local.ModelLoadError as exc:
                print(f"{quantization or 'unquantized'} load skipped: {exc}", flush=True)
                continue
            label = quantization or "ckpt-" + str(handle.dtype).replace("torch.", "")
            per_block = stored_bytes(handle.model.model.transformer.blocks[0])
            footprint = handle.memory_bytes
            out.append({"weights": label, "types": quantized_types(handle.model), "params_true": logical_parameters(handle.model),
                        "params_handle": handle.num_parameters, "footprint_gb": footprint / 2**30,
                        "footprint_gb_32L": (footprint + (REAL_LAYERS - args.quant_layers) * per_block) / 2**30})
            rows += policy_rows(handle, label, lengths, args.prompt, args.block, args.repeats, profile, ("dual", "prefix"))
            if quantization == "4bit":
                swept += batch_rows(handle, label, batches, lengths[0], args.prompt, args.block, profile)
            if probe:
                probes[label] = probe(handle)
            del handle
            free_device_memory()
    finally:
        if not args.quant_checkpoint:
            shutil.rmtree(folder, ignore_errors=True)
    return out


# ---------------------------------------------------------------- DiffusionGemma (mixture of experts)
DG_REAL_LAYERS = DIFFUSIONGEMMA_26B_A4B_TEXT["num_hidden_layers"]
TINY_DIFFUSIONGEMMA = ASSETS / "models" / "tiny-diffusiongemma"  # its tokenizer and generation config
DG_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def diffusiongemma_config(layers: int, text: dict = DIFFUSIONGEMMA_26B_A4B_TEXT, vision: dict | None = None):
    """transformers' DiffusionGemmaConfig with the ``text`` sizes (26B-A4B's) at ``layers`` layers,
    the released pattern of five sliding layers to one full (the last one full); ``vision``: the
    vision tower's sizes, transformers' default when None (text never runs it)."""
    from transformers import DiffusionGemmaConfig

    types = ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)]
    return DiffusionGemmaConfig(text_config={**text, "num_hidden_layers": layers, "layer_types": types},
                                vision_config=vision)


def write_diffusiongemma(path: Path, config, device: torch.device) -> Path:
    """A random DiffusionGemma checkpoint of ``config`` as ``dllm_local.load`` reads one: bf16
    safetensors drawn on ``device`` (written from a CPU copy), the tiny model's tokenizer and
    generation config (its ids are a subset of the real vocabulary). Allocated once in bf16, as
    ``build_random`` does: built on the meta device, then emptied onto ``device``."""
    from transformers import DiffusionGemmaForBlockDiffusion

    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    model = model.to(torch.bfloat16).to_empty(device=device)
    # transformers' own initialisation, drawn on the device: the weights, the persistent buffers
    # (each layer's scalar) that to_empty left unset, and the ties between encoder and decoder.
    torch.manual_seed(0)
    model.init_weights()
    model.save_pretrained(path, state_dict={k: v.to("cpu") for k, v in model.state_dict().items()})
    for name in DG_FILES:
        shutil.copy(TINY_DIFFUSIONGEMMA / name, path / name)
    del model
    free_device_memory()
    return path


def diffusiongemma_target(handle: ModelHandle) -> TargetModel:
    """The loaded shallow model as the roofline sees it, projected onto the real depth: its bytes
    as stored (packed where quantized) with every expert, and the arithmetic of the routed ones."""
    text = handle.model.config.text_config
    layers = handle.model.model.decoder.layers
    added = DG_REAL_LAYERS - len(layers)
    experts = Experts(text.num_experts, text.top_k_experts, DG_REAL_LAYERS, stored_bytes(layers[0].experts) / text.num_experts)
    expert_params = logical_parameters(layers[0].experts) / text.num_experts
    all_bytes = weight_read_bytes(handle.model) + added * stored_bytes(layers[0])
    dense_params = (logical_parameters(handle.model.model.decoder) + added * logical_parameters(layers[0])
                    - DG_REAL_LAYERS * text.num_experts * expert_params)
    return TargetModel(f"random DiffusionGemma, {DG_REAL_LAYERS} layers",
                       dense_params + DG_REAL_LAYERS * text.top_k_experts * expert_params, all_bytes, experts)


def diffusiongemma_rows(args: argparse.Namespace, device: torch.device, profile: DeviceProfile) -> list[dict]:
    """Per load (bf16, 4-bit): what was quantized, the memory (measured, counted by
    ``footprint.loaded_bytes``, projected to 30 layers) and the median decoder pass of a canvas run
    beside its roofline floor. Only on CUDA: elsewhere it says so and returns no rows."""
    if args.diffusiongemma == "no" or device.type != "cuda":
        if args.diffusiongemma != "no":
            print("DiffusionGemma rows skipped: they need CUDA", flush=True)
        return []
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_dg_"))
    rows = []
    try:
        t = time.perf_counter()
        write_diffusiongemma(folder, diffusiongemma_config(args.dg_layers), device)
        print(f"DiffusionGemma checkpoint ({args.dg_layers} of {DG_REAL_LAYERS} layers) ready in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        for quantization in (None, "4bit"):
            _reset_peak(device)
            try:
                handle = dllm_local.load(str(folder), device=str(device), quantization=quantization)
            except dllm_local.ModelLoadError as exc:
                print(f"DiffusionGemma {quantization or 'bf16'} load skipped: {exc}", flush=True)
                continue
            rows.append(diffusiongemma_row(handle, quantization, args.dg_steps, profile))
            del handle
            free_device_memory()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def diffusiongemma_row(handle: ModelHandle, quantization: str | None, steps: int, profile: DeviceProfile) -> dict:
    """One load's row: its quantized modules, memory and timed decoder passes (one canvas)."""
    model = handle.model
    layers = model.model.decoder.layers
    canvas = model.config.canvas_length
    settings = Settings(gen_length=canvas, block_size=canvas, trace="off", canvas_params={"max_denoising_steps": steps})
    run = dllm_local.stream(handle, prompt_text(handle, 256), settings)
    passes = [record.model_ms for record in run]
    stats = run.result.stats
    run.release()
    target = diffusiongemma_target(handle)
    added = (DG_REAL_LAYERS - len(layers)) * stored_bytes(layers[0])
    return {"weights": quantization or "bf16", "layers": len(layers),
            "linears": ", ".join(f"{n} {kind}" for kind, n in sorted(_linear_kinds(model).items())),
            "memory_gb": handle.memory_bytes / 2**30,
            "counted_gb": loaded_bytes(meta_twin(model), quantization, handle.dtype.itemsize) / 2**30,
            "memory_gb_30L": (handle.memory_bytes + added) / 2**30, "peak_gb": _peak_gb(handle.device),
            "G": canvas, "pass_ms": statistics.median(passes), "encoder_ms": stats.encoder_s * 1e3,
            "experts_read": target.experts.distinct(canvas),
            "floor_ms_30L": target.floor_s(canvas, profile) * 1e3}


def meta_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The unquantized shapes of a loaded DiffusionGemma (on the meta device: no memory), which
    ``footprint.loaded_bytes`` counts."""
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):
        return DiffusionGemmaForBlockDiffusion(model.config)


def _linear_kinds(model: torch.nn.Module) -> Counter:
    """Linear weights per module kind (nn.Linear, bitsandbytes' Linear4bit or Linear8bitLt; the
    subclasses of nn.Linear), a weight tied to several modules (encoder and decoder) once."""
    kinds = {id(m.weight): type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return Counter(kinds.values())


def print_diffusiongemma_rows(rows: list[dict]) -> None:
    _print_table([("weights", 7, ""), ("layers", 6, ""), ("linears", 30, ""), ("memory_gb", 9, ".2f"),
                  ("counted_gb", 10, ".2f"), ("memory_gb_30L", 13, ".2f"), ("peak_gb", 7, ".1f"), ("G", 4, ""),
                  ("pass_ms", 8, ".2f"), ("encoder_ms", 10, ".2f"), ("experts_read", 12, ".1f"),
                  ("floor_ms_30L", 12, ".3f")], rows)
    print(f"DiffusionGemma rows: transformers' DiffusionGemmaConfig at gemma-4-26B-A4B's layer sizes, {rows[0]['layers']} "
          f"of {DG_REAL_LAYERS} layers, random weights; memory as loaded, counted by footprint.loaded_bytes and "
          f"projected to {DG_REAL_LAYERS} layers; pass_ms the median decoder pass of one canvas (G positions), "
          f"encoder_ms the encoder's passes; floor_ms_30L the roofline at {DG_REAL_LAYERS} layers (every expert a "
          f"canvas routes read: experts_read per layer)")


if __name__ == "__main__":
    sys.exit(main())
