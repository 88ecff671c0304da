"""CUDA smoke test (issue 18, "CUDA readiness"): one prepared script, about 5 minutes on an H200.

    python bench/cuda_smoke.py                      # every section on the GPU
    python bench/cuda_smoke.py --sections a,b       # some of them
    python bench/cuda_smoke.py --cpu-dry-run        # the same code on the CPU with tiny shapes

Sections (each prints PASS, FAIL or SKIP with its reason and wall time; a summary table ends the run):
  a  every cache x unmasking policy on the tiny model on CUDA (bf16) at temperature 0 and 1, full
     trace with exact drift, against a CPU (fp32) run of the same settings
  b  host syncs of one dual + threshold step (set_sync_debug_mode "warn"), and a profiler pass
     over one step: CUDA kernels per forward, CPU time against GPU time
  c  a LLaDA-8B-shaped bf16 model with random weights (built on meta, materialised in bf16 on the
     GPU): generate at gen 256 and 1024, trace off and summary, model vs other ms, peak memory
  d  a 4-layer, 8B-width LLaDA checkpoint on disk loaded by dllm_local.load in bf16, 4-bit and
     8-bit: module types, footprint against parameters, step time, host syncs
  e  the engine process on CUDA: the parent never initialises CUDA, a forced out-of-memory run is
     recovered from, a model switch works
  f  bench/gpu_check.py at gen 256 and 1024, and its batch sweep (1-32, bf16 and 4-bit) at gen 256

On the lent GPU machine (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, no bitsandbytes, no
network) bitsandbytes 0.50.2 and transformers 5.24.0 (this project's pins) travel as wheels, with
regex (transformers checks its version at import). As published the bitsandbytes wheel is 43 MB
(a library per CUDA, ROCm and XPU version); with the repository (about 25 MB) that is past the
64 MiB a call may carry. --make-wheels downloads the three and keeps only bitsandbytes' CUDA 13.0
and CPU libraries (torch cu130 loads libbitsandbytes_cuda130.so), rewriting its RECORD to match:
17 MiB in all. Here, once, in the repository root (.whl/ must be ignored by git: .gitignore does
not cover it; add `.whl/` there or to .git/info/exclude):

    python bench/cuda_smoke.py --make-wheels .whl

then the device tool's `run`, with carry [".whl"] and timeout_s 480 (the script budgets 300 s):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; PYTHONUNBUFFERED=1 python3 bench/cuda_smoke.py --json $OUT/smoke.json 2>&1 | tee $OUT/smoke.log

Without the wheels (`PYTHONUNBUFFERED=1 python3 bench/cuda_smoke.py` alone) it still runs:
section d and the quantized rows of f are skipped, and transformers is the machine's 5.17.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

PROMPT = "Emma has 7 apples. Emma gets 5 more. How many apples does Emma have now?"
# Section a's prompts: tiny-task prompts the model decodes over several steps per block.
PAIR_PROMPTS = ("Tom has 3 bags of 4 apples and gives away 5 apples. How many apples are left?",
                "Give two numbers whose sum is 9.")
CHILD_FLAG = "--session-child"
CHILD_MARK = "SESSION-CHILD-REPORT "


# ---------------------------------------------------------------- section e's parent process
def session_child(spec_json: str) -> int:
    """The page's side of the engine, in a fresh interpreter (this script's own process has
    initialised CUDA by then). It drives a ``Session`` and reports, as one JSON line, what each
    request did and whether this process ever imported torch or initialised CUDA."""
    spec = json.loads(spec_json)
    from dllm_local.errors import OutOfMemory
    from dllm_local.serving.session import Session

    report: dict = {}

    def attempt(name: str, call) -> None:
        t = time.perf_counter()
        try:
            report[name] = {"ok": True, "value": call()}
        except OutOfMemory as exc:
            report[name] = {"ok": False, "oom": True, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - every request is reported, the next still tried
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report[name]["seconds"] = round(time.perf_counter() - t, 2)

    def answer(gen: int, **knobs) -> str:
        settings = {"gen_length": gen, "block_size": 32, "cache": "dual", "unmask": "threshold", "trace": "off", **knobs}
        events = list(session.run(PROMPT, settings))
        return events[-1]["trace"].get("text", "")

    def engine_pid() -> int | None:
        process = getattr(session, "_process", None)  # private; only to tell "recovered" from "restarted"
        return getattr(process, "pid", None)

    # The memory cap is the one that makes the long run run out of memory.
    session = Session(spec["model"], device=spec["device"], guider=None, threads=spec["threads"],
                      memory_fraction=spec["memory_fraction"])
    try:
        report["model"] = session.info().get("name")
        report["pid_start"] = engine_pid()
        attempt("first_run", lambda: answer(32))
        if spec.get("oom_gen"):
            gen = spec["oom_gen"]
            # No cache and one forward per block: the first forward holds logits for every position.
            attempt("oom_run", lambda: answer(gen, cache="none", unmask="fixed", steps=gen // 32))
            attempt("after_oom", lambda: answer(32))
        report["pid_after"] = engine_pid()
        attempt("switch", lambda: session.switch_model(spec["switch_to"]).get("name"))
        attempt("after_switch", lambda: answer(32))
    finally:
        session.close()
    report["torch_imported"] = "torch" in sys.modules
    report["cuda_initialized"] = bool("torch" in sys.modules and sys.modules["torch"].cuda.is_initialized())
    print(CHILD_MARK + json.dumps(report), flush=True)
    return 0


# The child must start without torch: this script imports it below for every other section.
if __name__ == "__main__" and sys.argv[1:2] == [CHILD_FLAG]:
    sys.exit(session_child(sys.argv[2]))

import gc  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402
from collections import Counter  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

import torch  # noqa: E402

import dllm_local  # noqa: E402
import gpu_check  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.policies import registry  # noqa: E402

# Non-default knobs where the default would leave code unexercised (as tests/golden.py does).
CACHE_PARAMS = {"adaptive": {"budget": 48}}  # the budget evicts cache entries
UNMASK_PARAMS = {"self_verify": {"threshold": 0.3}}  # low enough that verification forwards happen
EXPLAINED_MARGIN = 1.0  # nats: a top-2 logit gap under it is within bf16's reach on this model
EXACT_TOLERANCE = 1e-3  # cache "none" recomputes everything: its exact-drift error must be ~0

# Sizes per mode: the GPU's fit the issue's 5 minutes; the CPU's only exercise the code.
SIZES = {
    "cuda": dict(a_gen=64, a_prompts=2, a_budget_s=60, c_tiny=False, c_lengths=(256, 1024), c_prompt=256, c_budget_s=8,
                 d_layers=4, d_lengths=(256,), oom=True,
                 f_args=["--lengths", "256,1024", "--repeats", "2", "--generate-budget", "6", "--batches", "1,2,4,8,16,32"]),
    "cpu": dict(a_gen=32, a_prompts=1, a_budget_s=240, c_tiny=True, c_lengths=(64, 128), c_prompt=32, c_budget_s=3,
                d_layers=4, d_lengths=(64,), oom=False,
                f_args=["--tiny", "--device", "cpu", "--lengths", "64", "--prompt", "32", "--repeats", "2",
                        "--generate-budget", "3", "--quantized", "yes", "--batches", "1,2"]),
}


class Skip(Exception):
    """The section cannot run here; the message says why."""


@dataclass
class Context:
    device: torch.device
    dry_run: bool
    workdir: Path
    deadline: float
    sizes: dict
    _checkpoint: Path | None = None

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def checkpoint(self) -> Path:
        """The shallow 8B-width checkpoint (tiny-shaped in the dry run), written once for d, e and f."""
        if self._checkpoint is None:
            t = time.perf_counter()
            self._checkpoint = gpu_check.write_checkpoint(self.workdir / "wide-checkpoint", self.sizes["d_layers"],
                                                          tiny=self.dry_run, device=self.device)
            print(f"  checkpoint written in {time.perf_counter() - t:.1f}s "
                  f"({folder_bytes(self._checkpoint) / 2**30:.2f} GB)", flush=True)
        return self._checkpoint


@dataclass
class Outcome:
    key: str
    title: str
    status: str
    reason: str
    seconds: float
    details: dict = field(default_factory=dict)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Torch threads for a CPU reference run: the tiny model is fastest on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync_site() -> str:
    """The innermost caller outside torch's own Python code (``folder/file.py:line``): where a
    synchronising op was called from, rather than the torch wrapper that ran it."""
    torch_dir = str(Path(torch.__file__).parent)
    for frame in reversed(traceback.extract_stack()[:-2]):  # this function and showwarning left out
        if not frame.filename.startswith(torch_dir) and "warnings" not in Path(frame.filename).name:
            path = Path(frame.filename)
            return f"{path.parent.name}/{path.name}:{frame.lineno}"
    return "?"


@contextmanager
def counting_syncs(device: torch.device) -> Iterator[Counter]:
    """Host-device synchronisations inside the block, counted by the line that caused them
    (``torch.cuda.set_sync_debug_mode("warn")`` turns each into a warning). Empty on the CPU."""
    counts: Counter = Counter()
    if device.type != "cuda":
        yield counts
        return
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None) -> None:
            if "synchroniz" in str(message):
                counts[_sync_site()] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = count  # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode(0)


def profile_step(it: Iterator, device: torch.device) -> dict:
    """One step of a run under torch.profiler: kernels per forward, GPU busy time against the
    step's wall time (a step far above its GPU time is bound by launches and host syncs)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t = time.perf_counter()
    with profile(activities=activities) as prof:
        record = next(it)
    wall_ms = (time.perf_counter() - t) * 1e3
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    runtime = Counter(e.name for e in events if e.name in ("cudaLaunchKernel", "cudaStreamSynchronize",
                                                           "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaLaunchKernelExC"))
    ops = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::"))
    gpu_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    forwards = max(1, record.forwards)
    return {"forwards": record.forwards, "G": record.g, "kernels": len(kernels), "kernels_per_forward": len(kernels) / forwards,
            "aten_ops": ops, "gpu_busy_ms": round(gpu_ms, 3), "wall_ms": round(wall_ms, 3), "model_ms": record.model_ms,
            "runtime_calls": dict(runtime)}


def step_probe(handle, settings: Settings, device: torch.device, max_steps: int = 4) -> dict:
    """Host syncs of each step after the first (the warm-up), by kind (refresh or cached), then a
    profile of one step: the first cached one, else a refresh, replayed in a second run (decoding
    at temperature 0 repeats itself), so that the sync warnings do not weigh on the profile."""
    steps = []
    run = dllm_local.stream(handle, PROMPT, settings)
    it = iter(run)
    try:
        next(it)
        for _ in range(max_steps):
            with counting_syncs(device) as syncs:
                record = next(it, None)
            if record is None:
                break
            steps.append({"step": record.step, "full_refresh": record.full_refresh, "G": record.g,
                          "syncs": sum(syncs.values()), "sites": dict(syncs.most_common(8))})
    finally:
        it.close()
        run.release()
    out = {"trace": settings.trace, "steps": steps}
    for kind, full in (("refresh", True), ("cached", False)):
        step = next((s for s in steps if s["full_refresh"] == full), None)
        out[kind] = None if step is None else {k: step[k] for k in ("step", "G", "syncs", "sites")}
    target = (out["cached"] or out["refresh"] or {}).get("step")
    if target is None:
        out["profile"] = "the run ended after its first step"
        return out
    run = dllm_local.stream(handle, PROMPT, settings)
    it = iter(run)
    try:
        for _ in range(target):
            next(it)
        out["profile"] = profile_step(it, device)
    finally:
        it.close()
        run.release()
    return out


def _probe_lines(label: str, probe: dict) -> list[str]:
    lines = []
    for kind in ("refresh", "cached"):
        s = probe[kind]
        lines.append(f"{label} {kind:7}: " + ("no such step" if s is None else
                                               f"{s['syncs']} syncs (step {s['step']}, G {s['G']}) {s['sites']}"))
    prof = probe["profile"]
    if isinstance(prof, dict):
        lines.append(f"{label} profiled step (G {prof['G']}): {prof['kernels']} kernels "
                     f"({prof['kernels_per_forward']:.0f}/forward), {prof['aten_ops']} aten ops, GPU busy "
                     f"{prof['gpu_busy_ms']:.2f} ms of {prof['wall_ms']:.2f} ms wall (model_ms {prof['model_ms']:.2f}); "
                     f"runtime calls {prof['runtime_calls']}")
    else:
        lines.append(f"{label} profile: {prof}")
    return lines


# ---------------------------------------------------------------- a: every policy pair, device vs CPU
def logit_margin(record, position: int) -> tuple[float | None, float | None, int | None]:
    """(top-2 logit margin in nats, top-1 probability, top-1 token) at ``position`` in a full-trace
    step record: the margin is log(p1 / p2) of its top candidates (rounded to 4 decimals there)."""
    for pos, top in record.top_candidates:
        if pos == position and top:
            p1 = top[0][1]
            p2 = top[1][1] if len(top) > 1 else 0.0
            return (math.log(p1 / p2) if p2 > 0 else math.inf), p1, top[0][0]
    return None, None, None


def first_divergence(main, ref) -> dict:
    """Where two runs of the same settings first commit differently: the step, the first position
    in the difference, each side's top token and probability there and the reference's top-2
    margin. Steps before it were identical, so only that forward's numerics differ."""
    for main_step, ref_step in zip(main.steps, ref.steps):
        a = {(p, t) for p, t, _ in main_step.committed}
        b = {(p, t) for p, t, _ in ref_step.committed}
        revoked_a = sorted(r[0] for r in main_step.revoked)
        revoked_b = sorted(r[0] for r in ref_step.revoked)
        if a == b and revoked_a == revoked_b:
            continue
        positions = sorted({p for p, _ in a ^ b} | set(revoked_a).symmetric_difference(revoked_b))
        position = positions[0]
        margin, p_ref, tok_ref = logit_margin(ref_step, position)
        _, p_main, tok_main = logit_margin(main_step, position)
        close = (p_ref is not None and p_main is not None and abs(p_ref - p_main) < 0.05)
        small = margin is not None and margin < EXPLAINED_MARGIN
        return {"step": main_step.step, "position": position, "token_main": tok_main, "token_ref": tok_ref,
                "p_main": p_main, "p_ref": p_ref, "margin_ref": margin,
                "explained": bool(small or (close and tok_main == tok_ref))}
    return {"step": None, "position": None, "explained": False, "note": "same commits, different number of steps"}


def _max_exact_error(trace) -> float:
    return max((s.exact or {}).get("max_prob_error", 0.0) for s in trace.steps) if trace.steps else 0.0


def section_a(ctx: Context) -> tuple[str, str, dict]:
    dtype = torch.bfloat16  # the GPU's working dtype; in the dry run bf16 on the CPU stands in for it
    main = dllm_local.load("tiny", device=ctx.device, dtype=dtype)
    ref = dllm_local.load("tiny", device="cpu", dtype="float32")
    main_guider = dllm_local.load_guider("tiny-guider", device=ctx.device, dtype=dtype)
    ref_guider = dllm_local.load_guider("tiny-guider", device="cpu", dtype="float32")
    caches, unmasks = list(registry.CACHE), list(registry.UNMASK)
    pairs = [(c, u) for c in caches for u in unmasks]
    if ctx.dry_run:  # every policy once, not every pair: two shared cores
        pairs = [(c, "threshold") for c in caches] + [("dual", u) for u in unmasks if u != "threshold"]
    gen = ctx.sizes["a_gen"]
    budget_end = time.perf_counter() + min(ctx.sizes["a_budget_s"], ctx.remaining() - 30)
    rows, failures, unexplained, exact_bad = [], [], [], []
    done = total = 0
    cases = [(k, prompt, temperature, pair) for k, prompt in enumerate(PAIR_PROMPTS[: ctx.sizes["a_prompts"]])
             for temperature in (0.0, 1.0) for pair in pairs]
    for k, prompt, temperature, (cache, unmask) in cases:
        total += 1
        if time.perf_counter() > budget_end:
            continue
        steps = gen // 2 if registry.get("unmask", unmask).uses_steps else None  # two tokens per forward
        settings = Settings(gen_length=gen, block_size=32, steps=steps, temperature=temperature, seed=0,
                            cache=cache, cache_params=CACHE_PARAMS.get(cache, {}), unmask=unmask,
                            unmask_params=UNMASK_PARAMS.get(unmask, {}), trace="full", exact_drift=True)
        guided = registry.get("unmask", unmask).needs_guider
        name = f"p{k} T={temperature:g} {cache}/{unmask}"
        try:
            t = time.perf_counter()
            a = dllm_local.generate(main, prompt, settings, main_guider if guided else None).trace
            t_main = time.perf_counter() - t
            with torch_threads(1):
                t = time.perf_counter()
                b = dllm_local.generate(ref, prompt, settings, ref_guider if guided else None).trace
                t_ref = time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001 - one broken pair must not hide the others
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"  {name:36} FAIL {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            continue
        done += 1
        agree = sum(x == y for x, y in zip(a.final_ids, b.final_ids)) / max(1, len(b.final_ids))
        row = {"pair": name, "identical": a.final_ids == b.final_ids, "agreement": round(agree, 3),
               "exact_err_main": _max_exact_error(a), "exact_err_ref": _max_exact_error(b),
               "seconds_main": round(t_main, 2), "seconds_ref": round(t_ref, 2)}
        if cache == "none" and row["exact_err_main"] > EXACT_TOLERANCE:
            exact_bad.append(f"{name}: {row['exact_err_main']:.4f}")
        if temperature == 0 and not row["identical"]:
            row["divergence"] = first_divergence(a, b)
            if not row["divergence"]["explained"]:
                unexplained.append(name)
        rows.append(row)
        print("  " + _pair_line(row), flush=True)
    note = f"{done}/{total} pairs in budget, {sum(r['identical'] for r in rows)} identical"
    if unexplained:
        note += f"; temperature 0 divergences beyond bf16 reach: {', '.join(unexplained)}"
    details = {"rows": rows, "failures": failures, "unexplained": unexplained, "exact_invariant_broken": exact_bad}
    if failures or exact_bad:
        return "FAIL", f"{len(failures)} pair(s) raised, exact-drift invariant broken in {len(exact_bad)}; {note}", details
    return "PASS", note, details


def _pair_line(row: dict) -> str:
    name, times = row["pair"], f"[{row['seconds_main']:.2f}s vs cpu {row['seconds_ref']:.2f}s]"
    errors = f"exact err {row['exact_err_main']:.3f}/{row['exact_err_ref']:.3f}"
    if row["identical"]:
        return f"{name:36} identical            {errors} {times}"
    d = row.get("divergence")
    if d is None:
        return f"{name:36} agree {row['agreement']:6.1%}         {errors} {times}"
    margin = "-" if d.get("margin_ref") is None else f"{d['margin_ref']:.2f}"
    return (f"{name:36} diverge step {d['step']} pos {d['position']}: tok {d.get('token_main')}/{d.get('token_ref')} "
            f"p {d.get('p_main')}/{d.get('p_ref')} margin {margin} {'(bf16)' if d['explained'] else '(CHECK)'} "
            f"{errors} {times}")


# ---------------------------------------------------------------- b: syncs and one profiled step
def section_b(ctx: Context) -> tuple[str, str, dict]:
    handle = dllm_local.load("tiny", device=ctx.device)
    probes = []
    # At 0.9 the tiny model often commits a whole block in its refresh step; at 1 (one token per
    # step) every block has cached steps too.
    for threshold in (0.9, 1.0):
        for trace in ("off", "summary", "full"):
            settings = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold",
                                unmask_params={"threshold": threshold}, trace=trace)
            probe = {"threshold": threshold, **step_probe(handle, settings, ctx.device)}
            probes.append(probe)
            for line in _probe_lines(f"  tau {threshold:g} trace {trace:7}", probe):
                print(line, flush=True)
    if ctx.device.type != "cuda":
        return "PASS", "profiled on the CPU; sync counting needs CUDA (not run)", {"probes": probes}
    summary = ", ".join(f"tau {p['threshold']:g}/{p['trace']} {p['cached']['syncs'] if p['cached'] else '-'}"
                        for p in probes)
    return "PASS", f"syncs per cached dual step: {summary}", {"probes": probes}


# ---------------------------------------------------------------- c: the 8B shape, end to end
def section_c(ctx: Context) -> tuple[str, str, dict]:
    s = ctx.sizes
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    config = gpu_check.reference_config(s["c_tiny"])
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    t = time.perf_counter()
    model = gpu_check.build_random(config, ctx.device, dtype)
    build_s = time.perf_counter() - t
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # What building added at its highest: the bf16 weights alone, if nothing was made in fp32 first.
    build_peak = torch.cuda.max_memory_allocated() - before if cuda else None
    handle = gpu_check.make_handle(model, "random-8b-shape", gpu_check.REFERENCE.parent)
    del model
    print(f"  built {handle.num_parameters / 1e9:.2f}B parameters in {build_s:.1f}s; weights {weights / 2**30:.2f} GB"
          + (f", peak while building {build_peak / 2**30:.2f} GB" if build_peak is not None else ""), flush=True)
    runs = []
    for gen in s["c_lengths"]:
        for trace in ("off", "summary"):
            r = gpu_check.generate_run(handle, gen, s["c_prompt"], 32, trace, s["c_budget_s"])
            runs.append(r)
            refresh = "-" if r["refresh_ms"] is None else f"{r['refresh_ms']:.2f}"
            peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.2f} GB"
            print(f"  gen {gen:5} trace {trace:7}: {r['steps']:4} steps in {r['wall_s']:.1f}s (finished {r['finished']}), "
                  f"model {r['model_ms']:.2f} ms + other {r['other_ms']:.2f} ms per step, refresh {refresh} ms, "
                  f"full run ~{r['full_run_s_est']:.1f}s, peak {peak}", flush=True)
    settings = Settings(gen_length=s["c_lengths"][0], block_size=32, cache="dual", unmask="threshold", trace="off")
    probe = step_probe(handle, settings, ctx.device)
    for line in _probe_lines("  dual step", probe):
        print(line, flush=True)
    details = {"build_s": build_s, "weights_gb": weights / 2**30, "build_peak_gb": None if build_peak is None else build_peak / 2**30,
               "runs": runs, "probe": probe}
    del handle
    if build_peak is not None and build_peak > 1.05 * weights:
        return "FAIL", f"building peaked at {build_peak / 2**30:.1f} GB for {weights / 2**30:.1f} GB of weights", details
    return "PASS", f"{len(runs)} generate runs; " + "; ".join(
        f"gen {r['gen']} {r['trace']}: {r['model_ms']:.1f}+{r['other_ms']:.1f} ms/step" for r in runs), details


# ---------------------------------------------------------------- d: quantized loads through dllm_local.load
def section_d(ctx: Context) -> tuple[str, str, dict]:
    path = ctx.checkpoint()
    layers = ctx.sizes["d_layers"]
    try:
        import bitsandbytes

        bnb = f"bitsandbytes {bitsandbytes.__version__}"
    except ImportError:
        bnb = None
    expected = {"4bit": "Linear4bit", "8bit": "Linear8bitLt"}
    rows, skipped, wrong = [], [], []
    for quantization in (None, "4bit", "8bit"):
        label = quantization or "unquantized"
        if quantization and bnb is None:
            skipped.append(f"{label}: bitsandbytes is not installed")
            continue
        try:
            handle = dllm_local.load(str(path), device=str(ctx.device), quantization=quantization)
        except dllm_local.ModelLoadError as exc:
            skipped.append(f"{label}: {exc}")
            continue
        model = handle.model
        types = gpu_check.quantized_types(model)
        if quantization and types.get(expected[quantization], 0) != 7 * layers:
            wrong.append(f"{label}: {types}")
        true_params = gpu_check.logical_parameters(model)
        block_bytes = gpu_check.stored_bytes(model.model.transformer.blocks[0])
        policy = gpu_check.policy_rows(handle, label, list(ctx.sizes["d_lengths"]), 32, 32, 3,
                                       gpu_check.profile_for(handle.device, handle.dtype), ("dual",))[0]
        settings = Settings(gen_length=ctx.sizes["d_lengths"][0], block_size=32, cache="dual", unmask="threshold", trace="off")
        probe = step_probe(handle, settings, ctx.device)
        row = {"weights": label, "dtype": str(handle.dtype).replace("torch.", ""), "types": types,
               "params_true": true_params, "params_handle": handle.num_parameters,
               "footprint_gb": handle.memory_bytes / 2**30, "bytes_per_param": handle.memory_bytes / true_params,
               "footprint_gb_32L": (handle.memory_bytes + (gpu_check.REAL_LAYERS - layers) * block_bytes) / 2**30,
               "first_ms": policy["first_ms"], "step_ms": policy["step_ms"], "blocks_ms": policy["blocks_ms"],
               "step_ms_32L": policy["step_ms_32L"], "syncs": (probe["cached"] or {}).get("syncs"),
               "sync_sites": (probe["cached"] or {}).get("sites")}
        rows.append(row)
        del handle, model
        free_memory()
    base = next((r for r in rows if r["weights"] == "unquantized"), None)
    for r in rows:
        vs = f" ({r['step_ms'] / base['step_ms']:.2f}x unquantized)" if base else ""
        print(f"  {r['weights']:11} {r['dtype']:8} {r['types']}: {r['params_true'] / 1e9:.3f}B params (handle "
              f"{r['params_handle'] / 1e9:.3f}B), {r['footprint_gb']:.2f} GB = {r['bytes_per_param']:.2f} B/param, "
              f"32 layers ~{r['footprint_gb_32L']:.2f} GB; dual step {r['step_ms']:.2f} ms{vs}, blocks {r['blocks_ms']:.2f} ms, "
              f"32 layers ~{r['step_ms_32L']:.1f} ms; {r['syncs']} syncs/step {r['sync_sites']}", flush=True)
    for s in skipped:
        print(f"  skipped {s}", flush=True)
    details = {"rows": rows, "skipped": skipped, "wrong_types": wrong}
    if wrong:
        return "FAIL", f"unexpected module types: {'; '.join(wrong)}", details
    if not any(r["weights"] != "unquantized" for r in rows):
        return "SKIP", "; ".join(skipped) or "no quantized load", details
    if skipped:
        return "PASS", f"partial ({'; '.join(skipped)})", details
    return "PASS", f"{bnb}: " + ", ".join(f"{r['weights']} {r['step_ms']:.1f} ms" for r in rows), details


# ---------------------------------------------------------------- e: the engine process
def section_e(ctx: Context) -> tuple[str, str, dict]:
    path = ctx.checkpoint()
    spec = {"model": str(path), "device": str(ctx.device), "threads": 1 if ctx.dry_run else 0, "switch_to": "tiny",
            "oom_gen": None, "memory_fraction": None}
    oom_note = "forced OOM: not covered on the CPU"
    if ctx.sizes["oom"]:
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        # The model and 1 GiB: short runs fit; a run near the model's maximum length does
        # not (its first forward's logits alone are 4000 x 126464 bf16, about 1 GB).
        cap = folder_bytes(path) + 2**30
        spec["memory_fraction"] = round(cap / total, 4)
        prompt_room = 128
        spec["oom_gen"] = (json.loads((path / "config.json").read_text())["max_sequence_length"] - prompt_room) // 32 * 32
        oom_note = ""
    t = time.perf_counter()
    child = subprocess.run([sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, json.dumps(spec)],
                           capture_output=True, text=True, timeout=max(60, min(300, ctx.remaining())))
    line = next((x for x in child.stdout.splitlines() if x.startswith(CHILD_MARK)), None)
    if line is None:
        tail = (child.stdout + child.stderr)[-2000:]
        raise RuntimeError(f"the session child exited {child.returncode} without a report: {tail}")
    report = json.loads(line[len(CHILD_MARK):])
    for name in ("first_run", "oom_run", "after_oom", "switch", "after_switch"):
        if name in report:
            r = report[name]
            shown = repr(r["value"])[:60] if r["ok"] else r["error"][:160]
            print(f"  {name:12} {'ok' if r['ok'] else 'error'} in {r['seconds']}s: {shown}", flush=True)
    print(f"  parent: torch imported {report['torch_imported']}, CUDA initialised {report['cuda_initialized']}; "
          f"engine pid {report.get('pid_start')} -> {report.get('pid_after')}; child took {time.perf_counter() - t:.1f}s",
          flush=True)
    problems = []
    if report["cuda_initialized"]:
        problems.append("the parent process initialised CUDA")
    for name in ("first_run", "switch", "after_switch"):
        if not report[name]["ok"]:
            problems.append(f"{name} failed")
    if spec["oom_gen"]:
        oom = report["oom_run"]
        if oom["ok"]:
            oom_note = "forced OOM: not covered (the capped engine finished the long run; the cap did not bite)"
        elif not oom.get("oom"):
            problems.append(f"the long run failed with something else than OutOfMemory: {oom['error'][:120]}")
        elif not report["after_oom"]["ok"]:
            problems.append("no recovery: the run after the out-of-memory one failed")
        elif report.get("pid_start") != report.get("pid_after"):
            oom_note = "forced OOM recovered by a restarted engine (a new process)"
        else:
            oom_note = "forced OOM recovered in the same engine process"
    details = {"spec": spec, "report": report, "stderr_tail": child.stderr[-3000:]}
    if problems:
        return "FAIL", "; ".join(problems), details
    return "PASS", f"parent never initialised CUDA; switch to {report['switch']['value']} ok; {oom_note}", details


# ---------------------------------------------------------------- f: gpu_check itself
def section_f(ctx: Context) -> tuple[str, str, dict]:
    out = ctx.workdir / "gpu_check.json"
    args = ctx.sizes["f_args"] + ["--quant-checkpoint", str(ctx.checkpoint()), "--json", str(out)]
    code = gpu_check.main(args)
    rows = json.loads(out.read_text())
    if code != 0:
        return "FAIL", f"gpu_check exited {code}", rows
    quantized = ", ".join(q["weights"] for q in rows["quantized"]) or "none (no bitsandbytes)"
    return "PASS", (f"{len(rows['policies'])} policy rows, {len(rows['generate'])} generate runs, "
                    f"{len(rows['batches'])} batch rows, quantized: {quantized}"), rows


SECTIONS: dict[str, tuple[str, Callable[[Context], tuple[str, str, dict]], float]] = {
    # key: (title, function, the least time it needs in seconds)
    "a": ("policy pairs, tiny, device vs CPU", section_a, 40),
    "b": ("syncs and profiler, one step", section_b, 10),
    "c": ("8B shape bf16, generate", section_c, 40),
    "d": ("4-layer 8B-width, bf16/4bit/8bit", section_d, 30),
    "e": ("engine process: CUDA, OOM, switch", section_e, 30),
    "f": ("gpu_check.py", section_f, 40),
}


def run_section(key: str, ctx: Context) -> Outcome:
    title, function, least = SECTIONS[key]
    print(f"\n=== {key}: {title}", flush=True)
    t = time.perf_counter()
    try:
        if ctx.remaining() < least:
            raise Skip(f"out of the time budget ({ctx.remaining():.0f}s left, needs about {least:.0f}s)")
        status, reason, details = function(ctx)
    except Skip as exc:
        status, reason, details = "SKIP", str(exc), {}
    except Exception as exc:  # noqa: BLE001 - a failing section is reported, the next one still runs
        traceback.print_exc()
        status, reason, details = "FAIL", f"{type(exc).__name__}: {str(exc)[:300]}", {}
    finally:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.set_sync_debug_mode(0)
        free_memory()
    seconds = time.perf_counter() - t
    print(f"--- {key}: {status} in {seconds:.1f}s: {reason}", flush=True)
    return Outcome(key, title, status, reason, seconds, details)


def environment() -> dict:
    import transformers

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import bitsandbytes

        env["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        env["bitsandbytes"] = None
    return env


# ---------------------------------------------------------------- wheels for the GPU machine
# transformers checks regex's version at import (>= 2025.10.22); the machine's is not known, and a
# failed import would waste the whole call, so regex travels too (about 1 MB).
WHEELS = ("bitsandbytes==0.50.2", "transformers==5.24.0", "regex==2026.5.9")
KEEP_LIBRARIES = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")


def make_wheels(folder: Path) -> None:
    """Download the wheels the GPU machine lacks (its Python is 3.12 on x86-64) and slim the
    bitsandbytes one to the libraries that machine loads, so the working tree stays under the
    64 MiB a call may carry."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [x for tag in ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                               "manylinux2014_x86_64") for x in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", str(folder), *WHEELS], check=True)
    for wheel in folder.glob("bitsandbytes-*.whl"):
        slim_wheel(wheel)
    for wheel in sorted(folder.glob("*.whl")):
        print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")


def slim_wheel(wheel: Path) -> None:
    """Drop the native libraries other than KEEP_LIBRARIES, and their RECORD lines (pip checks the
    files against RECORD)."""

    def keep(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return not (base.startswith("libbitsandbytes_") and base not in KEEP_LIBRARIES)

    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if not keep(item.filename):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if keep(line.split(b",")[0].decode()))
            dst.writestr(item, data)
    slim.replace(wheel)


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, from " + ",".join(SECTIONS))
    ap.add_argument("--cpu-dry-run", action="store_true", help="run on the CPU with tiny shapes (exercises the code)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 300 on CUDA)")
    ap.add_argument("--workdir", default=None, help="for the checkpoint (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="write the outcomes here")
    ap.add_argument("--make-wheels", metavar="DIR", default=None, help="download and slim the wheels, then exit")
    args = ap.parse_args(argv)
    if args.make_wheels:
        make_wheels(Path(args.make_wheels))
        return 0
    keys = [k.strip() for k in args.sections.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.cpu_dry_run:
        device, mode = torch.device("cpu"), "cpu"
        # One thread: an OpenMP team that shares its cores with other work stalls at every barrier.
        torch.set_num_threads(1)
    elif torch.cuda.is_available():
        device, mode = torch.device("cuda"), "cuda"
    else:
        print("no CUDA GPU here: run with --cpu-dry-run to exercise the code on the CPU")
        return 2
    budget = args.budget if args.budget is not None else (300.0 if mode == "cuda" else 3600.0)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="cuda_smoke_"))
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(device, args.cpu_dry_run, workdir, time.perf_counter() + budget, SIZES[mode])
    env = environment()
    print(f"cuda_smoke ({'CPU dry run' if args.cpu_dry_run else 'CUDA'}): {env}; sections {','.join(keys)}; "
          f"budget {budget:.0f}s; workdir {workdir}", flush=True)
    t0 = time.perf_counter()
    outcomes = [run_section(k, ctx) for k in keys]
    print("\n=== summary")
    for o in outcomes:
        print(f"{o.key}  {o.status:4}  {o.seconds:6.1f}s  {o.title:36}  {o.reason[:160]}")
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "outcomes": [o.__dict__ for o in outcomes]},
                                              indent=1, default=str))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
