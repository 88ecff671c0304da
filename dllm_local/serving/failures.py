"""What the engine says when a request fails: its error as it crosses the pipe, and which GPU
failures the engine survives (an out-of-memory frees the cache) and which end it (a lost context)."""
from __future__ import annotations

import pickle
import traceback

import torch

from ..errors import DllmError

OOM_ADVICE = ("the GPU ran out of memory; the cache was freed. Try 4-bit quantization, "
              "a shorter generation length or a smaller block size.")
LOAD_OOM_ADVICE = ("the GPU has not enough free memory for that model; the previous model is loaded again. "
                   "Try 4-bit or 8-bit quantization, or close other programs that use the GPU.")
# Allocation failures that reach Python as a plain RuntimeError (cuBLAS and bitsandbytes workspaces).
OOM_MARKERS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
# Errors after which the CUDA context is unusable: every later call fails with the same error.
FATAL_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
                 "illegal instruction", "uncorrectable ECC", "CUDA error: unknown error")


def failure_kind(exc: BaseException) -> str | None:
    """"oom" (the cache is freed and the engine goes on), "fatal" (the GPU context is lost: the
    engine process ends and the next request starts a new one) or None (an ordinary error)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom"
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if any(marker in text for marker in FATAL_MARKERS):
        return "fatal"
    if any(marker in text for marker in OOM_MARKERS):
        return "oom"
    return None


def portable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a DllmError naming it; unexpected
    ones are also printed with their traceback here, for whoever reads the server's log."""
    if not isinstance(exc, DllmError):
        traceback.print_exception(exc)
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        return DllmError(f"{type(exc).__name__}: {exc}")
