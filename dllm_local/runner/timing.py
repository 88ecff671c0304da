"""A forward's time as the device spent it: the GPUs the model is on synchronised around the call."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def model_gpus(model: torch.nn.Module) -> list[torch.device]:
    """The CUDA devices the model's weights are on: a model spread over several by device_map
    finishes on the last one. Only these are synchronised: touching another GPU would create a
    context there (and fail on a GPU in exclusive-process mode that another program holds)."""
    return sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=lambda d: d.index or 0)


def _sync(devices: list[torch.device]) -> None:
    for device in devices:
        torch.cuda.synchronize(device)


def timed(call: Callable[[], T], gpus: list[torch.device]) -> tuple[T, float]:
    """``call()`` and the seconds it took, the GPUs ``gpus`` synchronised before and after."""
    _sync(gpus)
    t = time.perf_counter()
    out = call()
    _sync(gpus)
    return out, time.perf_counter() - t
