"""Fast-dLLM v2's released modelling and ``generate``, transcribed in plain torch for the tests.

Written from reading the hub checkpoint's ``modeling.py`` (Efficient-Large-Model/Fast_dLLM_v2_7B,
``Fast_dLLM_QwenModel.forward`` at inference and ``Fast_dLLM_QwenForCausalLM.generate``), over the
raw tensors of a checkpoint folder; nothing from ``dllm_local.models`` is imported, so an error in
the project's model cannot hide behind a test that calls the same code.

The forward keeps the reference's three caches by their roles: ``past`` (finished blocks' K/V,
appended only by a forward with ``update_past``), and the current block's ``block`` cache (made by a
forward of the whole block with ``use_block_cache``; a forward of one sub-block overwrites its
rows in place at ``replace_position`` and attends all of it, without a mask).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file


class Reference:
    """A checkpoint folder's weights and config.json, run as the released inference forward."""

    def __init__(self, folder: str | Path, dtype: torch.dtype = torch.float32) -> None:
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        self.w: dict[str, torch.Tensor] = {}
        for f in sorted(folder.glob("*.safetensors")):
            self.w.update({k: v.to(dtype) for k, v in load_file(f).items()})
        if "lm_head.weight" not in self.w:  # the 1.5B ties its head to the embedding
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        c = self.config
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = positions.float()[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, ids: torch.Tensor, past: list | None = None, update_past: bool = False,
                use_block_cache: bool = False, block: list | None = None, replace_position: int | None = None,
                block_size: int = 32) -> tuple[torch.Tensor, list, list | None]:
        """Unshifted logits ``[1, n, vocab]`` of ``ids`` placed after ``past`` (and, with a block
        cache given, at ``replace_position`` inside the block); returns the caches as updated."""
        past = [] if past is None else past
        past_len = past[0][0].shape[2] if past else 0
        n = ids.shape[1]
        reuse = use_block_cache and block is not None
        start = past_len + (replace_position if use_block_cache and replace_position is not None else 0)
        positions = torch.arange(start, start + n)
        if reuse:
            mask = None  # the reference passes no mask once a block cache exists
        else:
            q, k = torch.arange(n) + past_len, torch.arange(n + past_len)
            mask = (q[:, None] // block_size) >= (k[None, :] // block_size)
        new_block = [] if use_block_cache and block is None else None
        x = self.w["model.embed_tokens.weight"][ids[0]][None]
        cos, sin = self._rope(positions, x.dtype)
        for i in range(self.config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self._rms(x, self.w[p + "input_layernorm.weight"])
            proj = lambda name, heads: (h @ self.w[p + f"self_attn.{name}.weight"].T + self.w[p + f"self_attn.{name}.bias"]
                                        ).view(1, n, heads, self.head_dim).transpose(1, 2)
            q_, k_, v_ = proj("q_proj", self.heads), proj("k_proj", self.kv_heads), proj("v_proj", self.kv_heads)
            q_, k_ = self._rotate(q_, cos, sin), self._rotate(k_, cos, sin)
            if new_block is not None:
                new_block.append((k_, v_))
            elif reuse:
                bk, bv = block[i]
                bk[:, :, replace_position:replace_position + n] = k_
                bv[:, :, replace_position:replace_position + n] = v_
                k_, v_ = bk, bv
            if update_past:
                if len(past) <= i:
                    past.append((k_, v_))
                else:
                    past[i] = (torch.cat([past[i][0], k_], 2), torch.cat([past[i][1], v_], 2))
                k_, v_ = past[i]
            elif len(past) > i:
                k_, v_ = torch.cat([past[i][0], k_], 2), torch.cat([past[i][1], v_], 2)
            x = x + self._attend(q_, k_, v_, mask) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self._rms(x, self.w[p + "post_attention_layernorm.weight"])
            gate, up = h @ self.w[p + "mlp.gate_proj.weight"].T, h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        logits = self._rms(x, self.w["model.norm.weight"]) @ self.w["lm_head.weight"].T
        return logits, past, new_block if new_block is not None else block

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(-1) @ v  # [1, heads, n, d]
        return out.transpose(1, 2).reshape(1, q.shape[2], -1)


def shift(logits: torch.Tensor) -> torch.Tensor:
    """The released generate's token shift: row j takes the logits of row j - 1; row 0 keeps its own."""
    return torch.cat([logits[:, :1], logits[:, :-1]], 1)


@dataclass
class Generated:
    ids: list[int]  # the whole sequence, prompt included, cut after the first stop token
    nfe: int = 0  # denoising forwards (the sub-block loop's)
    store_forwards: int = 0  # the prompt's prefill and each finished block's K/V store
    commits: list[list[int]] = field(default_factory=list)  # per denoising forward: positions committed


def generate(model: Reference, prompt: list[int], max_new_tokens: int, mask_id: int, stop_token: int,
             threshold: float = 1.0, small_block_size: int = 8, block_size: int = 32,
             use_block_cache: bool = False) -> Generated:
    """``Fast_dLLM_QwenForCausalLM.generate`` at temperature 0 (top-1, plain softmax confidence)."""
    out = Generated(ids=[])
    x = torch.tensor([prompt])
    original = x.shape[1]
    past = None
    if x.shape[1] > block_size:
        logits, past, _ = model.forward(x[:, : x.shape[1] // block_size * block_size], None, update_past=True,
                                        block_size=block_size)
        out.store_forwards += 1
        if x.shape[1] % block_size == 0:
            x = torch.cat([x, logits[:, -1:].argmax(-1)], 1)

    def stopped(x_t: torch.Tensor, prompt_length: int) -> bool:
        tail = x_t[0, prompt_length:]
        hits = (tail == stop_token).nonzero()
        return bool(len(hits)) and not bool((tail[: int(hits[0, 0])] == mask_id).any())

    for _ in range(max_new_tokens // block_size):
        if bool((x[0, original:] == stop_token).any()):
            break
        prompt_length = x.shape[1]
        x_t = torch.cat([x, torch.full((1, block_size - prompt_length % block_size), mask_id)], 1)
        b0 = x_t.shape[1] - block_size  # the block's first position
        block = None
        while True:
            if stopped(x_t, prompt_length):
                break
            if not bool((x_t[0, b0:] == mask_id).any()):
                logits, past, _ = model.forward(x_t[:, b0:], past, update_past=True, block_size=block_size)
                out.store_forwards += 1
                x_t = torch.cat([x_t, logits[:, -1:].argmax(-1)], 1)
                break
            for s0 in range(b0, b0 + block_size, small_block_size):
                s1 = s0 + small_block_size
                while True:
                    masked = x_t[0, s0:s1] == mask_id
                    if not bool(masked.any()) or stopped(x_t, prompt_length):
                        break
                    if use_block_cache and block is not None and int(x_t[0, s0]) != mask_id:
                        logits, _, block = model.forward(x_t[:, s0:s1], past, use_block_cache=True, block=block,
                                                         replace_position=s0 - b0)
                        logits = shift(logits)[0]
                    else:
                        logits, _, made = model.forward(x_t[:, b0:], past, use_block_cache=use_block_cache)
                        block = made if use_block_cache else block
                        logits = shift(logits)[0, s0 - b0:s1 - b0]
                    out.nfe += 1
                    p = logits.softmax(-1)
                    token = p.argmax(-1)
                    conf = torch.where(masked, p.gather(-1, token[:, None])[:, 0], torch.tensor(float("-inf")))
                    commit = conf > threshold
                    commit[conf.argmax()] = True
                    commit &= masked
                    x_t[0, s0:s1][commit] = token[commit]
                    out.commits.append((s0 + commit.nonzero()[:, 0]).tolist())
        x = x_t
    answer = x[0, original:]
    hits = (answer == stop_token).nonzero()
    if len(hits):
        x = x[:, : original + int(hits[0, 0]) + 1]
    out.ids = x[0].tolist()
    return out
