"""The tau/G cost model of the dLLM cost write-up, over the device profiles of ``devices.py``.

A forward at low batch is bounded below by reading the weights once and by the arithmetic
of the positions it recomputes: ``max(weight_bytes / bandwidth, G * 2 * params / flops)``.
The same floor over B concurrent requests (B x G positions per step) gives the write-up's
concurrency caveat: diffusion saturates the arithmetic first, and AR catches up.
The page imports this module to project a run onto a real model, so torch is imported only by
the functions that measure this machine.
"""
from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from pathlib import Path

from ..devices import DeviceProfile


@dataclass(frozen=True)
class TargetModel:
    """``params``: the parameters a position's arithmetic uses; ``weight_bytes``: the bytes one
    forward reads (bf16). Both leave out the input embedding, from which a forward only gathers
    its tokens' rows; the output head, a full matmul, is in both."""

    name: str
    params: float
    weight_bytes: float


# The real models a run is projected onto. LLaDA-8B's weight index says 16,031,162,368 bytes of
# bf16 (8.016 B parameters), of which the 126,464 x 4,096 input embedding is 0.518 B; Dream-v0-7B
# is Qwen2.5-7B's 7.616 B parameters, with a 152,064 x 3,584 embedding (0.545 B).
TARGET_MODELS = {
    "LLaDA-8B-Instruct": TargetModel("LLaDA-8B-Instruct", 8.016e9 - 0.518e9, 2 * (8.016e9 - 0.518e9)),
    "Dream-v0-Instruct-7B": TargetModel("Dream-v0-Instruct-7B", 7.616e9 - 0.545e9, 2 * (7.616e9 - 0.545e9)),
}
def step_floor_s(weight_bytes: float, params: float, positions: float, device: DeviceProfile) -> float:
    """Lower bound on one forward's time: the weight read or the arithmetic, whichever is larger."""
    return max(weight_bytes / device.bandwidth, positions * 2 * params / device.flops)


def crossover_positions(weight_bytes: float, params: float, device: DeviceProfile) -> float:
    """Recomputed positions at which a forward turns from bandwidth-bound to compute-bound."""
    return weight_bytes / device.bandwidth * device.flops / (2 * params)


def machine_name() -> str:
    """CPU model, torch threads and GPU, for benchmark tables (absolute times need the machine)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = torch.get_num_threads()
    return f"{cpu}, {threads} torch thread{'s' if threads != 1 else ''}{gpu}"


def project(stats: dict, prompt_len: int, gen_length: int, model: TargetModel, device: DeviceProfile) -> list[dict]:
    """A run's measured G and tau projected onto ``model`` on ``device`` at batch 1.

    Rows: this run (its mean G, its content tau: answer tokens per forward), the LLaDA baseline
    (no cache, one token per step: G = prompt + answer, gen_length forwards for the same answer)
    and an autoregressive decoder of the same size (G = 1, one answer token per forward). Per row:
    ``floor_ms`` = max(weight bytes / bandwidth, G x 2 x params / FLOP rate), which ``bound``
    decides it, ``tokens_per_s`` = tau / floor and ``speedup_vs_ar`` against the last row.
    """
    content = float(stats.get("content_tokens") or 0)
    strategies = [
        ("this run", float(stats["mean_g"]), float(stats["content_tokens_per_forward"])),
        ("LLaDA baseline (no cache, 1 token/step)", float(prompt_len + gen_length), content / max(1, gen_length)),
        ("autoregressive, same size", 1.0, 1.0),
    ]
    read_ms = model.weight_bytes / device.bandwidth * 1e3
    rows = []
    for name, g, tau in strategies:
        compute_ms = g * 2 * model.params / device.flops * 1e3
        floor_ms = max(read_ms, compute_ms)
        rows.append({"strategy": name, "g": g, "tau": tau, "read_ms": read_ms, "compute_ms": compute_ms,
                     "floor_ms": floor_ms, "bound": "bandwidth" if read_ms >= compute_ms else "compute",
                     "tokens_per_s": tau / floor_ms * 1e3})
    ar = rows[-1]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_ar"] = row["tokens_per_s"] / ar
    return rows


# ----------------------------------------------------------------------------- concurrency

@dataclass(frozen=True)
class TeachingExample:
    """The write-up's hand-worked concurrency case: a model, the GPU (a ``DEVICES`` key), G and τ."""

    model: TargetModel
    device: str
    g: float
    tau: float


# The write-up's teaching model (手算一次账（教学模型）): "7B 模型的 BF16 权重约 1.4e10 字节" and
# "每处理一个位置的计算约 2N = 1.4e10 FLOPs", so 7e9 parameters and 1.4e10 bytes read per forward.
TEACHING_MODEL = TargetModel("teaching 7B (write-up)", 7e9, 1.4e10)
# "分块扩散 G=32、τ=4" on an H100 SXM5 (3.352 TB/s, 989.4 TFLOPS): diffusion saturates at about 9
# concurrent requests and AR overtakes at about 37.
TEACHING_EXAMPLE = TeachingExample(TEACHING_MODEL, "H100", 32.0, 4.0)
# The models a concurrency curve can be drawn for: the teaching model first, then the real ones.
CONCURRENCY_MODELS = {TEACHING_MODEL.name: TEACHING_MODEL, **TARGET_MODELS}


MAX_G = 10**6  # positions a forward recomputes: far past any sequence a model here takes
MAX_TAU = 10**4  # tokens a forward commits


def _check_g_tau(g: float, tau: float) -> None:
    if not (math.isfinite(g) and 1 <= g <= MAX_G):
        raise ValueError(f"G (positions recomputed per forward) must be from 1 to {MAX_G:,}, not {g:g}")
    if not (math.isfinite(tau) and 0 < tau <= MAX_TAU):
        raise ValueError(f"τ (tokens committed per forward) must be above 0 and at most {MAX_TAU:,}, not {tau:g}")


def concurrency_curve(model: TargetModel, device: DeviceProfile, g: float, tau: float,
                      concurrency: list[float]) -> list[dict]:
    """Decode throughput of B concurrent requests, diffusion against autoregressive, per B.

    Why: at low batch both decoders only wait for the weight read, so diffusion's τ tokens per
    forward make it about τ times faster; past the crossover every committed token costs G/τ
    positions of arithmetic and AR, which computes one position per token, catches up. The step is
    the same roofline as :func:`project` and the write-up (attention, the KV read and fixed
    overheads left out, for both decoders): a diffusion step over B requests recomputes B x G
    positions and commits B x τ tokens; an AR step computes B positions and commits B tokens.

    ``concurrency``: the numbers of requests B, whole numbers, or fractional ones such as the
    turning points of :func:`concurrency_crossovers` (a plot's corners). Per row: ``concurrency``
    (B); for ``diffusion_`` and ``ar_``: ``step_ms`` (the step floor), ``bound`` ("bandwidth" or
    "compute", as in :func:`project`), ``tokens_per_s`` (all requests together) and
    ``ms_per_token`` (one request's latency per token: step / tokens per request per step);
    ``speedup`` = diffusion tokens/s over AR tokens/s.
    """
    _check_g_tau(g, tau)
    read_ms = model.weight_bytes / device.bandwidth * 1e3
    rows = []
    for b in concurrency:
        if b < 1:
            raise ValueError(f"concurrency must be at least 1 request, not {b}")
        row: dict = {"concurrency": b}
        for name, positions, tokens in (("diffusion", b * g, tau), ("ar", b * 1.0, 1.0)):
            step_ms = step_floor_s(model.weight_bytes, model.params, positions, device) * 1e3
            compute_ms = positions * 2 * model.params / device.flops * 1e3
            row.update({f"{name}_step_ms": step_ms,
                        f"{name}_bound": "bandwidth" if read_ms >= compute_ms else "compute",
                        f"{name}_tokens_per_s": b * tokens / step_ms * 1e3,
                        f"{name}_ms_per_token": step_ms / tokens})
        row["speedup"] = row["diffusion_tokens_per_s"] / row["ar_tokens_per_s"]
        rows.append(row)
    return rows


def concurrency_crossovers(model: TargetModel, device: DeviceProfile, g: float, tau: float) -> dict:
    """Where the curves of :func:`concurrency_curve` turn, in concurrent requests (floats).

    ``crossover_positions``: positions per forward at which a step turns compute-bound.
    ``diffusion_saturates``: B x G reaches the crossover positions (the step turns compute-bound),
    so B = crossover / G; beyond it diffusion's throughput is flat at τ / (G x time per position).
    ``ar_saturates``: the same for AR (G = 1), B = crossover. ``ar_overtakes``: AR's throughput
    B / weight read reaches diffusion's flat throughput, B = crossover x τ / G; ``inf`` when τ >= G
    (AR's own ceiling, one token per position, is not above diffusion's) and ``0.0`` when τ <= 1
    (diffusion commits no more per forward than AR, so AR is never behind).
    """
    _check_g_tau(g, tau)
    x = crossover_positions(model.weight_bytes, model.params, device)
    if tau >= g:
        overtakes = math.inf
    elif tau <= 1:
        overtakes = 0.0
    else:
        overtakes = x * tau / g
    return {"crossover_positions": x, "diffusion_saturates": x / g, "ar_saturates": x, "ar_overtakes": overtakes}
