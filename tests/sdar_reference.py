"""SDAR's released modelling and sampler, transcribed in plain torch as the independent check.

Written from JetAstra/SDAR's ``training/model/SDAR-4B-Chat/modeling_sdar.py`` (inference branch)
and ``generate.py`` (``block_diffusion_generate``); the MoE layer from transformers' Qwen3-MoE
(no SDAR MoE modelling file is public: its engines' loaders read Qwen3-MoE's layout). It reads
the checkpoint's config.json and safetensors itself and imports nothing from dllm_local.models.

- ``forward``: Qwen3 layers (per-head RMSNorm of q and k, rotary on ``position_ids``) under the
  4-D attention mask the sampler builds; ``past`` is SDAR's DynamicCache: with ``store_kv`` the
  fresh K/V are appended to it, without, they are attended after it and dropped.
- ``generate``: the prompt's whole blocks prefilled (stored); each block then denoised by forwards
  that read the cache, and stored by one more forward once it has no mask left. Temperature 0:
  greedy argmax, its plain softmax probability the confidence (the released code divides by the
  temperature, so it cannot run at 0). Denoising and store forwards are counted apart.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


@dataclass
class Reference:
    config: dict
    w: dict[str, torch.Tensor]
    denoising_forwards: int = 0
    store_forwards: int = 0
    routed: list = field(default_factory=list)  # (layer, [n, k] experts) of the last forward


def load(path: str | Path, dtype: torch.dtype = torch.float32) -> Reference:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    w = {}
    for f in files:
        w.update({k: v.to(dtype) for k, v in load_file(path / f).items()})
    if config.get("tie_word_embeddings"):
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return Reference(config, w)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(c: dict, position_ids: torch.Tensor, dtype: torch.dtype):
    hd = c["head_dim"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _mlp(w: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = x @ w[prefix + "gate_proj.weight"].T, x @ w[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def _sparse(c: dict, i: int) -> bool:
    return (c.get("num_experts", 0) > 0 and i not in c.get("mlp_only_layers", [])
            and (i + 1) % c.get("decoder_sparse_step", 1) == 0)


def _moe(ref: Reference, i: int, x: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE: float32 softmax over the router's logits, top-k, renormalised when norm_topk_prob."""
    c, w, p = ref.config, ref.w, f"model.layers.{i}.mlp."
    b, n, d = x.shape
    flat = x.reshape(-1, d)
    probs = F.softmax(flat @ w[p + "gate.weight"].T, dim=-1, dtype=torch.float)
    top, idx = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
    if c.get("norm_topk_prob", False):
        top = top / top.sum(-1, keepdim=True)
    top = top.to(x.dtype)
    ref.routed.append((i, idx.view(b, n, -1)[0]))
    out = torch.zeros_like(flat)
    for e in range(c["num_experts"]):
        rows, k = torch.where(idx == e)
        if rows.numel():
            out.index_add_(0, rows, _mlp(w, f"{p}experts.{e}.", flat[rows]) * top[rows, k, None])
    return out.view(b, n, d)


def forward(ref: Reference, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            position_ids: torch.Tensor, past: list | None = None, store_kv: bool = False) -> torch.Tensor:
    """SDARForCausalLM's eval forward: logits ``[batch, n, vocab]``. ``attention_mask``: ``[1, n,
    past + n]`` bool (True: attend), None: every key. ``past``: a list of per-layer (K, V)."""
    c, w = ref.config, ref.w
    ref.routed = []
    H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][input_ids]
    b, n, _ = x.shape
    cos, sin = _rope(c, position_ids, x.dtype)
    cos, sin = cos[:, None], sin[:, None]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(b, n, H, hd), w[p + "self_attn.q_norm.weight"], eps)
        k = _rms((h @ w[p + "self_attn.k_proj.weight"].T).view(b, n, KV, hd), w[p + "self_attn.k_norm.weight"], eps)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, n, KV, hd).transpose(1, 2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past is not None and store_kv:
            if len(past) > i:
                past[i] = (torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2))
            else:
                past.append((k, v))
            k, v = past[i]
        elif past is not None and len(past) > i:  # read the cache, keep the fresh K/V out of it
            k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        scores = (q @ k.transpose(2, 3)) * hd ** -0.5
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask[:, None, :, : k.shape[2]], float("-inf"))
        attn = (F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v).transpose(1, 2).reshape(b, n, H * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (_moe(ref, i, h) if _sparse(c, i) else _mlp(w, p + "mlp.", h))
    return _rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def block_mask(num_blocks: int, block_length: int) -> torch.Tensor:
    """The sampler's block-diffusion mask ``[1, L, L]`` (True: attend): a block sees itself and
    every block before it."""
    blocks = torch.tril(torch.ones(num_blocks, num_blocks, dtype=torch.bool))
    return blocks.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)[None]


def _transfer_counts(block_length: int, steps: int) -> torch.Tensor:
    counts = torch.full((steps,), block_length // steps, dtype=torch.int64)
    counts[: block_length % steps] += 1
    return counts


@torch.no_grad()
def generate(ref: Reference, prompt: list[int], mask_id: int, gen_length: int, block_length: int,
             denoising_steps: int, remasking_strategy: str = "low_confidence_dynamic",
             confidence_threshold: float = 0.85, stopping_criteria_idx: list[int] | None = None) -> torch.Tensor:
    """``block_diffusion_generate`` at temperature 0: the whole canvas ``[1, num_blocks * B]``;
    ``ref.denoising_forwards`` and ``ref.store_forwards`` count this run's forwards."""
    ref.denoising_forwards = ref.store_forwards = 0
    P, B = len(prompt), block_length
    num_blocks = (P + gen_length + B - 1) // B
    mask = block_mask(num_blocks, B)
    positions = torch.arange(num_blocks * B)[None]
    x = torch.full((1, num_blocks * B), mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    past: list = []
    prefill = (P // B) * B
    if prefill:
        forward(ref, x[:, :prefill], mask[:, :prefill, :prefill], positions[:, :prefill], past, store_kv=True)
        ref.store_forwards += 1
    counts = _transfer_counts(B, denoising_steps)
    for nb in range(P // B, num_blocks):
        lo, hi = nb * B, (nb + 1) * B
        cur = x[:, lo:hi].clone()
        cur_mask, cur_pos = mask[:, lo:hi, :hi], positions[:, lo:hi]
        for step in range(denoising_steps + 1):
            masked = cur == mask_id
            if not masked.any():
                forward(ref, cur, cur_mask, cur_pos, past, store_kv=True)
                ref.store_forwards += 1
                break
            logits = forward(ref, cur, cur_mask, cur_pos, past, store_kv=False)
            ref.denoising_forwards += 1
            probs = F.softmax(logits.float(), dim=-1)
            x0 = probs.argmax(-1)
            x0_p = probs.gather(-1, x0[..., None])[..., 0]
            confidence = torch.where(masked, x0_p, -torch.inf)
            transfer = torch.zeros_like(masked)
            if remasking_strategy == "low_confidence_static":
                transfer[0, torch.topk(confidence[0], int(counts[step])).indices] = True
            elif remasking_strategy == "low_confidence_dynamic":
                high = confidence[0] > confidence_threshold
                if high.sum() >= counts[step]:
                    transfer[0] = high
                else:
                    transfer[0, torch.topk(confidence[0], int(counts[step])).indices] = True
            else:
                raise ValueError(f"unknown remasking strategy {remasking_strategy!r}")
            cur[transfer] = x0[transfer]
        x[:, lo:hi] = cur
        if stopping_criteria_idx is not None and any(s in x[0, P:].tolist() for s in stopping_criteria_idx):
            break
    return x
