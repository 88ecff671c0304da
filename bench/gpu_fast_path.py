"""Eager against the fast path (CUDA graphs or compiled), LLaDA-8B shape: the one prepared script for a lent GPU.

    python bench/gpu_fast_path.py --released /path/to/Flash-dLLM/llada --out fast_path.json
    python bench/gpu_fast_path.py --tiny --device cpu --lengths 64 --prompt 32 --batches 1,2 --fast compiled

The second is the CPU dry run (the tiny shape, one torch thread, inductor compiling for the CPU:
about two minutes).

Needs only the repository's requirements (torch with CUDA as installed there) and no network; the
released Flash-dLLM comparison runs only with ``--released`` (a copy of VILA-Lab/Flash-dLLM's
``llada/`` folder, never vendored here; its generator imports triton and transformers, which a
CUDA torch and requirements.txt bring). It aims at 6-7 minutes on an H100 with start-up:
``--time-budget`` (seconds from the start, default 330) skips the rows left once it is spent, each
with a printed note (a row started before then may still compile for a minute or two), since a
device lent for 15 minutes must have time to run it twice. A row that fails is printed with its
error and the others still run.

The model is bench/gpu_check.py's: LLaDA-8B-Instruct's shape with random weights, bf16 on CUDA
(float32 and the tiny shape with ``--tiny`` on the CPU), the tiny model's tokenizer, a prompt of
about ``--prompt`` tokens, block ``--block``. Every forward runs through ``dllm_local.runner``: a run's
``forward_mode`` picks eager or the fast mode (``--fast``: ``graphs``, compiled and replayed as CUDA
graphs, or ``compiled``). What is measured, in the order of priority the rows run in (the
first length first; the other lengths last):

- per cache policy and length, batch 1: the median forward time (``model_ms``, device-synchronised)
  of the middle block's steps after its first (a sliding window: the steps after its prefill),
  eager and fast, beside the roofline floor at the step's G (gpu_check's settings: the fixed
  schedule, or threshold 1 for the sliding window); whether the two modes committed the same
  tokens (greedy, same seed); the fast mode's first run timed apart (its compiles and captures:
  ``compile_s`` is that run's wall time less the second's), the shapes the runner has met and the
  graphs dynamo compiled (a forward compiles again for what its shape does not show: a policy's
  observers), the mode that actually ran and any fallback notice (``ForwardRunner.notice``, never
  silent);
- one DualCache step under torch.profiler, eager and fast: the host's time from its first
  launch to its last, against the GPU's busy time (the kernels' durations summed);
- batches (``--batches``, first length): dual + threshold 0.9 through ``dllm_local.stream_batch``
  in each mode, the cached step's time against the floor of B x block positions. A batch's main
  forward is packed (``ForwardRunner.packed``), compiled or captured per number of requests and
  packed length in the fast modes;
- batch invariance (``--invariance`` problems of the tiny tasks, answers of 16 or 32, block 16,
  eager, in batches of ``--invariance-batch``; bench/batch_invariance.py's comparison): how many
  problems packed continuous, packed static and invariant batching (app.py --batch-mode) give the
  tokens they give alone (bf16 kernels follow the packed shape; invariant runs each request's own
  forward), and the invariant mode's answer tokens/s against packed continuous, its cost;
- with ``--released``: the released generator (``generate_with_Flash_dLLM``, verify on) on this
  same model (its modules built empty and given these weights, its logits held to the ids our
  drafts may be) against ``flash`` + ``flash_verify`` with the release's defaults at its block
  (``--released-block``, 16): tokens/s both sides, batch 1 and 32 (if in ``--batches``), and
  whether the answers are the same text (the release returns text only);
- targets: the DualCache step at batch 1 within 1.5x its floor, a full forward (cache none)
  within 1.3x, the batch-32 step within 1.5x, flash + flash_verify at 1.2x the released tokens/s.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable, TypeVar
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dllm_local.arguments import COUNT, Count, LENGTH, LENGTH_LIST, SECONDS, SLOT_COUNT, SLOT_LIST  # noqa: E402
import dllm_local  # noqa: E402
from dllm_local import Settings, StepRecord  # noqa: E402
from dllm_local.analysis.costmodel import step_floor_s  # noqa: E402
from dllm_local.devices import DeviceProfile, machine_name  # noqa: E402
from dllm_local.models.loading.footprint import logical_parameters, weight_read_bytes  # noqa: E402
from dllm_local.models.loading.loader import ModelHandle, free_device_memory  # noqa: E402
from dllm_local.policies import registry  # noqa: E402
from dllm_local.prompts import encode_prompt  # noqa: E402
from dllm_local.runner import ForwardRunner, runner_for  # noqa: E402
from batch_invariance import compare as invariance_compare, print_comparison  # noqa: E402
from continuous_batching import workload  # noqa: E402
from cuda_smoke import profile_step, torch_threads  # noqa: E402
from gpu_check import (REFERENCE, _print_table, build_random, make_handle, policy_settings, profile_for,  # noqa: E402
                       prompt_text, reference_config)

T = TypeVar("T")
EAGER = "eager"
# The targets: the steps' times at most these multiples of their floors; our tokens/s at least this
# multiple of the release's.
DUAL_TARGET, FULL_TARGET, BATCH_TARGET, RELEASED_TARGET = 1.5, 1.3, 1.5, 1.2
TARGET_BATCH = 32
BATCH_THRESHOLD = 0.9  # Fast-dLLM's: random weights never reach it, one token per request per step
PACKED_NOTE = ("a batch's main forward is packed (ForwardRunner.packed): the fast rows run it compiled or as CUDA "
               "graphs, one per number of requests and packed length")


# ---------------------------------------------------------------- the time budget
class Guard:
    """Runs each row within the time budget (counted from the start): once it is spent, the rows
    left are skipped with a note; a row that fails is noted with its error, and the others still
    run (the device is lent once)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds
        self.skipped: list[str] = []
        self.failed: list[str] = []

    def run(self, row: str, measure: Callable[[], T]) -> T | None:
        if time.perf_counter() >= self.deadline:
            self.skipped.append(row)
            print(f"skipped, over the time budget: {row}", flush=True)
            return None
        try:
            return measure()
        except Exception as exc:  # noqa: BLE001 -- say what broke, keep the rest
            self.failed.append(f"{row}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            print(f"failed: {self.failed[-1]}", flush=True)
            free_device_memory()
            return None


# ---------------------------------------------------------------- decoding
@dataclass
class Decoded:
    """A run's step records up to the end of its middle block (a sliding window: its first steps),
    and the wall time they took."""
    records: list[StepRecord]
    seconds: float
    middle: int | None  # the middle block; None for a sliding window

    def step_tokens(self) -> list[list[tuple[int, int]]]:
        """Each step's commits, (position, token)."""
        return [[(position, token) for position, token, _ in record.committed] for record in self.records]

    def first_difference(self, other: Decoded) -> int | None:
        """The first step whose commits differ from ``other``'s (bf16 kernels that round apart
        diverge late; a wrong forward, at once); None when the runs committed the same."""
        pairs = zip_longest(self.step_tokens(), other.step_tokens())
        return next((step for step, (mine, theirs) in enumerate(pairs) if mine != theirs), None)

    def timed(self) -> list[StepRecord]:
        """The steps timed: the middle block's after its first (a full refresh for all but freecache,
        whose first is the finished block's hand-over), or a sliding window's after its prefill."""
        if self.middle is None:
            return self.records[1:] or self.records
        block = [r for r in self.records if r.block == self.middle]
        return block[1:] or block


def decode_to_middle(handle: ModelHandle, prompt: str, settings: Settings, sliding_steps: int) -> Decoded:
    """``settings``' run until its middle block is done (a sliding window, which has no blocks:
    ``sliding_steps`` steps); the run is closed there, so its cache is let go."""
    slides = settings.cache_spec.slides
    middle = None if slides else settings.num_blocks // 2
    run = dllm_local.stream(handle, prompt, settings)
    records: list[StepRecord] = []
    t = time.perf_counter()
    it = iter(run)
    try:
        for record in it:
            if (record.step >= sliding_steps) if slides else (record.block > middle):
                break
            records.append(record)
    finally:
        it.close()  # ends the generator inside the sampler, so its frame lets go of the cache
        run.release()
    return Decoded(records, time.perf_counter() - t, middle)


def median_ms(records: list[StepRecord]) -> float:
    return statistics.median(r.model_ms for r in records)


@dataclass(frozen=True)
class Roofline:
    """The floor of a forward of this model on this device: max(weight read, arithmetic)."""
    read_bytes: float
    params: float
    device: DeviceProfile

    def ms(self, positions: int) -> float:
        return step_floor_s(self.read_bytes, self.params, positions, self.device) * 1e3


# ---------------------------------------------------------------- per cache policy, batch 1
def warm_up(handle: ModelHandle, prompt: str, gen: int, args: argparse.Namespace) -> float:
    """An eager dual run, untimed: a process's first forwards (allocator, BLAS and kernel set-up)
    take many times a later one's, and would land on the first row. Returns its seconds."""
    return decode_to_middle(handle, prompt, policy_settings("dual", gen, args.block, args.repeats, forward_mode=EAGER),
                            args.repeats + 1).seconds


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process: a forward compiles again for what its shape
    does not show (a policy's observers, the cache's length)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def policy_row(handle: ModelHandle, policy: str, gen: int, args: argparse.Namespace, fast: ForwardRunner,
               roofline: Roofline, prompt: str) -> dict:
    """Eager, then the fast mode twice (the first compiles and captures), each to the middle block."""
    settings = {mode: policy_settings(policy, gen, args.block, args.repeats, forward_mode=mode)
                for mode in (EAGER, args.fast)}
    eager = decode_to_middle(handle, prompt, settings[EAGER], args.repeats + 1)
    shapes, graphs = len(fast.shapes), compiled_graphs()
    first = decode_to_middle(handle, prompt, settings[args.fast], args.repeats + 1)
    timed = decode_to_middle(handle, prompt, settings[args.fast], args.repeats + 1)
    g = int(statistics.median(r.g for r in timed.timed()))
    eager_ms, fast_ms, floor_ms = median_ms(eager.timed()), median_ms(timed.timed()), roofline.ms(g)
    differ = eager.first_difference(timed)
    row = {"gen": gen, "prompt": len(encode_prompt(handle, prompt)), "policy": policy, "G": g,
           "timed_step": timed.timed()[0].step, "eager_ms": eager_ms, "fast_ms": fast_ms, "floor_ms": floor_ms,
           "eager_x_floor": eager_ms / floor_ms, "fast_x_floor": fast_ms / floor_ms,
           "same_tokens": differ is None, "differ_at": differ, "first_fast_s": first.seconds,
           "compile_s": max(0.0, first.seconds - timed.seconds), "shapes_new": len(fast.shapes) - shapes,
           "shapes": len(fast.shapes), "graphs_new": compiled_graphs() - graphs, "forward_mode": fast.mode,
           "notice": fast.notice or ""}
    print(f"{policy} at gen {gen}: eager {eager_ms:.2f} ms, {fast.mode} {fast_ms:.2f} ms, floor {floor_ms:.3f} ms, "
          f"same tokens {row['same_tokens']}, first {args.fast} run {first.seconds:.1f}s, "
          f"{row['shapes_new']} new shapes, {row['graphs_new']} graphs compiled"
          f"{'; ' + fast.notice if fast.notice else ''}", flush=True)
    return row


# ---------------------------------------------------------------- one dual step under the profiler
def profile_row(handle: ModelHandle, prompt: str, gen: int, mode: str, step: int, args: argparse.Namespace) -> dict:
    """Step ``step`` of a dual run in ``mode`` under torch.profiler (bench/cuda_smoke.py's
    ``profile_step``), the steps before it run first: a cached step whose shapes are compiled by then."""
    settings = policy_settings("dual", gen, args.block, args.repeats, forward_mode=mode)
    run = dllm_local.stream(handle, prompt, settings)
    it = iter(run)
    try:
        for _ in range(step):
            next(it)
        profiled = profile_step(it, handle.device)
    finally:
        it.close()
        run.release()
    on_gpu = handle.device.type == "cuda"
    return {"gen": gen, "mode": mode, "step": step, "G": profiled["G"], "wall_ms": profiled["wall_ms"],
            "model_ms": profiled["model_ms"], "issue_ms": profiled["issue_ms"] if on_gpu else None,
            "gpu_busy_ms": profiled["gpu_busy_ms"] if on_gpu else None,
            "kernels": profiled["kernels"] if on_gpu else None}


# ---------------------------------------------------------------- batches
def batch_row(handle: ModelHandle, prompt: str, gen: int, batch: int, mode: str, args: argparse.Namespace,
              roofline: Roofline) -> dict:
    """``batch`` requests of ``prompt`` decoded together (dual + threshold) in ``mode``: the median
    of ``--batch-steps`` cached steps (request 0's records: each holds the batch's forward)."""
    settings = Settings(gen_length=gen, block_size=args.block, cache="dual", unmask="threshold",
                        unmask_params={"threshold": BATCH_THRESHOLD}, trace="off", forward_mode=mode)
    run = dllm_local.stream_batch(handle, [prompt] * batch, settings)
    steps: dict[int, StepRecord] = {}
    it = iter(run)
    try:
        for request, record in it:
            if request == 0:
                steps[record.step] = record
            if len(steps) > args.batch_steps + 1:
                break
    finally:
        it.close()
        run.release()
    cached = [r for r in steps.values() if not r.full_refresh] or list(steps.values())
    step_ms, floor_ms = median_ms(cached), roofline.ms(batch * args.block)
    committed = statistics.mean(len(r.committed) for r in cached)
    row = {"gen": gen, "batch": batch, "mode": mode, "steps": len(cached), "step_ms": step_ms,
           "tokens_per_s": batch * committed / step_ms * 1e3, "floor_ms": floor_ms, "x_floor": step_ms / floor_ms}
    print(f"batch {batch} {mode}: {step_ms:.2f} ms a step, floor {floor_ms:.3f} ms", flush=True)
    free_device_memory()
    return row


# ---------------------------------------------------------------- batch invariance
INVARIANCE_LENGTHS = (16, 32)  # small: the section stays within seconds on the 8B shape


def invariance_row(handle: ModelHandle, args: argparse.Namespace) -> dict:
    """Same tokens as alone for packed continuous, packed static and invariant batches, and the
    invariant mode's tokens/s against packed continuous (``batch_invariance.compare``)."""
    prompts, settings = workload(args.invariance, lengths=INVARIANCE_LENGTHS, block=16, forward_mode=EAGER,
                                 trace="off")
    result = invariance_compare(handle, prompts, settings, args.invariance_batch)
    print_comparison(result)
    free_device_memory()
    return result


# ---------------------------------------------------------------- Flash-dLLM as released
@dataclass
class Released:
    """The released generator and its model class, on this model's weights."""
    generate: Callable[..., Any]
    model: torch.nn.Module


def load_released(folder: Path, handle: ModelHandle) -> Released:
    """``folder``'s ``generate.py`` imported as the release runs it (``llada/`` on the path), and its
    ``LLaDAModelLM`` built empty (accelerate's ``init_empty_weights``: no 8B allocation) and given this
    model's tensors (``assign``: shared, no copy). The release registers its config and model as
    "llada" with transformers' Auto classes, the name this project's own config holds, and its
    import would raise on it: the registrations are skipped (nothing here loads through them).
    Its logits are held to the ids our drafts may be (the mask and the embedding rows the tokenizer
    has no token for banned, as the sampler does), so both sides choose among the same tokens."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel

    sys.path.insert(0, str(folder))
    with mock.patch.object(AutoConfig, "register", lambda *a, **k: None), \
            mock.patch.object(AutoModel, "register", lambda *a, **k: None):
        generate = importlib.import_module("generate")
    modeling = sys.modules["model.modeling_llada"]
    ours = handle.model
    reference = json.loads(REFERENCE.read_text())  # the keys the release's config reads
    config = modeling.LLaDAConfig(**{k: v for k, v in ours.config.to_dict().items()
                                     if k in reference and k != "auto_map"})
    # Building the release's model turns PyTorch's flash and memory-efficient attention on and off for
    # the whole process; ours keeps the choice it had.
    attention = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()
    with init_empty_weights():
        model = modeling.LLaDAModelLM(config)
    torch.backends.cuda.enable_flash_sdp(attention[0])
    torch.backends.cuda.enable_mem_efficient_sdp(attention[1])
    missing, _ = model.load_state_dict(ours.state_dict(), strict=False, assign=True)
    if missing:
        raise RuntimeError(f"the release's model has weights this one lacks: {', '.join(missing[:4])}")
    rows = ours.get_input_embeddings().weight.shape[0]
    banned = torch.tensor([handle.mask_id, *range(len(handle.tokenizer), rows)], device=handle.device)
    model.get_output_embeddings().register_forward_hook(lambda m, a, out: out.index_fill(-1, banned, float("-inf")))
    return Released(generate.generate_with_Flash_dLLM, model.eval())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def released_decode(released: Released, handle: ModelHandle, prompt: str, gen: int, block: int, batch: int) -> dict:
    """The released generator on ``batch`` copies of ``prompt`` with the defaults of our
    ``flash`` + ``flash_verify`` (its own prints kept out of the table)."""
    ids = encode_prompt(handle, prompt)
    cache, unmask = registry.CACHE["flash"].defaults, registry.UNMASK["flash_verify"].defaults
    stops = [handle.tokenizer.decode([i]) for i in handle.stop_ids]
    responses, steps = [""] * batch, [0] * batch
    _sync(handle.device)
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        _, tokens, _ = released.generate(
            released.model, [torch.tensor(ids, device=handle.device)] * batch, [len(ids)] * batch, batch, responses,
            steps, gen_length=gen, block_length=block, temperature=0.0, mask_id=handle.mask_id,
            threshold=unmask["threshold"], gamma=unmask["gamma"], track_num=cache["track_num"],
            mask_num=cache["mask_num"], eos_id=handle.eos_id, verify=True, tokenizer=handle.tokenizer,
            stop_tokens=stops)
    _sync(handle.device)
    seconds = time.perf_counter() - t
    return {"texts": responses, "tokens": tokens, "steps": sum(steps), "seconds": seconds}


def ours_decode(handle: ModelHandle, prompt: str, gen: int, block: int, batch: int, mode: str, cap_s: float) -> dict:
    """``flash`` + ``flash_verify`` (their defaults) on ``batch`` copies of ``prompt``, stopped once
    ``cap_s`` seconds have passed (then its answers are not compared)."""
    settings = Settings(gen_length=gen, block_size=block, cache="flash", unmask="flash_verify", trace="off",
                        forward_mode=mode)
    run = (dllm_local.stream(handle, prompt, settings) if batch == 1
           else dllm_local.stream_batch(handle, [prompt] * batch, settings))
    steps = tokens = 0  # steps: request 0's
    t = time.perf_counter()
    for item in run:
        request, record = (0, item) if batch == 1 else item
        steps += request == 0
        tokens += len(record.committed)
        if time.perf_counter() - t > cap_s:
            run.stop()
    seconds = time.perf_counter() - t
    results = [run.result] if batch == 1 else run.results
    run.release()
    return {"texts": [r.text for r in results], "tokens": tokens, "steps": steps, "seconds": seconds,
            "stopped": any(r.stats.stopped for r in results)}


def released_row(released: Released, handle: ModelHandle, prompt: str, gen: int, batch: int,
                 args: argparse.Namespace) -> dict:
    """The released generator on ``batch`` copies of ``prompt`` (a first run, untimed, compiles its
    Triton kernels, which are specialised on the batch's block count), then ours in the fast mode
    (a first run compiles, untimed) and, at batch 1, eager, at identical settings: tokens/s both sides."""
    block = args.released_block
    released_decode(released, handle, prompt, gen, block, batch)
    theirs = released_decode(released, handle, prompt, gen, block, batch)
    row = {"gen": gen, "block": block, "batch": batch, "released_tokens_per_s": theirs["tokens"] / theirs["seconds"],
           "released_steps": theirs["steps"]}
    row.update(eager_tokens_per_s=None, eager_steps=None, eager_same_text=None, eager_x_released=None)
    for mode in (EAGER, args.fast) if batch == 1 else (args.fast,):  # eager batches: the batch rows' baseline
        if mode != EAGER:
            ours_decode(handle, prompt, gen, block, batch, mode, args.released_seconds)
        ours = ours_decode(handle, prompt, gen, block, batch, mode, args.released_seconds)
        key = "eager" if mode == EAGER else "fast"
        row[f"{key}_tokens_per_s"] = ours["tokens"] / ours["seconds"]
        row[f"{key}_steps"] = ours["steps"]
        row[f"{key}_same_text"] = None if ours["stopped"] else ours["texts"] == theirs["texts"]
        row[f"{key}_x_released"] = row[f"{key}_tokens_per_s"] / row["released_tokens_per_s"]
    print(f"released at batch {batch}: {row['released_tokens_per_s']:.1f} tokens/s, ours {args.fast} "
          f"{row['fast_tokens_per_s']:.1f}", flush=True)
    free_device_memory()
    return row


# ---------------------------------------------------------------- targets
def targets(policies: list[dict], batches: list[dict], released: list[dict], args: argparse.Namespace) -> list[dict]:
    """Each target met or missed with its figure (the fast mode's), or not measured and why."""
    out = []

    def add(name: str, bound: float, figure: float | None, at_most: bool, where: str) -> None:
        met = None if figure is None else (figure <= bound if at_most else figure >= bound)
        out.append({"target": name, "bound": bound, "figure": figure, "met": met, "where": where})

    for policy, name, bound in (("dual", "DualCache step, batch 1", DUAL_TARGET),
                                ("none", "full forward (cache none), batch 1", FULL_TARGET)):
        rows = [r for r in policies if r["policy"] == policy]
        for r in rows:
            add(f"{name} <= {bound}x floor", bound, r["fast_x_floor"], True, f"gen {r['gen']}, {r['forward_mode']}")
        if not rows:
            add(f"{name} <= {bound}x floor", bound, None, True, f"no {policy} row")
    big = [r for r in batches if r["batch"] == TARGET_BATCH and r["mode"] == args.fast]
    add(f"batch-{TARGET_BATCH} dual step <= {BATCH_TARGET}x floor", BATCH_TARGET, big[0]["x_floor"] if big else None,
        True, f"gen {big[0]['gen']}, {args.fast}" if big else f"no batch {TARGET_BATCH} row")
    for r in released or [None]:
        add(f"flash + flash_verify >= {RELEASED_TARGET}x released tokens/s", RELEASED_TARGET,
            r["fast_x_released"] if r else None, False,
            f"gen {r['gen']}, batch {r['batch']}, block {r['block']}, {args.fast}" if r
            else "no --released" if not args.released else "no released row")
    return out


def print_targets(rows: list[dict]) -> None:
    print("targets:")
    for r in rows:
        verdict = "not measured" if r["met"] is None else ("met" if r["met"] else "missed")
        figure = "" if r["figure"] is None else f": {r['figure']:.2f}x"
        print(f"  {r['target']}: {verdict}{figure} ({r['where']})")


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="gpu_check's small shape (a CPU dry run)")
    ap.add_argument("--lengths", type=LENGTH_LIST, default="256,512", help="generation lengths, comma-separated")
    ap.add_argument("--prompt", type=COUNT, default=256, help="prompt tokens (about: the chat template's included)")
    ap.add_argument("--block", type=LENGTH, default=32)
    ap.add_argument("--repeats", type=COUNT, default=3, help="timed steps per policy row, after the middle block's first")
    ap.add_argument("--batches", type=SLOT_LIST, default="1,8,32", help="batch sizes of the batch rows (first length)")
    ap.add_argument("--batch-steps", type=COUNT, default=4, help="cached steps timed per batch row")
    ap.add_argument("--invariance", type=Count(0, what="a number of problems", why="0: none"), default=8,
                    help="problems of the batch-invariance rows (0: none)")
    ap.add_argument("--invariance-batch", type=SLOT_COUNT, default=4, help="slots of the batch-invariance rows")
    ap.add_argument("--fast", choices=("graphs", "compiled"), default="graphs", help="the fast forward mode")
    ap.add_argument("--backend", default=None, help=argparse.SUPPRESS)  # tests: aot_eager compiles in seconds
    ap.add_argument("--released", default=None, help="a copy of VILA-Lab/Flash-dLLM's llada/ folder")
    ap.add_argument("--released-block", type=LENGTH, default=16,
                    help="block of the released comparison (16: the authors')")
    ap.add_argument("--released-seconds", type=SECONDS, default=30.0,
                    help="our side of the released comparison stops after this long (its answers then not compared)")
    ap.add_argument("--time-budget", type=SECONDS, default=330.0,
                    help="seconds from the start; the rows left after it are skipped with a note")
    ap.add_argument("--out", default=None, help="also write the tables here as JSON")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def print_tables(out: dict, args: argparse.Namespace) -> None:
    print()
    _print_table([("gen", 4, ""), ("prompt", 6, ""), ("policy", 13, ""), ("G", 4, ""), ("eager_ms", 8, ".2f"),
                  ("fast_ms", 8, ".2f"), ("floor_ms", 8, ".3f"), ("eager_x_floor", 13, ".2f"),
                  ("fast_x_floor", 12, ".2f"), ("same_tokens", 11, ""), ("differ_at", 9, ""),
                  ("first_fast_s", 12, ".1f"),
                  ("compile_s", 9, ".1f"), ("shapes_new", 10, ""), ("shapes", 6, ""), ("graphs_new", 10, ""),
                  ("forward_mode", 12, "")],
                 out["policies"])
    print(f"policy rows: batch 1, ms per cached step (median model_ms of the middle block's steps after its first; "
          f"flash: its steps after the prefill); fast = {args.fast}; floor = roofline at G; differ_at the first step "
          f"whose commits differ between the modes; first_fast_s the first "
          f"{args.fast} run (compiles, captures), compile_s that less the second run; shapes: the {args.fast} "
          f"runner's (kind, rows, length) met so far, graphs_new the graphs dynamo compiled in the row (a forward "
          f"also compiles again for its observers and its cache's length)")
    for r in out["policies"]:
        if r["notice"]:
            print(f"  fallback at {r['policy']}, gen {r['gen']}: {r['notice']}")
    if out["profile"]:
        print()
        _print_table([("gen", 4, ""), ("mode", 8, ""), ("step", 4, ""), ("G", 4, ""), ("wall_ms", 8, ".2f"),
                      ("model_ms", 8, ".2f"), ("issue_ms", 8, ".2f"), ("gpu_busy_ms", 11, ".2f"), ("kernels", 7, "")],
                     out["profile"])
        print("profiled dual step: wall under the profiler; issue_ms the host's time from the step's first launch to "
              "its last, gpu_busy_ms the kernels' durations summed (both CUDA only)")
    if out["batches"]:
        print()
        _print_table([("gen", 4, ""), ("batch", 5, ""), ("mode", 8, ""), ("steps", 5, ""), ("step_ms", 8, ".2f"),
                      ("tokens_per_s", 12, ".1f"), ("floor_ms", 8, ".3f"), ("x_floor", 7, ".2f")], out["batches"])
        print(f"batch rows: dual + threshold {BATCH_THRESHOLD}, stream_batch; floor of B x {args.block} positions. "
              f"{PACKED_NOTE}")
    for result in out["invariance"]:
        print()
        print_comparison(result)
        print(f"invariance rows: {args.invariance} problems of the tiny tasks, answers of "
              f"{' or '.join(map(str, INVARIANCE_LENGTHS))}, dual + threshold, block 16, eager; same tokens as alone: "
              f"each problem's answer against its run alone (app.py --batch-mode)")
    if out["released"]:
        print()
        _print_table([("gen", 4, ""), ("block", 5, ""), ("batch", 5, ""), ("released_tokens_per_s", 21, ".1f"),
                      ("released_steps", 14, ""), ("eager_tokens_per_s", 18, ".1f"), ("eager_same_text", 15, ""),
                      ("fast_tokens_per_s", 17, ".1f"), ("fast_steps", 10, ""), ("fast_same_text", 14, ""),
                      ("fast_x_released", 15, ".2f")], out["released"])
        print("released rows: the released generator against flash + flash_verify at its defaults; same_text: the "
              "same answers (the release returns text; '-' where ours was stopped by --released-seconds)")
    for note in out["notes"]:
        print(f"note: {note}")
    for row in out["skipped"]:
        print(f"skipped (time budget): {row}")
    for row in out["failed"]:
        print(f"failed: {row}")
    print()
    print_targets(out["targets"])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python bench/gpu_fast_path.py", *map(shlex.quote, given)])
    device = torch.device(args.device)
    # The CPU dry run on one thread: an OpenMP team sharing its cores with other work stalls at every barrier.
    with torch_threads(1) if device.type == "cpu" else contextlib.nullcontext():
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else machine_name()
        print(f"device: {name} | torch {torch.__version__} | $ {command}", flush=True)
        out = measure(args, device, {"device": name, "torch": torch.__version__, "command": command})
    print_tables(out, args)
    print(f"total {out['seconds']:.0f}s")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


def measure(args: argparse.Namespace, device: torch.device, out: dict) -> dict:
    """Every row, in order of priority, into ``out`` (which says where they were measured)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths, batches = args.lengths, args.batches
    guard = Guard(args.time_budget)
    t0 = time.perf_counter()

    model = build_random(reference_config(args.tiny), device, dtype)
    handle = make_handle(model, "random-8b-shape", REFERENCE.parent)
    del model
    profile = profile_for(device, dtype)
    roofline = Roofline(weight_read_bytes(handle.model), logical_parameters(handle.model), profile)
    prompt = prompt_text(handle, args.prompt)
    print(f"{handle.num_parameters / 1e9:.2f}B parameters ({str(dtype).removeprefix('torch.')}) built in "
          f"{time.perf_counter() - t0:.1f}s | roofline: {profile.name}", flush=True)
    fast = runner_for(handle.model, args.fast, args.backend)  # the first call names the compile backend
    policies = [p for p in ("dual", "none") if p in registry.CACHE]
    policies += [p for p in registry.for_model("masked", registry.CACHE) if p not in policies]
    out.update(fast=args.fast, batch_note=PACKED_NOTE, notes=[], policies=[], profile=[], batches=[], released=[],
               invariance=[])
    out["warm_up_s"] = warm_up(handle, prompt, lengths[0], args)
    print(f"warm-up (an eager dual run) {out['warm_up_s']:.1f}s", flush=True)

    def add(table: str, row: str, take: Callable[[], dict]) -> None:
        got = guard.run(row, take)
        if got is not None:
            out[table].append(got)

    # In order of priority: the first length's rows (the profile beside dual's, whose graphs it
    # replays), then the other lengths'.
    for policy in policies:
        add("policies", f"{policy} at gen {lengths[0]}",
            lambda: policy_row(handle, policy, lengths[0], args, fast, roofline, prompt))
        dual = [r for r in out["policies"] if r["policy"] == "dual"]
        for mode in (EAGER, args.fast) if policy == "dual" and dual else ():
            add("profile", f"the profiled dual step, {mode}",
                lambda: profile_row(handle, prompt, lengths[0], mode, dual[0]["timed_step"], args))
    for batch in batches:
        for mode in (EAGER, args.fast):
            add("batches", f"batch {batch}, {mode}",
                lambda: batch_row(handle, prompt, lengths[0], batch, mode, args, roofline))
    if args.invariance:
        add("invariance", "batch invariance", lambda: invariance_row(handle, args))
    if args.released and device.type != "cuda":
        out["notes"].append("the released generator runs Triton kernels: it needs CUDA (not run)")
    elif args.released:
        released = guard.run("loading the released generator", lambda: load_released(Path(args.released), handle))
        released_batches = [1, TARGET_BATCH] if TARGET_BATCH in batches else [1]
        for batch in released_batches if released else []:
            add("released", f"released against flash + flash_verify at batch {batch}",
                lambda: released_row(released, handle, prompt, lengths[0], batch, args))
    for gen in lengths[1:]:
        for policy in policies:
            add("policies", f"{policy} at gen {gen}",
                lambda: policy_row(handle, policy, gen, args, fast, roofline, prompt))
    out["skipped"], out["failed"] = guard.skipped, guard.failed
    out["targets"] = targets(out["policies"], out["batches"], out["released"], args)
    out["seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    main()
