"""The tau/G cost model of the dLLM cost write-up, and the device table it runs on.

A forward at low batch is bounded below by reading the weights once and by the arithmetic
of the positions it recomputes: ``max(weight_bytes / bandwidth, G * 2 * params / flops)``.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    bandwidth: float  # bytes per second
    flops: float  # dense bf16 (or the device's working dtype) FLOP per second


DEVICES = {
    "A100": DeviceProfile("A100 SXM4 80GB", 2.039e12, 312e12),
    "H100": DeviceProfile("H100 SXM5", 3.352e12, 989.4e12),
    "H200": DeviceProfile("H200 SXM", 4.8e12, 989.4e12),
    "RTX 4090": DeviceProfile("RTX 4090", 1.008e12, 165.2e12),
    "RTX 3090": DeviceProfile("RTX 3090", 0.936e12, 71e12),
    "L4": DeviceProfile("L4", 0.3e12, 121e12),
}
_measured: dict[str, DeviceProfile] = {}


def measure_device(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> DeviceProfile:
    """This machine's copy bandwidth and matmul rate, measured once per device and cached."""
    device = torch.device(device)
    key = f"{device}:{dtype}"
    if key in _measured:
        return _measured[key]
    n = 1024 if device.type == "cpu" else 4096
    a = torch.randn(n, n, device=device, dtype=dtype)
    buf = torch.empty(32 * 2**20 // 4, device=device)
    out = torch.empty_like(buf)

    def timed(fn, reps: int) -> float:
        fn()
        _sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        return (time.perf_counter() - t) / reps

    mm = timed(lambda: a @ a, 3)
    cp = timed(lambda: out.copy_(buf), 5)
    profile = DeviceProfile(f"this machine ({device.type})", 2 * buf.numel() * 4 / cp, 2 * n**3 / mm)
    _measured[key] = profile
    return profile


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_floor_s(weight_bytes: float, params: float, positions: float, device: DeviceProfile) -> float:
    """Lower bound on one forward's time: the weight read or the arithmetic, whichever is larger."""
    return max(weight_bytes / device.bandwidth, positions * 2 * params / device.flops)


def crossover_positions(weight_bytes: float, params: float, device: DeviceProfile) -> float:
    """Recomputed positions at which a forward turns from bandwidth-bound to compute-bound."""
    return weight_bytes / device.bandwidth * device.flops / (2 * params)


def reuse_beats_recompute(kv_bytes_per_position: float, params: float, device: DeviceProfile) -> bool:
    """Reading a position's K/V (all layers) is cheaper than recomputing the position."""
    return kv_bytes_per_position / device.bandwidth < 2 * params / device.flops


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
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {torch.get_num_threads()} torch threads{gpu}"


def cost_rows(weight_bytes: float, params: float, strategies: list[dict], device: DeviceProfile) -> list[dict]:
    """The cost-model panel: per strategy, the predicted step floor next to the measured step.

    Each strategy dict has ``name``, ``g`` (positions recomputed per forward), ``tau`` (tokens per
    forward) and optionally ``measured_step_s``. The low-batch speedup over an autoregressive
    model of the same size is about ``tau`` (each forward costs about one weight read, like an
    AR step); where compute dominates, the throughput ratio is about ``tau / g``.
    """
    rows = []
    for s in strategies:
        floor = step_floor_s(weight_bytes, params, s["g"], device)
        rows.append({
            "strategy": s["name"], "g": s["g"], "tau": s["tau"], "floor_ms": floor * 1e3,
            "bound": "bandwidth" if weight_bytes / device.bandwidth >= s["g"] * 2 * params / device.flops else "compute",
            "measured_ms": None if s.get("measured_step_s") is None else s["measured_step_s"] * 1e3,
            "speedup_low_batch": s["tau"], "ratio_compute_bound": s["tau"] / s["g"] if s["g"] else None,
        })
    return rows
