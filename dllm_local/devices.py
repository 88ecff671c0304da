"""Device profiles (bandwidth and arithmetic rate: named GPUs, or this machine measured) and the
rule the I/O-aware cache decides by: reuse a position's K/V when reading it beats recomputing it.

Below the policies, the cost model and the loader, which read it (the loader its working dtype per
device); torch is imported only by the functions that ask the device, so the registry and the page
can list the devices.
"""
from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def working_dtype(device: torch.device) -> torch.dtype:
    """The dtype a model computes in on ``device`` unless told otherwise (the loader's "auto"):
    float32 on the CPU; on CUDA bfloat16 where the GPU computes in it natively, else float16."""
    import torch

    if device.type != "cuda":
        return torch.float32
    return auto_cuda_dtype(torch.cuda.get_device_capability(device))


def auto_cuda_dtype(capability: tuple[int, int]) -> torch.dtype:
    """bfloat16 on GPUs with native bf16 math (compute capability 8.0 and later), else float16
    (T4, V100 and RTX 20 run bf16 through slow emulated kernels)."""
    import torch

    return torch.bfloat16 if capability >= (8, 0) else torch.float16


def measure_device(device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> DeviceProfile:
    """This machine's copy bandwidth and matmul rate in ``dtype`` (by default the working dtype:
    bf16 on CUDA, fp16 on GPUs without native bf16, float32 on the CPU), measured once per device
    and dtype and cached."""
    import torch

    device = torch.device(device)
    if dtype is None:
        dtype = working_dtype(device)  # the dtype a model runs in there: the rate that matters
    key = f"{device}:{dtype}"
    if key in _measured:
        return _measured[key]
    if device.type == "cuda":
        # n = 8192 keeps the tensor cores busy; 256 MiB per copy buffer is 4x any L2 cache (60-72 MB
        # on H100/H200), so the copy streams from HBM, and the two buffers still fit beside an 8B
        # model on a 24 GB card (the adaptive cache measures on its first run).
        n, copy_bytes, min_reps, max_reps = 8192, 2**28, 10, 10_000
    else:
        # The CPU measurement stays cheap: tests and the adaptive cache call it on small machines.
        n, copy_bytes, min_reps, max_reps = 1024, 32 * 2**20, 3, 50
    a = torch.randn(n, n, device=device, dtype=dtype)
    buf = torch.empty(copy_bytes // 4, device=device, dtype=torch.float32)
    out = torch.empty_like(buf)
    mm = _seconds_per_call(lambda: a @ a, device, min_reps, max_reps)
    cp = _seconds_per_call(lambda: out.copy_(buf), device, min_reps, max_reps)
    # A copy reads the buffer once and writes it once.
    profile = DeviceProfile(f"this machine ({device.type})", 2 * copy_bytes / cp, 2 * n**3 / mm)
    _measured[key] = profile
    return profile


# Long enough that timer resolution and the synchronisation around a batch are noise.
_MIN_TIMED_S = 0.05


def _seconds_per_call(fn: Callable[[], object], device: torch.device, min_reps: int, max_reps: int) -> float:
    """Mean seconds of ``fn`` over a batch of at least ``min_reps`` calls lasting ``_MIN_TIMED_S``
    (or ``max_reps`` calls), so launch latency and the single synchronisation are amortised."""
    fn()  # warm-up: allocation, kernel selection and page faults land here, not in the timing
    reps = min_reps
    while True:
        _sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= _MIN_TIMED_S or reps >= max_reps:
            return elapsed / reps
        reps = min(max_reps, 2 * reps)


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = torch.get_num_threads()
    return f"{cpu}, {threads} torch thread{'s' if threads != 1 else ''}{gpu}"
