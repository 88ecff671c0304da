"""An independent plain-torch transcription of LLaDA-MoE's released ``modeling_lladamoe.py``
(the hub checkpoint's remote code, mirrored in ZHZisZZ/dllm) and of LLaDA's ``generate.py`` at
temperature 0, for the exactness tests. It reads config.json and the safetensors shards itself
and imports nothing from dllm_local.models.

What it transcribes, step by step: embed; per layer RMSNorm (float32, weight times the input-dtype
result), q/k/v projections, q/k RMSNorm over each head's ``head_dim`` channels (the released code
reshapes to ``[-1, head_dim]``), the optional clip, rotary embeddings (rotate-half, default
``inv_freq = 1 / theta^(arange(0, dim, 2) / dim)`` with ``dim = head_dim * partial_rotary_factor``),
full (bidirectional) softmax attention with scale ``1/sqrt(head_dim)``, o_proj, residual; then
RMSNorm, router softmax in float32 over all experts (plus expert_bias if the config enables it),
top-k of those scores as the weights with no renormalisation (``norm_topk_prob`` is hard-coded
False there), the experts looped in ascending order adding ``expert(x) * weight`` into the routed
rows, a shared expert if configured, residual; final RMSNorm and lm_head.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class ReferenceLLaDAMoE:
    """Logits of a LLaDA-MoE checkpoint folder for a ``[batch, L]`` sequence, as the released code."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.c = json.loads((folder / "config.json").read_text())
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        self.w: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            self.w.update({k: v.float() for k, v in load_file(str(folder / shard)).items()})

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"])
        return self.w[name] * h.to(dtype)

    def _mlp(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        gate, up, down = (self.w[f"{prefix}.{n}_proj.weight"] for n in ("gate", "up", "down"))
        return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)

    def _rope(self, L: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        dim = int(head_dim * self.c.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        freqs = torch.arange(L).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def _apply_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = cos.shape[-1]
        rot, rest = x[..., :r], x[..., r:]
        return torch.cat((rot * cos + self._rotate_half(rot) * sin, rest), dim=-1)

    def _attention(self, h: torch.Tensor, p: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, w = self.c, self.w
        b, L, d = h.shape
        H, KV = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        hd = d // H
        q, k, v = (F.linear(h, w[f"{p}.{n}_proj.weight"], w.get(f"{p}.{n}_proj.bias")) for n in "qkv")
        if c.get("qk_layernorm"):
            q = self._rms(q.reshape(-1, hd), f"{p}.q_norm.weight").reshape(b, L, -1)
            k = self._rms(k.reshape(-1, hd), f"{p}.k_norm.weight").reshape(b, L, -1)
        if c.get("clip_qkv") is not None:
            q, k, v = (t.clamp(-c["clip_qkv"], c["clip_qkv"]) for t in (q, k, v))
        q = q.view(b, L, H, hd).transpose(1, 2)
        k = k.view(b, L, KV, hd).transpose(1, 2)
        v = v.view(b, L, KV, hd).transpose(1, 2)
        q, k = self._apply_rope(q, cos, sin), self._apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, L, d)
        return F.linear(out, w[f"{p}.o_proj.weight"], w.get(f"{p}.o_proj.bias"))

    def _moe(self, h: torch.Tensor, p: str) -> torch.Tensor:
        c = self.c
        b, L, d = h.shape
        flat = h.view(-1, d)
        scores = F.softmax(F.linear(flat, self.w[f"{p}.gate.weight"]), dim=1, dtype=torch.float)
        if c.get("moe_router_enable_expert_bias"):
            scores = scores + self.w[f"{p}.expert_bias"]
        weights, chosen = torch.topk(scores, c["num_experts_per_tok"], dim=-1)
        weights = weights.to(h.dtype)
        out = torch.zeros_like(flat)
        mask = F.one_hot(chosen, num_classes=c["num_experts"]).permute(2, 1, 0)
        for e in range(c["num_experts"]):
            slot, row = torch.where(mask[e])
            y = self._mlp(flat[row], f"{p}.experts.{e}") * weights[row, slot, None]
            out.index_add_(0, row, y.to(h.dtype))
        return out.view(b, L, d)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        c, w = self.c, self.w
        hd = c["hidden_size"] // c["num_attention_heads"]
        cos, sin = self._rope(x.shape[1], hd)
        h = F.embedding(x, w["model.embed_tokens.weight"])
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}"
            h = h + self._attention(self._rms(h, f"{p}.input_layernorm.weight"), f"{p}.self_attn", cos, sin)
            n = self._rms(h, f"{p}.post_attention_layernorm.weight")
            if c["moe_layer_freq"][i] == 0:
                y = self._mlp(n, f"{p}.mlp")
            else:
                y = self._moe(n, f"{p}.mlp")
                if c.get("shared_expert_intermediate_size") is not None:
                    y = y + self._mlp(n, f"{p}.shared_expert")
            h = h + y
        head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
        return F.linear(self._rms(h, "model.norm.weight"), head)


@torch.no_grad()
def llada_generate(model: ReferenceLLaDAMoE, prompt: torch.Tensor, steps: int, gen_length: int,
                   block_length: int, mask_id: int) -> list[int]:
    """LLaDA's generate.py at temperature 0 with low-confidence remasking (the LLaDA-MoE model
    card's ``generate``), over the reference's full forward: the answer's token ids."""
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        start = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, start : start + block_length] == mask_id
        mask_num = block_mask_index.sum(dim=1, keepdim=True)
        base, remainder = mask_num // steps, mask_num % steps
        num_transfer = torch.zeros(1, steps, dtype=torch.int64) + base
        num_transfer[0, : remainder[0]] += 1
        for i in range(steps):
            mask_index = x == mask_id
            logits = model.logits(x)
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, start + block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            _, select = torch.topk(confidence[0], k=int(num_transfer[0, i]))
            transfer[0, select] = True
            x[transfer] = x0[transfer]
    return x[0, prompt.shape[1] :].tolist()
