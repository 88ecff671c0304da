"""The cost model's view of a loaded model (logical parameters, bytes a forward reads, also under
bitsandbytes 4-bit and 8-bit) and of this machine (measure_device), on the CPU."""
import copy
import logging

import pytest
import torch
from torch import nn

from dllm_local import devices
from dllm_local.devices import measure_device
from dllm_local.models.loading.footprint import logical_parameters, weight_read_bytes

VOCAB, D, HIDDEN = 4096, 64, 256


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _fp_model() -> nn.Sequential:
    torch.manual_seed(0)
    # The embedding (1 MiB of fp32) outweighs the linear layers, as LLaDA-8B's 1 GB embedding
    # is a sizeable share of its weights.
    return nn.Sequential(nn.Embedding(VOCAB, D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D, bias=False))


@pytest.fixture(scope="module")
def bnb():
    bnb = pytest.importorskip("bitsandbytes")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # the optional-kernels warning
    return bnb


def _quantized(fp: nn.Sequential, linear) -> nn.Sequential:
    model = copy.deepcopy(fp)
    for i, layer in enumerate(model):
        if isinstance(layer, nn.Linear):
            model[i] = linear(layer)
    return model.to("cpu")  # moving an unquantized bitsandbytes parameter quantizes it, also to the CPU


def _nf4(bnb, double_quant: bool):
    def make(layer: nn.Linear) -> nn.Module:
        q = bnb.nn.Linear4bit(layer.in_features, layer.out_features, bias=layer.bias is not None,
                              compute_dtype=torch.float32, compress_statistics=double_quant, quant_type="nf4")
        q.weight = bnb.nn.Params4bit(layer.weight.data, requires_grad=False, compress_statistics=double_quant,
                                     quant_type="nf4")
        if layer.bias is not None:
            q.bias = nn.Parameter(layer.bias.data, requires_grad=False)
        return q
    return make


def _int8(bnb):
    def make(layer: nn.Linear) -> nn.Module:
        q = bnb.nn.Linear8bitLt(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                has_fp16_weights=False)
        q.weight = bnb.nn.Int8Params(layer.weight.data, requires_grad=False, has_fp16_weights=False)
        if layer.bias is not None:
            q.bias = nn.Parameter(layer.bias.data, requires_grad=False)
        return q
    return make


def test_full_precision_reads_all_but_the_embedding():
    fp = _fp_model()
    assert logical_parameters(fp) == sum(p.numel() for p in fp.parameters())
    everything = sum(_bytes(p) for p in fp.parameters())
    assert weight_read_bytes(fp) == everything - _bytes(fp[0].weight)


def test_tied_embedding_is_read_by_the_head():
    fp = _fp_model()
    head = nn.Linear(D, VOCAB, bias=False)
    head.weight = fp[0].weight
    tied = nn.Sequential(*fp, head)
    assert weight_read_bytes(tied) == sum(_bytes(p) for p in tied.parameters())  # the shared weight once


@pytest.mark.parametrize("weight_tying", [False, True])
def test_llada_head_tied_by_config(weight_tying):
    from dllm_local.models.llada import LLaDAConfig, LLaDAModelLM

    config = LLaDAConfig(d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64, vocab_size=512, embedding_size=512,
                         max_sequence_length=64, weight_tying=weight_tying, mask_token_id=511)
    model = LLaDAModelLM(config)
    everything = sum(_bytes(p) for p in model.parameters())
    embedding = _bytes(model.get_input_embeddings().weight)
    # Tied, the head is F.linear on the embedding weight: no module holds it twice, the config says.
    assert weight_read_bytes(model) == (everything if weight_tying else everything - embedding)


@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_counts_logical_parameters_and_reads_packed_weights(bnb, double_quant):
    fp = _fp_model()
    q = _quantized(fp, _nf4(bnb, double_quant))
    assert isinstance(q[1].weight, bnb.nn.Params4bit) and q[1].weight.bnb_quantized
    # The bug this guards against: numel of packed NF4 is about half the logical count.
    assert sum(p.numel() for p in q.parameters()) < logical_parameters(fp)
    assert logical_parameters(q) == logical_parameters(fp)

    packed = _bytes(q[1].weight) + _bytes(q[2].weight)
    assert packed == (D * HIDDEN + HIDDEN * D) // 2  # two NF4 values per byte
    read = weight_read_bytes(q)
    constants = read - packed - _bytes(q[1].bias)
    # One absmax per 64-weight block (fp32, or 8-bit when double-quantized) plus code tables.
    assert 0 < constants < packed / 2
    assert read < _bytes(q[0].weight)  # the gathered embedding is not read whole


@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_cpu_repacking_keeps_the_counts(bnb, double_quant):
    # On CPUs with AVX512-BF16 the first forward repacks each weight and unnests its quant state
    # (deleting state2); repack directly so the test does not depend on this machine's CPU.
    repack = getattr(bnb.functional, "_convert_weight_packed_for_cpu", None)
    if repack is None:
        pytest.skip("this bitsandbytes has no CPU repacking")
    fp = _fp_model()
    q = _quantized(fp, _nf4(bnb, double_quant))
    packed = _bytes(q[1].weight) + _bytes(q[2].weight)
    for layer in (q[1], q[2]):
        layer.weight.data, layer.weight.quant_state = repack(layer.weight.data, layer.weight.quant_state)
    assert logical_parameters(q) == logical_parameters(fp)
    assert packed < weight_read_bytes(q) - _bytes(q[1].bias) < 1.5 * packed


def test_int8_counts_logical_parameters_and_reads_int8_with_scales(bnb):
    fp = _fp_model()
    q = _quantized(fp, _int8(bnb))
    assert q[1].weight.dtype == torch.int8
    assert logical_parameters(q) == logical_parameters(fp)
    scales = (HIDDEN + D) * 4  # one fp32 scale per output row
    assert weight_read_bytes(q) == D * HIDDEN + HIDDEN * D + scales + _bytes(q[1].bias)


def test_seconds_per_call_repeats_until_enough_time(monkeypatch):
    calls = []
    monkeypatch.setattr(devices, "_MIN_TIMED_S", 0.0)
    devices._seconds_per_call(lambda: calls.append(1), torch.device("cpu"), 3, 50)
    assert len(calls) == 1 + 3  # warm-up, then min_reps when they already last long enough
    calls.clear()
    monkeypatch.setattr(devices, "_MIN_TIMED_S", 3600.0)
    devices._seconds_per_call(lambda: calls.append(1), torch.device("cpu"), 3, 50)
    assert len(calls) == 1 + 3 + 6 + 12 + 24 + 48 + 50  # doubling, capped at max_reps


def test_measure_device_cpu(monkeypatch):
    monkeypatch.setattr(devices, "_measured", {})
    profile = measure_device("cpu")
    assert profile.name == "this machine (cpu)"
    # Loose bounds any CPU meets: 0.1 GB/s to 10 TB/s copies, 0.1 GFLOP/s to 100 TFLOP/s fp32.
    assert 1e8 < profile.bandwidth < 1e13
    assert 1e8 < profile.flops < 1e14
    assert measure_device(torch.device("cpu"), torch.float32) is profile  # cached per device and dtype
