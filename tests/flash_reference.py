"""A plain-torch, batch-1 reference of the arithmetic of Flash-dLLM as its authors released it.

What it models (VILA-Lab/Flash-dLLM at 7437a55): ``llada/generate.py`` (``generate_with_Flash_dLLM``),
``llada/flash_cache_triton.py`` (``flash_fused_elastic_cache`` and its Triton kernels) and
``llada/model/modeling_llada.py`` (the LLaDA block around it). Written from a reading of those
files, not copied from them; it uses none of ``dllm_local``'s model code, so that our engine can be
tested against it for token identity. Float32 on the CPU; the released code runs its kernels in
the checkpoint's dtype (bfloat16 in its evaluation) with ``tl.dot`` (TF32 for float32 inputs), so
this matches its *rules* exactly and its numbers to float32 rounding.

The generator, as released, for one sequence (P prompt tokens, ``gen`` answer positions, block B):

* ``max_length = ((P + gen + B) // 128 + 1) * 128``; ``seqlen_k = (P + gen) // 128 * 128 + 128``
  (the attention span: every main-forward query attends over cache rows ``[0, seqlen_k)``).
  ``x`` is the mask everywhere, the prompt, then end-of-text from ``P + gen`` to ``max_length``.
* ``full_pos`` is a permutation of ``range(max_length)``: entries ``[0, nd)`` are decoded.
  The window is ``full_pos[nd : nd + B]``; the first query is the window then every other index
  below ``seqlen_k`` (a full forward), later ones the window then the tracked entries.
* Main forward, per layer: every query row's k/v are written into that layer's cache at its
  position, then every query row attends over the cache rows ``[0, seqlen_k)``. The raw q.k of
  the window rows, averaged over B rows (absent rows count as zeros) and the heads, is added to
  ``attn_scores`` in layers 2 and up.
* Decision: float64 softmax, max; confidence zeroed at positions >= predicted_length once an
  end-of-text has been committed; commit ``max(#(p >= threshold), 1)`` in confidence order.
* Flash-Verify adds a second forward (reads the cache, writes nothing, no scores) over the last T
  decoded entries, S drafts and S mask copies, and accepts the longest prefix of drafts whose
  running product of P(draft | mask copy) stays >= gamma.
* Then decoded entries (all but the last stage's commits) are sorted ascending by attention score
  and the next query is the window plus ``full_pos[nd - track_num*B : nd]`` and
  ``full_pos[nd + B : min(seqlen_k, nd + mask_num*B)]``.

Quirks of the released code reproduced here (see also ``released_generate``):

* index slicing, not position ranges: the tracked, key and candidate sets are index ranges of
  ``full_pos``; ``seqlen_k`` bounds an *index* there.
* the padding window: positions ``>= P + gen`` hold end-of-text as input, are undecoded and can be
  committed (with whatever the model predicts); an end-of-text committed there moves
  predicted_length past ``P + gen``. Positions ``>= seqlen_k`` can be in the window too.
* ``nd < T`` in Flash-Verify: ``full_pos[nd - T : nd]`` with a negative start is EMPTY (Python
  slicing from the end), so the verify query has only the 2S draft / mask-copy rows while the
  decision reads rows ``[T + S, T + 2S)``: an empty slice, so nothing is accepted (keep 0). The
  released forward still runs (with keys ``full_pos[: nd - T]``, i.e. nearly all of full_pos
  again, partly uninitialised cache rows); its output is never read, so it is counted, not computed.
* ties: the released sorts are ``torch.sort`` without ``stable`` (on CUDA, unspecified order for
  equal values); this reference sorts stably (equal values keep their current order).
* a window shorter than B (``nd > max_length - B``) makes the released Flash-Verify step fail
  (it reads B rows of logits and assigns them to fewer positions): ``ReleasedCodeFails``.
* with Flash-Verify the ranking after a step spares only the verify stage's commits (``keep_num``
  is the last stage's), so the threshold stage's commits of that step are ranked with the rest.
* ``length_num`` (which caps S) is taken before the step's commits: an end-of-text committed by
  the threshold stage can leave candidates past the new predicted_length; the verify rule then
  zeroes them. Mask-copy rows read ``x[candidate]``: end-of-text, not the mask, in the padding.
* not reproduced: the verify kernel rescales its own-query scores by the cache keys' running max
  only (exp overflow if an own score beats it by ~88; NaN with no cache key at all); here it is
  one ordinary softmax.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

BLOCK_N = 128  # generate.py's block_n: the span and the buffers are padded to multiples of it


class ReleasedCodeFails(RuntimeError):
    """The released generator would raise here; the reference stops rather than guess."""


# ----------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class _Layer:
    attn_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    ff_norm: torch.Tensor
    gate: torch.Tensor  # ff_proj (through SiLU)
    up: torch.Tensor
    down: torch.Tensor  # the block's ff_out


@dataclass(frozen=True)
class _Weights:
    d_model: int
    n_heads: int
    head_dim: int
    eps: float
    theta: float
    wte: torch.Tensor
    layers: tuple[_Layer, ...]
    ln_f: torch.Tensor
    head: torch.Tensor
    scale_logits: bool


@lru_cache(maxsize=4)
def _load(weights_dir: str) -> _Weights:
    from safetensors.torch import load_file

    folder = Path(weights_dir)
    cfg = json.loads((folder / "config.json").read_text())
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    t = {k.removeprefix("model.transformer."): v.to(torch.float32) for k, v in raw.items()}
    d, h = cfg["d_model"], cfg["n_heads"]
    if cfg.get("n_kv_heads") not in (None, h):
        raise ValueError("the released kernels assume n_kv_heads == n_heads")
    if cfg.get("block_type", "llama") != "llama" or cfg.get("layer_norm_type", "rms") != "rms":
        raise ValueError("only LLaDA's llama block with RMS norms is modelled")
    if cfg.get("include_bias") or cfg.get("include_qkv_bias") or cfg.get("input_emb_norm"):
        raise ValueError("biases and input_emb_norm are not modelled")
    layers = tuple(
        _Layer(*(t[f"blocks.{i}.{n}.weight"] for n in
                 ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out")))
        for i in range(cfg["n_layers"]))
    tied = cfg.get("weight_tying", False)
    head = t["wte.weight"] if tied else t["ff_out.weight"]
    return _Weights(d, h, d // h, float(cfg.get("rms_norm_eps", 1e-5)), float(cfg["rope_theta"]), t["wte.weight"],
                    layers, t["ln_f.weight"], head, bool(cfg.get("scale_logits", False)))


# ----------------------------------------------------------------------------- the model


def _rope_table(n: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """generate.py's get_rotary_embedding: (sin, cos), each [n, head_dim], float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.sin(), angles.cos()


def _rotate(t: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """RoPE as the projection kernels apply it: t [rows, heads, hd], sin/cos [rows, hd]."""
    half = t.shape[-1] // 2
    a, b = t[..., :half], t[..., half:]
    s, c = sin[:, None, :], cos[:, None, :]
    return torch.cat((a * c[..., :half] - b * s[..., :half], b * c[..., half:] + a * s[..., half:]), dim=-1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _run_layers(w: _Weights, tokens: torch.Tensor, positions: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor,
                attend) -> torch.Tensor:
    """Embedding, the blocks (attention delegated to ``attend(layer, q, k, v)``), ln_f, the head."""
    n = tokens.shape[0]
    x = w.wte[tokens]
    s, c = sin[positions], cos[positions]
    for i, layer in enumerate(w.layers):
        h = _rms(x, layer.attn_norm, w.eps)
        q = _rotate(F.linear(h, layer.q).view(n, w.n_heads, w.head_dim), s, c)
        k = _rotate(F.linear(h, layer.k).view(n, w.n_heads, w.head_dim), s, c)
        v = F.linear(h, layer.v).view(n, w.n_heads, w.head_dim)
        x = x + F.linear(attend(i, q, k, v).reshape(n, w.d_model), layer.o)
        h = _rms(x, layer.ff_norm, w.eps)
        x = x + F.linear(F.silu(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
    logits = F.linear(_rms(x, w.ln_f, w.eps), w.head)
    return logits / math.sqrt(w.d_model) if w.scale_logits else logits


def _as_ids(ids) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    return t.reshape(-1)


@torch.no_grad()
def reference_forward(weights_dir, input_ids, positions=None) -> torch.Tensor:
    """Logits [n, vocab] of one plain bidirectional forward over ``input_ids`` at ``positions``
    (default 0..n-1): what the released main forward computes when every position is a query."""
    w = _load(str(weights_dir))
    tokens = _as_ids(input_ids)
    pos = torch.arange(tokens.shape[0]) if positions is None else _as_ids(positions)
    sin, cos = _rope_table(int(pos.max()) + 1, w.head_dim, w.theta)
    scale = 1.0 / math.sqrt(w.head_dim)

    def attend(_layer, q, k, v):
        p = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * scale, dim=-1)
        return torch.einsum("hqk,khd->qhd", p, v)

    return _run_layers(w, tokens, pos, sin, cos, attend)


class _Engine:
    """The per-layer K/V buffers and the two forwards of the released kernel path."""

    def __init__(self, w: _Weights, max_length: int, seqlen_k: int, block: int) -> None:
        self.w, self.max_length, self.seqlen_k, self.block = w, max_length, seqlen_k, block
        n = len(w.layers)
        # torch.empty in the released code; every row a main forward reads has been written first
        self.k = torch.zeros(n, max_length, w.n_heads, w.head_dim)
        self.v = torch.zeros(n, max_length, w.n_heads, w.head_dim)
        self.sin, self.cos = _rope_table(max_length, w.head_dim, w.theta)
        self.scale = 1.0 / math.sqrt(w.head_dim)

    def main(self, tokens: torch.Tensor, positions: torch.Tensor, n_window: int,
             attn_scores: torch.Tensor) -> torch.Tensor:
        """verify=False: write every query row's k/v, then attend over cache rows [0, seqlen_k);
        the window rows' raw scores go into ``attn_scores`` from layer 2 on."""
        w, span = self.w, self.seqlen_k

        def attend(layer, q, k, v):
            self.k[layer, positions] = k
            self.v[layer, positions] = v
            keys, values = self.k[layer, :span], self.v[layer, :span]
            raw = torch.einsum("qhd,khd->hqk", q, keys)
            if layer > 1:
                tracked = torch.zeros(self.block, w.n_heads, self.max_length)  # the kernel's S
                tracked[:n_window, :, :span] = raw[:, :n_window].transpose(0, 1)
                attn_scores.add_(tracked.mean(dim=(0, 1)))
            p = torch.softmax(raw * self.scale, dim=-1)
            return torch.einsum("hqk,khd->qhd", p, values)

        return _run_layers(w, tokens, positions, self.sin, self.cos, attend)

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """verify=True: the query's own k/v (not written) under ``mask``, plus the cache rows at
        ``key_positions``, in one softmax; no scores recorded."""
        n = tokens.shape[0]
        allowed = mask[:n, :n]

        def attend(layer, q, k, v):
            keys, values = self.k[layer, key_positions], self.v[layer, key_positions]
            cached = torch.einsum("qhd,khd->hqk", q, keys) * self.scale
            own = torch.einsum("qhd,khd->hqk", q, k) * self.scale
            own = own.masked_fill(~allowed, float("-inf"))
            p = torch.softmax(torch.cat((cached, own), dim=-1), dim=-1)
            nk = keys.shape[0]
            return torch.einsum("hqk,khd->qhd", p[..., :nk], values) + torch.einsum("hqk,khd->qhd", p[..., nk:], v)

        return _run_layers(self.w, tokens, positions, self.sin, self.cos, attend)


def verify_mask(block: int, n_candidates: int) -> torch.Tensor:
    """The 2B x 2B mask of the verify query [T tracked | S drafts | S mask copies], T = 2B - 2S:
    tracked rows see everything but the drafts; draft i sees the tracked rows, drafts <= i and
    mask copies > i; mask copy i sees the tracked rows, drafts < i and mask copies >= i."""
    s = n_candidates
    t = 2 * block - 2 * s
    m = torch.ones(2 * block, 2 * block, dtype=torch.bool)
    m[:t, t:t + s] = False
    i = torch.arange(s)
    row, col = i[:, None], i[None, :]
    d, c = t, t + s
    m[d:d + s, d:d + s] = row >= col
    m[d:d + s, c:c + s] = row < col
    m[c:c + s, d:d + s] = row > col
    m[c:c + s, c:c + s] = row <= col
    return m


# ----------------------------------------------------------------------------- the generator


def _confidence(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(logits.to(torch.float64), dim=-1).max(dim=-1)


@torch.no_grad()
def released_generate(weights_dir, prompt_ids, *, gen_length: int, block_length: int, threshold: float,
                      gamma: float = 0.8, track_num: int = 4, mask_num: int = 4, verify: bool,
                      mask_id: int, eos_id: int, temperature: float = 0.0) -> dict:
    """Run the released Flash-dLLM generator's rules on one prompt; see the module docstring.

    Returns ``tokens`` (x[P:seqlen_k]: undecoded answer positions are mask_id, undecoded padding
    positions keep their end-of-text fill), ``steps`` (main forwards), ``verify_forwards``,
    ``verify_with_candidates`` (those with S > 0), ``short_history`` (verify steps with nd < T,
    where the released slice leaves the verify query without its tracked rows), ``decoded``
    (committed positions in commit order), ``committed`` (per step, (position, token) pairs),
    ``verify_kept`` (per step, the drafts accepted; verify mode only), ``predicted_length``,
    ``seqlen_k`` and ``max_length``.
    """
    if temperature != 0:
        raise ValueError("the released generator is greedy: temperature must be 0")
    w = _load(str(weights_dir))
    prompt = _as_ids(prompt_ids)
    P, B = prompt.shape[0], block_length
    max_length = ((P + gen_length + B) // BLOCK_N + 1) * BLOCK_N
    seqlen_k = (P + gen_length) // BLOCK_N * BLOCK_N + BLOCK_N

    x = torch.full((max_length,), mask_id, dtype=torch.long)
    x[:P] = prompt
    x[P + gen_length:] = eos_id
    x_draft = torch.full((max_length,), mask_id, dtype=torch.long)
    x_draft[:P] = prompt
    full_pos = torch.arange(max_length)
    attn_scores = torch.zeros(max_length, dtype=torch.float32)
    engine = _Engine(w, max_length, seqlen_k, B)

    nd = P
    predicted_length, eos_pos = P + gen_length, -1
    window = full_pos[nd:nd + B].clone()
    tracked = torch.cat((full_pos[:nd], full_pos[nd + B:seqlen_k]))
    out = {"steps": 0, "verify_forwards": 0, "verify_with_candidates": 0, "short_history": 0,
           "decoded": [], "committed": [], "verify_kept": []}

    def commit(positions: torch.Tensor, tokens: torch.Tensor, step: list) -> None:
        nonlocal eos_pos, predicted_length
        x[positions] = tokens
        out["decoded"] += positions.tolist()
        step += list(zip(positions.tolist(), tokens.tolist()))
        if eos_pos == -1:
            hits = positions[tokens.eq(eos_id)]
            if hits.numel() > 0:
                eos_pos = int(hits.max())
                predicted_length = eos_pos + 1

    while True:
        query = torch.cat((window, tracked))
        logits = engine.main(x[query], query, window.shape[0], attn_scores)
        out["steps"] += 1
        step: list = []
        nw = window.shape[0]

        if verify and nw < B:
            raise ReleasedCodeFails(f"window of {nw} < block {B} positions at nd={nd}: the released verify "
                                    "step reads block rows of logits for it and fails on the shape mismatch")
        # stage 1 (the only one without verify): threshold commits in confidence order
        p, x0 = _confidence(logits[:nw])
        length_num = nw
        if eos_pos != -1:
            beyond = window >= predicted_length
            p[beyond] = 0
            length_num = nw - int(beyond.sum())
        order = torch.sort(p, descending=True, stable=True).indices
        keep = max(int((p >= threshold).sum()), 1)
        if verify:
            x_draft[window] = x0
        full_pos[nd:nd + nw] = window[order]
        commit(full_pos[nd:nd + keep].clone(), x0[order][:keep], step)
        nd += keep
        keep_last = keep

        if verify:
            S = min(max(length_num - keep, 0), B // 2)
            T = 2 * B - 2 * S
            candidates = full_pos[nd:nd + S].clone()
            history = full_pos[nd - T:nd].clone()  # the released slice: EMPTY when nd < T
            out["verify_forwards"] += 1
            out["verify_with_candidates"] += int(S > 0)
            out["short_history"] += int(nd - T < 0)
            kept = 0
            if S > 0 and history.shape[0] == T:
                keys = torch.cat((full_pos[:nd - T], full_pos[nd + S:seqlen_k]))
                vq_pos = torch.cat((history, candidates, candidates))
                vq_tok = torch.cat((x[history], x_draft[candidates], x[candidates]))
                vlogits = engine.verify(vq_tok, vq_pos, keys, verify_mask(B, S))
                drafts = vq_tok[T:T + S]
                pv = torch.softmax(vlogits[T + S:T + 2 * S].to(torch.float64), dim=-1)
                pv = pv.gather(1, drafts[:, None]).view(-1)
                if eos_pos != -1:
                    pv[candidates >= predicted_length] = 0
                kept = int((pv.cumprod(0) >= gamma).sum())
                if kept > 0:
                    commit(full_pos[nd:nd + kept].clone(), drafts[:kept], step)
                    nd += kept
            # else: S == 0 (keep 0 in the released code), or nd < T: the verify query lacks its T
            # tracked rows, the released decision reads empty rows [T, T + S) and keeps nothing
            out["verify_kept"].append(kept)
            keep_last = kept

        out["committed"].append(step)
        if not bool((full_pos[nd:] < predicted_length).any()):
            break
        # prepare the next step: rank the decoded entries (but the last stage's commits) by score
        m = nd - keep_last
        ranks = torch.sort(attn_scores[full_pos[:m]], stable=True).indices
        full_pos[:m] = full_pos[:m][ranks].clone()
        window = full_pos[nd:nd + B].clone()
        if track_num < 0:
            tracked = torch.cat((full_pos[:nd], full_pos[nd + B:seqlen_k]))
        else:
            start = max(0, nd - track_num * B)
            end = min(seqlen_k, nd + B * mask_num)
            tracked = torch.cat((full_pos[start:nd], full_pos[nd + B:end]))
        attn_scores.zero_()

    out.update(tokens=x[P:seqlen_k].tolist(), predicted_length=predicted_length, seqlen_k=seqlen_k,
               max_length=max_length)
    return out
