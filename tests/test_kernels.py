"""Kernel counts (``dllm_local.experiments.kernels``): the counters on a toy whose counts are known,
and what torch.compile makes of a LLaDA layer in the dual cache's step (``bench/kernel_counts.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from dllm_local.experiments.kernels import (count_compiled_kernels, count_eager_kernels, kernels_per_layer,
                                            wrapper_launches)

BENCH = Path(__file__).resolve().parents[1] / "bench" / "kernel_counts.py"
# Measured 9 with torch 2.13 on the CPU, Q/K/V and gate/up fused at load (eager: 36 a layer; 13 and
# 39 unfused); one kernel of slack for another torch's fusion choices, none for a layer that stops fusing.
MAX_COMPILED_PER_LAYER = 10


def _kernel_counts_bench():
    spec = importlib.util.spec_from_file_location("kernel_counts", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toy(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    y = x @ w.t()  # t: a view, no kernel; mm: 1
    y.add_(1)  # in place: 1
    out.index_copy_(0, rows, y.relu())  # relu: 1, index_copy_: 1
    q = out.view(1, 1, 8, 8)  # a view
    return F.scaled_dot_product_attention(q, q, q).sum()  # attention: 1, sum: 1


def test_the_counters_count_a_toy_as_its_ops_and_as_inductor_fuses_them():
    args = (torch.randn(8, 8), torch.randn(8, 8), torch.zeros(8, 8), torch.arange(8).flip(0))
    with torch.inference_mode():
        assert count_eager_kernels(toy, *args) == 6
        # mm a library call; add, relu and index_copy_ one C++ kernel; attention the aten op inductor
        # falls back to; the sum, which reads attention's output, a kernel of its own.
        assert count_compiled_kernels(toy, *args) == 4


# A wrapper in the shape inductor writes for CUDA (no GPU here to generate one): a library matmul,
# a Triton kernel, two aten fallbacks that launch one and one that is a view; the rest launches nothing.
CUDA_WRAPPER = '''
aten = torch.ops.aten
async_compile = AsyncCompile()
triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', """
@triton.jit
def triton_poi_fused_add_relu_0(in_out_ptr0, xnumel, XBLOCK: tl.constexpr):
    tmp0 = tl.load(in_out_ptr0 + x0)
""", device_str='cuda')
async_compile.wait(globals())
del async_compile

class Runner:
    def call(self, args):
        arg0_1, arg1_1, arg2_1 = args
        args.clear()
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((8, 8), (8, 1), torch.float32)
            extern_kernels.mm(arg0_1, reinterpret_tensor(arg1_1, (8, 8), (1, 8), 0), out=buf0)
            stream0 = get_raw_stream(0)
            triton_poi_fused_add_relu_0.run(buf0, 64, stream=stream0)
            buf1 = torch.ops.aten._scaled_dot_product_efficient_attention.default(buf0, buf0, buf0, None, False)
            buf2 = torch.ops.aten.view.dtype(buf1[0], torch.int32)
            aten.index_put_(arg2_1, [arg1_1], buf2, True)
        return (buf2, )
'''


def test_a_cuda_wrapper_launches_its_triton_library_and_fallback_kernels():
    assert wrapper_launches(CUDA_WRAPPER) == 4


def test_compiling_fuses_a_llada_layer_of_the_dual_step_to_under_half_its_eager_kernels(tmp_path):
    bench = _kernel_counts_bench()
    eager, compiled = {}, {}
    with torch.inference_mode():
        for n_layers in (2, 4):
            step = bench.dual_step(bench.load_float32(tmp_path / f"m{n_layers}", n_layers))
            eager[n_layers], compiled[n_layers] = count_eager_kernels(step), count_compiled_kernels(step)
    eager_per_layer = kernels_per_layer(eager[2], 2, eager[4], 4).per_layer
    compiled_per_layer = kernels_per_layer(compiled[2], 2, compiled[4], 4).per_layer
    assert compiled_per_layer <= MAX_COMPILED_PER_LAYER, (compiled_per_layer, eager_per_layer)
    assert compiled_per_layer < eager_per_layer / 2, (compiled_per_layer, eager_per_layer)
