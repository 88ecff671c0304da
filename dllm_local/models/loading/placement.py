"""Where a model runs: the device and dtype it loads in, the memory free there and given back,
and the threads it computes with."""
from __future__ import annotations

import gc
import os
from typing import Iterator, Protocol

import torch

from ...devices import auto_cuda_dtype, working_dtype
from ...errors import ModelLoadError

__all__ = ["SMALL_MODEL_PARAMETERS", "apply_threads", "auto_cuda_dtype", "free_bytes", "free_device_memory",
           "pick_device", "pick_dtype"]

# A model this small runs a forward as hundreds of tiny kernels: on the CPU, one thread beats
# several (a thread team costs more to wake than it saves; see "Threads" in docs/decoding.md).
SMALL_MODEL_PARAMETERS = 50_000_000


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: the device named by the environment variable DLLM_LOCAL_DEVICE when it is set
    (the tests set it to cpu, so they run the same on a CUDA machine), else CUDA when there is one."""
    if str(device) == "auto":
        device = os.environ.get("DLLM_LOCAL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"device {device!r} is not a device name: use auto, cpu, cuda or cuda:N") from exc
    if parsed.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported: use auto, cpu, cuda or cuda:N")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return parsed


def pick_dtype(dtype: str | torch.dtype, device: torch.device, quantization: str | None = None) -> torch.dtype:
    """``"auto"``, a floating torch dtype, or its name ("bfloat16"). Auto: float32 on the CPU;
    on CUDA bfloat16 where the GPU computes in it natively (Ampere and later), else float16 (T4,
    V100 and RTX 20 run bf16 through slow emulated kernels). 8-bit always computes in float16:
    bitsandbytes casts anything else to it (and warns)."""
    if dtype == "auto":
        return torch.float16 if quantization == "8bit" else working_dtype(device)
    value = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ModelLoadError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    return value


def free_bytes(device: torch.device) -> int | None:
    """Memory free for the model where it goes: the GPU's, or the machine's (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available


def free_device_memory() -> None:
    """Give a released model's memory back: collect the reference cycles its modules hold, then
    hand the blocks CUDA's allocator keeps cached back to the GPU (none where CUDA never started)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class _Weights(Protocol):
    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


class LoadedModel(Protocol):
    """What ``apply_threads`` reads of a handle: the loader's ModelHandle and GuiderHandle both hold it."""

    @property
    def model(self) -> _Weights: ...

    @property
    def num_parameters(self) -> int: ...


def apply_threads(requested: int | None, handle: LoadedModel, batched: bool = False) -> None:
    """Set torch's thread count for this command: ``requested`` (--threads), else one thread for
    a small model on the CPU decoding one request at a time, and torch's default (every core)
    for anything else: a batch's forwards are large kernels, which a thread team does speed up."""
    if requested:
        torch.set_num_threads(requested)
    elif (not batched and next(handle.model.parameters()).device.type == "cpu"
          and handle.num_parameters < SMALL_MODEL_PARAMETERS):
        torch.set_num_threads(1)
