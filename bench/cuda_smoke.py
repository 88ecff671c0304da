"""CUDA smoke test: one prepared script that runs the project on a GPU, about 5 minutes on an H200.

    python bench/cuda_smoke.py                      # every section on the GPU
    python bench/cuda_smoke.py --sections a,b       # some of them
    python bench/cuda_smoke.py --cpu-dry-run        # the same code on the CPU with tiny shapes

Sections (each prints PASS, FAIL or SKIP with its reason and wall time; a summary table ends the run):
  a  every cache x unmasking policy on the tiny model on CUDA (bf16) at temperature 0 and 1, full
     trace with exact drift, against a CPU (fp32) run of the same settings
  b  host syncs of one dual + threshold step (set_sync_debug_mode "warn"), and a profiler pass
     over one step: CUDA kernels per forward, CPU time against GPU time
  c  bench/gpu_check.py, called once: the LLaDA-8B-shaped bf16 model with random weights at gen
     256 and 1024 (trace off and summary), a 4-layer 8B-width checkpoint loaded by dllm_local.load
     in bf16, 4-bit and 8-bit, the batch sweep, Flash-dLLM as released (flash + flash_verify) at
     batch 1 and 32; checked here: the build's peak memory against the weights, the quantized
     module types, and the host syncs of a dual step on each model
  d  the engine process on CUDA: the parent never initialises CUDA, a forced out-of-memory run is
     recovered from, a model switch works

A GPU machine without network that lacks the versions requirements.txt pins can take them as
wheels. --make-wheels downloads bitsandbytes and transformers at those pins, and regex
(transformers checks its version at import), for the target's Python (--wheel-python), and keeps
of bitsandbytes' native libraries only the CPU one and the one for the target's CUDA
(--wheel-cuda: torch built for CUDA 13.0 loads libbitsandbytes_cuda130.so), rewriting its RECORD
to match: the published wheel, a library per CUDA, ROCm and XPU version, is 43 MB, the slimmed
one a few. In the repository root (.gitignore covers .whl/):

    python bench/cuda_smoke.py --make-wheels .whl --wheel-python 3.12 --wheel-cuda 130

then on the GPU machine, with .whl/ copied beside the repository:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/cuda_smoke.py --json smoke.json 2>&1 | tee smoke.log

Without bitsandbytes the quantized loads of section c are skipped.
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
from dllm_local.arguments import SECONDS  # noqa: E402

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
from dllm_local.models.loading.loader import free_device_memory  # noqa: E402
from dllm_local.policies import registry  # noqa: E402

# Non-default knobs where the default would leave code unexercised (as tests/golden.py does).
CACHE_PARAMS = {"adaptive": {"budget": 48}}  # the budget evicts cache entries
UNMASK_PARAMS = {"self_verify": {"threshold": 0.3}}  # low enough that verification forwards happen
EXPLAINED_MARGIN = 1.0  # nats: a top-2 logit gap under it is within bf16's reach on this model
EXACT_TOLERANCE = 1e-3  # cache "none" recomputes everything: its exact-drift error must be ~0

# Sizes per mode: the GPU's fit the 5 minutes the script aims at; the CPU's only exercise the code.
SIZES = {
    "cuda": dict(a_gen=64, a_prompts=2, a_budget_s=60, checkpoint_layers=4, oom=True,
                 c_args=["--lengths", "256,1024", "--repeats", "2", "--generate-budget", "6", "--batches", "1,2,4,8,16,32"]),
    "cpu": dict(a_gen=32, a_prompts=1, a_budget_s=240, checkpoint_layers=4, oom=False,
                c_args=["--tiny", "--lengths", "64", "--prompt", "32", "--repeats", "2", "--generate-budget", "3",
                        "--quantized", "yes", "--batches", "1,2"]),
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
        """The shallow 8B-width checkpoint (tiny-shaped in the dry run), written once for c and d."""
        if self._checkpoint is None:
            t = time.perf_counter()
            self._checkpoint = gpu_check.write_checkpoint(self.workdir / "wide-checkpoint", self.sizes["checkpoint_layers"],
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


# The host's calls that put work on the GPU: a kernel each, or a whole CUDA graph.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def profile_step(it: Iterator, device: torch.device) -> dict:
    """One step of a run under torch.profiler: kernels per forward, GPU busy time against the
    step's wall time (a step far above its GPU time is bound by launches and host syncs), and
    ``issue_ms``, the host's time from the step's first launch to its last (0 on the CPU)."""
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
    launches = [e.time_range for e in events if e.device_type == DeviceType.CPU and e.name in LAUNCHES]
    issue_ms = (max(r.end for r in launches) - min(r.start for r in launches)) / 1e3 if launches else 0.0
    forwards = max(1, record.forwards)
    return {"forwards": record.forwards, "G": record.g, "kernels": len(kernels), "kernels_per_forward": len(kernels) / forwards,
            "aten_ops": ops, "gpu_busy_ms": round(gpu_ms, 3), "issue_ms": round(issue_ms, 3), "wall_ms": round(wall_ms, 3),
            "model_ms": record.model_ms, "runtime_calls": dict(runtime)}


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
    caches, unmasks = list(registry.for_model("masked", registry.CACHE)), list(registry.UNMASK)
    pairs = [(c, u) for c in caches for u in unmasks]
    if ctx.dry_run:  # every policy once, not every pair: on the CPU both runs are slow
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


# ---------------------------------------------------------------- c: gpu_check, with host syncs
def section_c(ctx: Context) -> tuple[str, str, dict]:
    """gpu_check once (the 8B shape end to end, the checkpoint in bf16, 4-bit and 8-bit, the batch
    sweep), with what it does not judge: the build's peak, the quantized module types and the
    host syncs of a dual step on each model it loads."""
    layers = ctx.sizes["checkpoint_layers"]
    args = gpu_check.parse_args(ctx.sizes["c_args"] + ["--device", str(ctx.device), "--traces", "off,summary",
                                                       "--quant-layers", str(layers),
                                                       "--quant-checkpoint", str(ctx.checkpoint()),
                                                       "--json", str(ctx.workdir / "gpu_check.json")])
    gen = args.lengths[0]
    settings = Settings(gen_length=gen, block_size=32, cache="dual", unmask="threshold", trace="off")
    rows = gpu_check.check(args, probe=lambda handle: step_probe(handle, settings, ctx.device))
    for label, probe in rows["probes"].items():
        for line in _probe_lines(f"  {label} dual step", probe):
            print(line, flush=True)
    problems = []
    build = rows["build"]
    if build["peak_gb"] is not None and build["peak_gb"] > 1.05 * build["weights_gb"]:
        problems.append(f"building peaked at {build['peak_gb']:.1f} GB for {build['weights_gb']:.1f} GB of weights")
    expected = {"4bit": "Linear4bit", "8bit": "Linear8bitLt"}  # 7 linears a block
    problems += [f"{q['weights']}: unexpected module types {q['types']}" for q in rows["quantized"]
                 if q["weights"] in expected and q["types"].get(expected[q["weights"]], 0) != 7 * layers]
    quantized = ", ".join(q["weights"] for q in rows["quantized"]) or "none (no bitsandbytes)"
    syncs = ", ".join(f"{label} {(p['cached'] or {}).get('syncs', '-')}" for label, p in rows["probes"].items())
    note = (f"{len(rows['policies'])} policy rows, {len(rows['generate'])} generate runs, {len(rows['batches'])} batch "
            f"rows, {len(rows['released'])} released-pair rows, quantized: {quantized}; syncs per cached dual step: {syncs}")
    return ("FAIL", "; ".join(problems), rows) if problems else ("PASS", note, rows)


# ---------------------------------------------------------------- d: the engine process
def section_d(ctx: Context) -> tuple[str, str, dict]:
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


SECTIONS: dict[str, tuple[str, Callable[[Context], tuple[str, str, dict]], float]] = {
    # key: (title, function, the least time it needs in seconds)
    "a": ("policy pairs, tiny, device vs CPU", section_a, 40),
    "b": ("syncs and profiler, one step", section_b, 10),
    "c": ("gpu_check: 8B, 4bit/8bit, batches", section_c, 90),
    "d": ("engine process: CUDA, OOM, switch", section_d, 30),
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
        free_device_memory()
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


# ---------------------------------------------------------------- wheels for a GPU machine without network
# requirements.txt's pins; transformers checks regex's version at import (>= 2025.10.22) and the
# target's is not known, so regex travels too (about 1 MB).
WHEELS = ("bitsandbytes==0.50.2", "transformers==5.24.0", "regex==2026.5.9")


def make_wheels(folder: Path, python: str, cuda: str) -> None:
    """Download WHEELS for CPython ``python`` on x86-64 Linux and slim the bitsandbytes one to the
    libraries a torch built for CUDA ``cuda`` ("130" for 13.0) loads."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [x for tag in ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                               "manylinux2014_x86_64") for x in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
                    "--implementation", "cp", *platforms, "-d", str(folder), *WHEELS], check=True)
    for wheel in folder.glob("bitsandbytes-*.whl"):
        slim_wheel(wheel, ("libbitsandbytes_cpu.so", f"libbitsandbytes_cuda{cuda}.so"))
    for wheel in sorted(folder.glob("*.whl")):
        print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")


def slim_wheel(wheel: Path, libraries: tuple[str, ...]) -> None:
    """Drop bitsandbytes' native libraries other than ``libraries``, and their RECORD lines (pip
    checks the files against RECORD)."""

    def keep(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return not (base.startswith("libbitsandbytes_") and base not in libraries)

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
def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, from " + ",".join(SECTIONS))
    ap.add_argument("--cpu-dry-run", action="store_true", help="run on the CPU with tiny shapes (exercises the code)")
    ap.add_argument("--budget", type=SECONDS, default=None, help="seconds for the whole run (default 300 on CUDA)")
    ap.add_argument("--workdir", default=None, help="for the checkpoint (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="write the outcomes here")
    ap.add_argument("--make-wheels", metavar="DIR", default=None, help="download and slim the wheels, then exit")
    ap.add_argument("--wheel-python", type=str, default="3.12", help="the GPU machine's Python, for --make-wheels")
    ap.add_argument("--wheel-cuda", type=str, default="130", help="the CUDA torch was built for there (130: 13.0), for --make-wheels")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.make_wheels:
        make_wheels(Path(args.make_wheels), args.wheel_python, args.wheel_cuda)
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
