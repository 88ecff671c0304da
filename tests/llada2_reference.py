"""An independent plain-torch transcription of LLaDA2's released modelling and samplers, for tests.

Written from reading the released ``modeling_llada2_moe.py`` (the hub file's arithmetic: fused QKV,
per-head RMSNorm on Q and K, rotary on the first ``partial_rotary_factor`` of each head, eager
attention with an additive 4-D mask, the grouped sigmoid router with its bias and ``moe_infer``'s
weighted sum, ``lm_head(...).float()``), its ``generate`` (LLaDA2.0: per block at most ``steps``
denoising forwards, each committing every masked position whose top-1 probability is
> ``threshold`` or, when fewer than that step's quota pass, the quota's most confident) and
LLaDA2.1's ``generate`` with token-to-token editing. It imports nothing from dllm_local.models.

The released samplers recompute the whole window ``[0, end of the current block)`` every step; an
exact cache (``cache=True`` here: a prefill of the prompt's whole blocks, each step the current
block alone over the stored K/V, one forward storing a finished block) must give the same tokens.
Both count denoising forwards (``nfe``) apart from K/V-storing ones (``store_forwards``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class Reference:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.cfg = json.loads((folder / "config.json").read_text())
        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        self.w: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index.values())):
            self.w.update({k: v.float() for k, v in load_file(str(folder / shard)).items()})

    # ------------------------------------------------------------------ the modelling
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(var + self.cfg["rms_norm_eps"]))

    def _mlp(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        w = self.w
        return F.linear(F.silu(F.linear(x, w[prefix + "gate_proj.weight"])) * F.linear(x, w[prefix + "up_proj.weight"]),
                        w[prefix + "down_proj.weight"])

    def _moe(self, x: torch.Tensor, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        c, w = self.cfg, self.w
        n, h = x.shape
        logits = F.linear(x.float(), w[prefix + "gate.weight"].float())
        scores = torch.sigmoid(logits)
        routing = scores + w[prefix + "gate.expert_bias"]
        groups = routing.view(n, c["n_group"], -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(groups, k=c["topk_group"], dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(groups).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(n, c["n_group"], c["num_experts"] // c["n_group"]).reshape(n, -1)
        _, topk_idx = torch.topk(routing.masked_fill(~score_mask.bool(), float("-inf")), k=c["num_experts_per_tok"], dim=-1)
        weight = torch.gather(scores, 1, topk_idx)
        if c["num_experts_per_tok"] > 1:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        weight = weight * c["routed_scaling_factor"]
        # moe_infer: tokens sorted by expert, each expert once, outputs scattered back, weighted sum
        order = topk_idx.view(-1).argsort()
        sorted_tokens = x[order // topk_idx.shape[1]]
        counts = torch.bincount(topk_idx.view(-1), minlength=c["num_experts"]).tolist()
        outs, start = [], 0
        for e, count in enumerate(counts):
            if count:
                outs.append(self._mlp(sorted_tokens[start:start + count], f"{prefix}experts.{e}."))
                start += count
        outs = torch.cat(outs)
        back = torch.empty_like(outs)
        back[order] = outs
        y = (back.view(*topk_idx.shape, -1) * weight.unsqueeze(-1)).sum(dim=1)
        if c.get("num_shared_experts") is not None:
            y = y + self._mlp(x, prefix + "shared_experts.")
        return y, topk_idx

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: list | None = None) -> tuple[torch.Tensor, list, list]:
        """``ids``/``positions`` ``[n]``; ``mask`` ``[n, keys]`` additive (0 / -inf), the keys being the
        ``past`` K/V (a list per layer of ``(k, v)``) followed by these positions. Returns float32
        logits ``[n, vocab]``, this forward's K/V per layer, and each MoE layer's routed experts."""
        c, w = self.cfg, self.w
        heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or c["hidden_size"] // heads
        rot = int(hd * c.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
        freqs = (inv_freq[:, None] @ positions[None, :].float()).T
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()

        def rotate(t: torch.Tensor) -> torch.Tensor:
            r, rest = t[..., :rot], t[..., rot:]
            half = torch.cat((-r[..., rot // 2:], r[..., : rot // 2]), dim=-1)
            return torch.cat((r * cos + half * sin, rest), dim=-1)

        x = w["model.word_embeddings.weight"][ids]
        n = x.shape[0]
        fresh, routed = [], []
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self._rms(x, w[p + "input_layernorm.weight"])
            qkv = F.linear(h, w[p + "attention.query_key_value.weight"], w.get(p + "attention.query_key_value.bias"))
            q, k, v = qkv.view(n, heads + 2 * kv_heads, hd).split([heads, kv_heads, kv_heads], dim=1)
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, n, hd]
            if c.get("use_qk_norm"):
                q, k = self._rms(q, w[p + "attention.query_layernorm.weight"]), self._rms(k, w[p + "attention.key_layernorm.weight"])
            q, k = rotate(q), rotate(k)
            fresh.append((k, v))
            if past is not None:
                k, v = torch.cat([past[i][0], k], 1), torch.cat([past[i][1], v], 1)
            k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
            scores = q @ k.transpose(1, 2) / math.sqrt(hd) + mask
            out = (torch.softmax(scores.float(), dim=-1) @ v).transpose(0, 1).reshape(n, heads * hd)
            x = x + F.linear(out, w[p + "attention.dense.weight"], w.get(p + "attention.dense.bias"))
            h = self._rms(x, w[p + "post_attention_layernorm.weight"])
            if c.get("num_experts") is not None and i >= c["first_k_dense_replace"]:
                y, ids_ = self._moe(h, p + "mlp.")
                routed.append(ids_)
            else:
                y = self._mlp(h, p + "mlp.")
            x = x + y
        x = self._rms(x, w["model.norm.weight"])
        return F.linear(x, w["lm_head.weight"]).float(), fresh, routed

    def full_logits(self, ids: torch.Tensor, block: int) -> torch.Tensor:
        """One forward over ``ids`` (positions 0..n-1) with the released 4-D block-diffusion mask."""
        n = ids.numel()
        return self.forward(ids, torch.arange(n), block_diffusion_mask(n, block))[0]


def block_diffusion_mask(n: int, block: int) -> torch.Tensor:
    """The released generate's mask, cut to ``n`` positions: tril over blocks, repeated to tokens,
    ``.log()`` (0 where a query's block is at or after the key's, -inf elsewhere)."""
    blocks = -(-n // block)
    tril = torch.tril(torch.ones(blocks, blocks))
    return tril.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :n].log()


@dataclass
class Run:
    tokens: list[int]  # the answer region as decoded (every position from the prompt's end on)
    nfe: int = 0  # denoising forwards
    store_forwards: int = 0  # prefill and finished-block K/V stores (cache=True only)
    edits: int = 0  # committed tokens rewritten (2.1)
    steps_per_block: list[int] = field(default_factory=list)


class _Window:
    """The logits of the current block, by full recompute of ``[0, end)`` or over an exact cache."""

    def __init__(self, ref: Reference, x: torch.Tensor, block: int, prefill_end: int, cache: bool, run: Run) -> None:
        self.ref, self.x, self.block, self.cache, self.run = ref, x, block, cache, run
        self.past = None
        if cache and prefill_end:
            ids = x[:prefill_end]
            _, self.past, _ = ref.forward(ids, torch.arange(prefill_end), block_diffusion_mask(prefill_end, block))
            run.store_forwards += 1

    def logits(self, start: int, end: int) -> torch.Tensor:
        self.run.nfe += 1
        if not self.cache:
            return self.ref.full_logits(self.x[:end], self.block)[start:end]
        return self._block_forward(start, end)[0]

    def _block_forward(self, start: int, end: int):
        cached = 0 if self.past is None else self.past[0][0].shape[1]
        mask = torch.zeros(end - start, cached + end - start)  # earlier blocks and the block itself
        return self.ref.forward(self.x[start:end], torch.arange(start, end), mask, self.past)

    def store(self, start: int, end: int) -> None:
        if not self.cache:
            return
        _, fresh, _ = self._block_forward(start, end)
        self.past = fresh if self.past is None else [(torch.cat([pk, k], 1), torch.cat([pv, v], 1))
                                                     for (pk, pv), (k, v) in zip(self.past, fresh)]
        self.run.store_forwards += 1


def _greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0: the top-1 token and its plain softmax probability."""
    probs = torch.softmax(logits, dim=-1)
    token = probs.argmax(-1)
    return token, probs.gather(-1, token[:, None])[:, 0]


def _commit(active: torch.Tensor, p: torch.Tensor, threshold: float, quota: int) -> torch.Tensor:
    """LLaDA2's threshold rule: every masked position with p > threshold if at least ``quota`` pass,
    else the ``quota`` most confident masked positions."""
    confidence = torch.where(active, p, -torch.inf)
    high = confidence > threshold
    if int(high.sum()) >= quota:
        return high
    chosen = torch.zeros_like(active)
    chosen[torch.topk(confidence, k=min(quota, int(active.sum()))).indices] = True
    return chosen


def _layout(prompt: list[int], gen_length: int, block: int, mask_id: int):
    P = len(prompt)
    blocks = (P + gen_length + block - 1) // block
    x = torch.full((blocks * block,), mask_id, dtype=torch.long)
    x[:P] = torch.tensor(prompt)
    return x, P, blocks


def generate_v20(ref: Reference, prompt: list[int], mask_id: int, eos_id: int, gen_length: int, block: int = 32,
                 steps: int = 32, threshold: float = 0.95, minimal_topk: int = 1, cache: bool = False) -> Run:
    """LLaDA2.0's released ``generate`` at temperature 0 (eos_early_stop off: it still stops after
    the block in which an eos appears, as the release does)."""
    steps = min(steps, gen_length // minimal_topk)
    x, P, blocks = _layout(prompt, gen_length, block, mask_id)
    run = Run([])
    first = P // block
    window = _Window(ref, x, block, first * block, cache, run)
    base, extra = divmod(block, steps)
    quota = [base + (1 if s < extra else 0) for s in range(steps)]
    for b in range(first, blocks):
        start, end = b * block, (b + 1) * block
        taken = 0
        for step in range(steps):
            active = x[start:end] == mask_id
            if not active.any():
                break
            token, p = _greedy(window.logits(start, end))
            chosen = _commit(active, p, threshold, quota[step])
            x[start:end][chosen] = token[chosen]
            taken += 1
        run.steps_per_block.append(taken)
        window.store(start, end)
        if (x[P:end] == eos_id).any():
            break
    run.tokens = x[P:].tolist()
    return run


def generate_v21(ref: Reference, prompt: list[int], mask_id: int, eos_id: int, gen_length: int, block: int = 32,
                 threshold: float = 0.7, editing_threshold: float = 0.5, max_post_steps: int = 16,
                 num_to_transfer: int = 1, eos_early_stop: bool = True, cache: bool = False) -> Run:
    """LLaDA2.1's released ``generate`` at temperature 0: mask-to-token commits by the threshold
    rule (a fixed quota of ``num_to_transfer``) and token-to-token edits of the current block's
    committed answer tokens, both from the same forward."""
    x, P, blocks = _layout(prompt, gen_length, block, mask_id)
    run = Run([])
    first = P // block
    window = _Window(ref, x, block, first * block, cache, run)
    for b in range(first, blocks):
        start, end = b * block, (b + 1) * block
        prompt_in_block = torch.arange(start, end) < P
        post_steps = taken = 0
        while True:
            old = x[start:end].clone()
            active = old == mask_id
            if not active.any():
                post_steps += 1
            if post_steps > max_post_steps:
                break
            token, p = _greedy(window.logits(start, end))
            taken += 1
            commit = _commit(active, p, threshold, num_to_transfer) if active.any() else torch.zeros_like(active)
            editable = ~active & ~prompt_in_block
            edit = editable & (torch.where(editable, p, -torch.inf) > editing_threshold) & (token != old)
            change = commit | edit
            x[start:end][change] = token[change]
            run.edits += int(edit.sum())
            if not active.any() and not edit.any():
                break
        run.steps_per_block.append(taken)
        window.store(start, end)
        if eos_early_stop and not (x[P:end] == mask_id).any() and (x[P:end] == eos_id).any():
            break
    run.tokens = x[P:].tolist()
    return run


def answer(tokens: list[int], stop_ids: tuple[int, ...], mask_id: int) -> list[int]:
    """The answer as the release returns it: up to and including the first end token (positions
    never decoded, after an early stop, are left out)."""
    out = []
    for t in tokens:
        if t == mask_id:
            break
        out.append(t)
        if t in stop_ids:
            break
    return out
