"""Kernels one call launches, eager and compiled by inductor, counted on the CPU for what a GPU would launch.

On a GPU an eager op costs some 15-20 µs of host time to dispatch, so at small batches a forward's
time is its kernel count times that, whatever the arithmetic. The ops a call dispatches are the same
on every device, so ``count_eager_kernels`` counts them here; ``count_compiled_kernels`` counts the
launches in the code inductor generates for the call, where pointwise ops are fused (C++ kernels on
the CPU, Triton kernels on CUDA). ``kernels_per_layer`` splits a count taken at two depths into what
each transformer layer adds and the fixed rest (embedding, final norm, head).
"""
from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from typing import Any, Callable, NamedTuple
from unittest import mock

import torch
from torch._inductor.output_code import CompiledFxGraph
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose schema says they return a tensor of their own, yet run no kernel: allocations (nothing
# runs until something writes the tensor) and ``_unsafe_view``, a view its schema does not annotate.
NO_KERNEL = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided", "_unsafe_view"}


def launches_kernel(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` runs a kernel, read from its schema: it writes an input (``add_``,
    ``index_copy_``, an ``out=`` variant) or returns a tensor of its own. Not a view or alias of an
    input (``view``, ``transpose``, ``expand``, ``select``, ``split``'s pieces, ``detach``), a change
    of metadata in place (``unsqueeze_``, tagged ``inplace_view``), a value read back to the host
    (``_local_scalar_dense`` returns a number, no tensor), nor one of ``NO_KERNEL``."""
    if torch.Tag.inplace_view in op.tags or op.overloadpacket.__name__ in NO_KERNEL:
        return False
    schema = op._schema
    if any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments):
        return True
    return any(ret.alias_info is None and "Tensor" in str(ret.type) for ret in schema.returns)


class KernelCounter(TorchDispatchMode):
    """Counts the kernels the ops inside its block launch (``launches_kernel``), by op (``ops``).
    A composite op (``linear``, ``matmul``, ``scaled_dot_product_attention``) reaches the mode whole
    under ``torch.inference_mode``; it is decomposed here into the ops that really run, as outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self:
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        if launches_kernel(func):
            self.ops[str(func)] += 1
        return func(*args, **kwargs)


def count_eager_kernels(fn: Callable[..., Any], *args: Any) -> int:
    """Kernels ``fn(*args)`` launches in eager PyTorch: one per op that runs one."""
    with KernelCounter() as counter:
        fn(*args)
    return counter.total


def count_compiled_kernels(fn: Callable[..., Any], *args: Any) -> int:
    """Kernels ``fn(*args)`` launches compiled by inductor (``fullgraph=False``: a graph break splits
    the call into several graphs). The first call compiles (after ``torch._dynamo.reset()``, so no
    graph of an earlier function is reused); the second records the generated wrapper of each graph
    as it runs, so a graph that runs twice in a call counts twice. Not counted: ops Python runs
    between graphs at a graph break (the breaking op, mostly a value read back to the host)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="inductor", fullgraph=False)
    compiled(*args)
    ran: list[str] = []
    run_graph = CompiledFxGraph.__call__

    def recording(graph: CompiledFxGraph, inputs):
        ran.append(graph.source_code)
        return run_graph(graph, inputs)

    with mock.patch.object(CompiledFxGraph, "__call__", recording):
        compiled(*args)
    return sum(wrapper_launches(source) for source in ran)


@cache
def wrapper_launches(source: str) -> int:
    """Kernel launches in one graph's generated Python wrapper (inductor's default, not
    ``cpp_wrapper``): calls of the kernels it compiles (``cpp_fused_*(...)`` on the CPU,
    ``triton_*.run(...)`` on CUDA, each bound to ``async_compile``), of library kernels
    (``extern_kernels.mm``, ``bmm``, ``addmm``), of aten ops it falls back to that launch one
    (``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``, ``aten.index_put_``; not
    ``reinterpret_tensor``, a view) and device copies (``dst.copy_(src)``). The wrapper runs
    straight through (a loop in the model is unrolled), so each call site launches once."""
    tree = ast.parse(source)
    compiled = {target.id for node in tree.body if isinstance(node, ast.Assign) and _compiles(node.value)
                for target in node.targets if isinstance(target, ast.Name)}
    return sum(_launches(node.func, compiled) for node in ast.walk(tree) if isinstance(node, ast.Call))


def _compiles(value: ast.expr) -> bool:
    """A kernel's definition: ``name = async_compile.cpp_pybinding(...)`` or ``.triton(...)``."""
    return isinstance(value, ast.Call) and _dotted(value.func).startswith("async_compile.")


def _launches(func: ast.expr, compiled: set[str]) -> bool:
    name = _dotted(func)
    if name in compiled or (name.endswith(".run") and name[: -len(".run")] in compiled):
        return True
    if name.startswith("extern_kernels.") or (isinstance(func, ast.Attribute) and func.attr == "copy_"):
        return True
    if name.startswith(("aten.", "torch.ops.")):
        return launches_kernel(_op(name))
    return False


def _dotted(func: ast.expr) -> str:
    """``a.b.c`` for a call of an attribute chain on a name, else ``""``."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    return ".".join([func.id, *reversed(parts)]) if isinstance(func, ast.Name) else ""


def _op(name: str) -> torch._ops.OpOverload:
    """The op a wrapper calls by ``aten.X[.overload]`` or ``torch.ops.ns.X[.overload]`` (a packet
    alone: its default overload, as calling it picks for these calls)."""
    parts = name.split(".")
    namespace, rest = (parts[2], parts[3:]) if parts[0] == "torch" else (parts[0], parts[1:])
    op = getattr(getattr(torch.ops, namespace), rest[0])
    return getattr(op, rest[1]) if len(rest) > 1 else op.default


class LayerSplit(NamedTuple):
    """A count as ``per_layer`` times the layers plus ``fixed``."""

    per_layer: float
    fixed: float


def kernels_per_layer(count_a: int, layers_a: int, count_b: int, layers_b: int) -> LayerSplit:
    """What each layer adds, from counts of one call at two depths ((b - a) / layers apart),
    and the rest of the count at either depth (embedding, final norm, head, the prologue)."""
    per_layer = (count_b - count_a) / (layers_b - layers_a)
    return LayerSplit(per_layer, count_a - per_layer * layers_a)
