"""Measure on the CPU what a step would cost a GPU: host syncs and memory allocated.

``HostSyncCounter`` counts the operations that make the host wait for the device. On a GPU each
of these stops the CPU from queuing kernels ahead until the device has caught up: reading a
value back (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``) and every op whose output size
depends on the data (``nonzero``, ``unique``, boolean-mask indexing). On the CPU they cost
nothing, but they are the same calls, so counting them here tells what a CUDA step would pay:
``with HostSyncCounter() as syncs: ...; syncs.total``.

``AllocationPeak`` tracks the tensor memory allocated inside its block, on any device, from the
ops' outputs: ``with AllocationPeak() as mem: ...; mem.peak_bytes`` (the most held at once of
what the block allocated; memory that existed before it is not counted).
"""
from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Ops that read a device value back to the host, or size their output by the data.
READBACK = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}
DATA_SIZED = {"aten.nonzero.default", "aten._unique2.default", "aten.unique_consecutive.default",
              "aten.unique_dim.default", "aten.masked_select.default"}
INDEXING = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"}


class HostSyncCounter(TorchDispatchMode):
    """Counts host syncs by kind inside its ``with`` block (``counts``, ``total``). ``tolist``
    never reaches the dispatcher, so it is counted by wrapping ``torch.Tensor.tolist``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> "HostSyncCounter":
        self._tolist = torch.Tensor.tolist
        counts, tolist = self.counts, self._tolist

        def counted_tolist(tensor: torch.Tensor):
            counts["tolist"] += 1
            return tolist(tensor)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        torch.Tensor.tolist = self._tolist
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in READBACK:
            self.counts["readback"] += 1
        elif name in DATA_SIZED:
            self.counts[name.split(".")[1]] += 1
        elif name in INDEXING and _has_bool_index(args[1]):
            self.counts["boolean index"] += 1
        return func(*args, **(kwargs or {}))


def _has_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


class AllocationPeak(TorchDispatchMode):
    """The peak of tensor memory allocated inside the block and still alive (``peak_bytes``).

    An op's output counts when its storage is new: not one of its inputs' (a view or an in-place
    op) and not seen before. Each storage is released from the count when Python frees it."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = self.peak_bytes = 0
        self._alive: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._alive.discard(key)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self._alive:
                continue
            nbytes = storage.nbytes()
            self._alive.add(key)
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._release, key, nbytes)
        return out
