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
from collections.abc import Callable
from dataclasses import dataclass

from ..devices import DeviceProfile


@dataclass(frozen=True)
class Experts:
    """A mixture of experts' routed blocks: ``per_layer`` experts in each of ``layers`` layers,
    ``routed`` of them per token, ``bytes_each`` bytes (bf16) per expert (its gate, up and down)."""

    per_layer: int
    routed: int
    layers: int
    bytes_each: float

    def distinct(self, tokens: float) -> float:
        """Expected distinct experts one layer reads when ``tokens`` tokens are each routed to
        ``routed`` of its ``per_layer`` experts: E x (1 - (1 - k/E)^T), routing taken as uniform and
        independent across tokens. One token reads k; a canvas of 256 tokens reads all 128 but 9e-6."""
        return self.per_layer * (1 - (1 - self.routed / self.per_layer) ** tokens)


@dataclass(frozen=True)
class TargetModel:
    """``params``: the parameters a position's arithmetic uses (for a mixture of experts, the dense
    ones and the ``routed`` experts of each layer); ``weight_bytes``: the bytes a forward reads when
    it reads every weight (bf16). Both leave out the input embedding, from which a forward only
    gathers its tokens' rows; the output head, a full matmul, is in both. ``experts``: a mixture of
    experts' routed blocks, whose weights a forward reads only for the experts its tokens chose."""

    name: str
    params: float
    weight_bytes: float
    experts: Experts | None = None

    def expert_read_bytes(self, positions: float) -> float:
        """The routed experts' share of :meth:`read_bytes` (0 for a dense model)."""
        e = self.experts
        return 0.0 if e is None else e.layers * e.distinct(positions) * e.bytes_each

    def read_bytes(self, positions: float) -> float:
        """Bytes a forward over ``positions`` tokens reads: every weight of a dense model; of a
        mixture of experts, the dense weights and each layer's expected distinct experts."""
        e = self.experts  # the experts no token chose are not read
        return self.weight_bytes - (0.0 if e is None else e.layers * (e.per_layer - e.distinct(positions)) * e.bytes_each)

    def floor_s(self, positions: float, device: DeviceProfile) -> float:
        """:func:`step_floor_s` of a forward over ``positions`` tokens, with the weights it reads."""
        return step_floor_s(self.read_bytes(positions), self.params, positions, device)

    def crossover_positions(self, device: DeviceProfile) -> float:
        """Positions per forward at which a forward turns compute-bound. A mixture of experts reads
        more experts as positions grow, so its crossover solves read(n) / bandwidth = n x 2 x
        params / FLOP rate; the read is concave and bounded, so the root is one, found by bisection."""
        whole = crossover_positions(self.weight_bytes, self.params, device)
        if self.experts is None:
            return whole  # read(n) <= weight_bytes: by ``whole`` the arithmetic has overtaken
        return _root(0.0, whole, lambda n: self.read_bytes(n) / device.bandwidth > n * 2 * self.params / device.flops)


def _root(low: float, high: float, before: Callable[[float], bool]) -> float:
    """Where ``before`` turns from true (at ``low``) to false (at ``high``), by bisection."""
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if before(middle) else (low, middle)
    return (low + high) / 2


def counted_target(name: str, total: int, embedding: int, experts: tuple[int, int, int, int] | None) -> TargetModel:
    """A release's target from its parameters, its untied input embedding and its experts (per layer,
    routed per token, expert layers, parameters each), or None for a dense model."""
    if experts is None:
        return TargetModel(name, total - embedding, 2 * (total - embedding))
    per_layer, routed, layers, each = experts
    active = total - embedding - (per_layer - routed) * layers * each  # the dense weights and the routed experts
    return TargetModel(name, active, 2 * (total - embedding), Experts(per_layer, routed, layers, 2 * each))


# The real models a run is projected onto. LLaDA-8B's weight index says 16,031,162,368 bytes of
# bf16 (8.016 B parameters), of which the 126,464 x 4,096 input embedding is 0.518 B; Dream-v0-7B
# is Qwen2.5-7B's 7.616 B parameters, with a 152,064 x 3,584 embedding (0.545 B).
# DiffusionGemma-26B-A4B: transformers' DiffusionGemmaConfig with gemma-4-26B-A4B's text sizes
# (DIFFUSIONGEMMA_26B_A4B_TEXT; 30 layers, 128 experts of 3 x 704 x 2,816 = 5,947,392 parameters,
# 8 routed per token) counts 25,250,986,752 text parameters on the meta device: 22,837,985,280 in
# experts and 2,413,001,472 dense (attention, the dense MLP beside the experts, routers, norms,
# the self-conditioning MLP and the 262,144 x 2,816 embedding, which the tied head reads whole).
# Encoder and decoder share these weights; the vision tower, which text never runs, is left out.
# The block-diffusion families: their model classes here, built on the meta device from each
# release's config.json sizes, count them (tests/test_costmodel_moe.py builds them again); SDAR-8B
# is Qwen3-8B's shape, SDAR-30B-A3B Qwen3-30B-A3B's, Fast-dLLM v2 7B Qwen2.5-7B's.
TARGET_MODELS = {
    "LLaDA-8B-Instruct": TargetModel("LLaDA-8B-Instruct", 8.016e9 - 0.518e9, 2 * (8.016e9 - 0.518e9)),
    "Dream-v0-Instruct-7B": TargetModel("Dream-v0-Instruct-7B", 7.616e9 - 0.545e9, 2 * (7.616e9 - 0.545e9)),
    "DiffusionGemma-26B-A4B": TargetModel("DiffusionGemma-26B-A4B", 2_413_001_472 + 30 * 8 * 5_947_392,
                                          2 * (2_413_001_472 + 30 * 128 * 5_947_392), Experts(128, 8, 30, 2 * 5_947_392)),
    **{name: counted_target(name, *counts) for name, *counts in (
        ("SDAR-8B-Chat", 8_190_735_360, 622_329_856, None),
        ("SDAR-30B-A3B-Chat", 30_532_122_624, 311_164_928, (128, 8, 48, 3 * 2048 * 768)),
        ("LLaDA2.0-mini", 16_255_638_528, 321_912_832, (256, 8, 19, 3 * 2048 * 512)),
        ("LLaDA-MoE-7B-A1B", 7_356_880_896, 321_912_832, (64, 8, 16, 3 * 2048 * 1024)),
        ("Fast-dLLM-v2-7B", 7_615_616_512, 544_997_376, None))},
}
# gemma-4-26B-A4B's text config (public copies of its config.json, e.g. ollama's Gemma 4 tests; the
# released diffusiongemma-26B-A4B config.json was not read here), as DiffusionGemmaTextConfig takes it.
DIFFUSIONGEMMA_26B_A4B_TEXT = dict(
    vocab_size=262_144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16,
    num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512, num_experts=128,
    top_k_experts=8, moe_intermediate_size=704, sliding_window=1024, max_position_embeddings=262_144)


def step_floor_s(weight_bytes: float, params: float, positions: float, device: DeviceProfile) -> float:
    """Lower bound on one forward's time: the weight read or the arithmetic, whichever is larger."""
    return max(weight_bytes / device.bandwidth, positions * 2 * params / device.flops)


def crossover_positions(weight_bytes: float, params: float, device: DeviceProfile) -> float:
    """Recomputed positions at which a forward turns from bandwidth-bound to compute-bound."""
    return weight_bytes / device.bandwidth * device.flops / (2 * params)


def project(stats: dict, prompt_len: int, gen_length: int, model: TargetModel, device: DeviceProfile) -> list[dict]:
    """A run's measured G and tau projected onto ``model`` on ``device`` at batch 1.

    Rows: this run (its mean G, its content tau: answer tokens per forward), the LLaDA baseline
    (no cache, one token per step: G = prompt + answer, gen_length forwards for the same answer)
    and an autoregressive decoder of the same size (G = 1, one answer token per forward). Per row:
    ``floor_ms`` = max(weight read / bandwidth, G x 2 x params / FLOP rate), which ``bound``
    decides it, ``tokens_per_s`` = tau / (floor + encoder) and ``speedup_vs_ar`` against the last row.

    A mixture of experts reads, per forward of G tokens, its dense weights and each layer's
    expected distinct experts (:meth:`Experts.distinct`): ``experts_read`` of ``experts_total``
    per layer, ``expert_read_ms`` of the read; the arithmetic counts the routed experts alone.
    A canvas run (stats with ``encoder_forwards``; G the canvas length, tau answer tokens per
    decoder pass) writes each finished canvas into the encoder's cache, a forward of G positions,
    as a block run (``store_forwards``) writes each finished block's K/V: their floors over the
    denoising forwards are ``encoder_ms``. The first, the prompt's, is the prefill: no row counts it."""
    content = float(stats.get("content_tokens") or 0)
    g_run = float(stats["mean_g"])
    canvas_passes = max(0, int(stats.get("encoder_forwards") or stats.get("store_forwards") or 0) - 1)
    encoder_ms = canvas_passes * model.floor_s(g_run, device) * 1e3 / max(1, int(stats.get("nfe") or 0))
    strategies = [
        ("this run", g_run, float(stats["content_tokens_per_forward"]), encoder_ms),
        ("LLaDA baseline (no cache, 1 token/step)", float(prompt_len + gen_length), content / max(1, gen_length), 0.0),
        ("autoregressive, same size", 1.0, 1.0, 0.0),
    ]
    rows = []
    for name, g, tau, encoder in strategies:
        read_ms = model.read_bytes(g) / device.bandwidth * 1e3
        compute_ms = g * 2 * model.params / device.flops * 1e3
        floor_ms = max(read_ms, compute_ms)
        rows.append({"strategy": name, "g": g, "tau": tau, "read_ms": read_ms, "compute_ms": compute_ms,
                     "floor_ms": floor_ms, "bound": "bandwidth" if read_ms >= compute_ms else "compute",
                     "encoder_ms": encoder, "encoder_forwards": canvas_passes if encoder else 0,
                     "tokens_per_s": tau / (floor_ms + encoder) * 1e3, **_expert_columns(model, g, device)})
    ar = rows[-1]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_ar"] = row["tokens_per_s"] / ar
    return rows


def _expert_columns(model: TargetModel, g: float, device: DeviceProfile) -> dict:
    """A row's experts: read per layer of the total, and their share of the read (None: dense)."""
    e = model.experts
    return {"experts_read": e and e.distinct(g), "experts_total": e and e.per_layer,
            "expert_read_ms": e and model.expert_read_bytes(g) / device.bandwidth * 1e3}


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
    rows = []
    for b in concurrency:
        if b < 1:
            raise ValueError(f"concurrency must be at least 1 request, not {b}")
        row: dict = {"concurrency": b}
        for name, positions, tokens in (("diffusion", b * g, tau), ("ar", b * 1.0, 1.0)):
            step_ms = model.floor_s(positions, device) * 1e3
            read_ms = model.read_bytes(positions) / device.bandwidth * 1e3
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

    A mixture of experts (:func:`_moe_overtakes`) also has ``ar_leads_until``: an AR step reads
    only its tokens' experts, a diffusion step of G tokens nearly all, so AR leads at low concurrency
    while read(B x G) / read(B) > τ; ``0.0`` when diffusion leads from one request."""
    _check_g_tau(g, tau)
    x = model.crossover_positions(device)
    if tau >= g:
        overtakes = math.inf
    elif tau <= 1:
        overtakes = 0.0
    elif model.experts is None:
        overtakes = x * tau / g
    else:
        return {"crossover_positions": x, "diffusion_saturates": x / g, "ar_saturates": x,
                **_moe_overtakes(model, device, g, tau, x)}
    turns = {"crossover_positions": x, "diffusion_saturates": x / g, "ar_saturates": x, "ar_overtakes": overtakes}
    return turns if model.experts is None else {**turns, "ar_leads_until": 0.0}  # read(B x G) <= G x read(B)


def _ar_lead(model: TargetModel, device: DeviceProfile, g: float, tau: float, b: float) -> float:
    """AR's throughput over diffusion's at B requests (above 1: AR is ahead)."""
    return model.floor_s(b * g, device) / (tau * model.floor_s(b, device))


def _moe_overtakes(model: TargetModel, device: DeviceProfile, g: float, tau: float, x: float) -> dict:
    """A mixture of experts' ``ar_overtakes`` and ``ar_leads_until`` (1 < τ < G), from one request
    on. Between diffusion's saturation (x / G) and AR's (x) diffusion is flat and AR rises, so AR's
    lead grows there and they cross at most once; below x / G both wait for their reads and AR's
    lead, read(B x G) / (τ read(B)), shrinks as B grows (B x G tokens already read nearly every
    expert, B tokens read more of them with every request)."""
    def crossing(low: float, high: float) -> float:  # AR's lead is below 1 at one end, above at the other
        behind_low = _ar_lead(model, device, g, tau, low) < 1
        return _root(low, high, lambda b: (_ar_lead(model, device, g, tau, b) < 1) == behind_low)

    saturates = x / g
    if _ar_lead(model, device, g, tau, saturates) >= 1:
        return {"ar_overtakes": 0.0, "ar_leads_until": 0.0}  # AR is ahead at every concurrency
    overtakes = crossing(saturates, x)
    leads = crossing(1.0, saturates) if saturates > 1 and _ar_lead(model, device, g, tau, 1.0) > 1 else 0.0
    return {"ar_overtakes": overtakes, "ar_leads_until": leads}
