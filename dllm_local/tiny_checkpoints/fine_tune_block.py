"""``tiny-block``, the embedded tiny model as an SDAR block-diffusion model: ``python -m dllm_local.tiny_checkpoints.fine_tune_block``.

1. **Carry.** The tiny LLaDA's weights move into SDAR's on-disk format (Qwen3's layer, dense).
   SDAR's tokenizer is the tiny BPE plus SDAR's special tokens (``random_sdar.tokenizer``, ids
   below the tiny vocabulary unchanged); the new rows of the embedding and the head start as the
   tiny model's tokens of the same role (``<|im_start|>`` as the header start, ``<|im_end|>`` as
   the end of turn, ``<|MASK|>`` as its mask). Qwen3 normalises each head's queries and keys,
   which LLaDA does not: their norm weights start at the tiny model's mean query and key norm on
   training rows, so the carried model starts close to the tiny one under the block-causal mask.
2. **Fine-tune** under SDAR's block-causal attention (blocks of ``BLOCK`` at absolute positions)
   with block diffusion's objective, one block per row: a row draws one block holding answer
   tokens; every position before it is clean, the block's answer tokens are masked with
   probability t ~ U(eps, 1], and the loss is their cross-entropy weighted 1/t. The block cannot
   see later positions, so the row is cut after it. Rows are the tiny model's "finish" mix in
   SDAR's chat template, each answer ending with ``<|im_end|>`` and padded with end of text.
3. **Save** in bf16 as SDAR's uploads are (``random_sdar``'s shards, config keys and tokenizer
   files), with ``block_size`` the trained block.

The shipped ``assets/models/tiny-block`` is this command's output at its defaults;
docs/tiny-models.md gives the figures and the command.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from ..models.llada import LLaDAModelLM
from ..models.loading.find import TINY_MODEL
from ..models.sdar import SDARConfig, SDARForCausalLM
from ..tiny.tokenizer import EOT, HEADER_START, MASK
from . import random_sdar
from .train import STAGES, diffusion_batch, train_loop, trained_tasks

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-block"
BLOCK = 32
END_OF_TURN = "<|im_end|>"
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# The finish stage's task mix on answer regions of 32 to 128: a row's block is drawn among its
# answer's blocks, so regions of 512 would spend most rows on blocks of padding.
FINE_TUNE = replace(STAGES[-1], name="block", steps=2000, lr=4e-4, warmup=40, block_suffix_share=0.0,
                    regions={32: 0.3, 64: 0.4, 128: 0.3})
# SDAR's tokens that play a tiny-model token's role: their rows start as that token's.
SAME_ROLE = {"<|im_start|>": HEADER_START, END_OF_TURN: EOT, "<|MASK|>": MASK}


def carried_config(source: LLaDAModelLM, tok: PreTrainedTokenizerFast) -> dict:
    """SDAR's released config.json keys, sized as the tiny LLaDA."""
    c = source.config
    return {**random_sdar.DENSE, "block_size": BLOCK, "hidden_size": c.d_model, "intermediate_size": c.ffn_size,
            "num_hidden_layers": c.n_layers, "max_window_layers": c.n_layers, "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim, "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_positions,
            "vocab_size": max(c.embedding_size or c.vocab_size, len(tok)), "bos_token_id": tok.eos_token_id,
            "eos_token_id": tok.eos_token_id, "mask_token_id": tok.mask_token_id,
            "trained_gen_length": max(FINE_TUNE.regions), "trained_tasks": trained_tasks((FINE_TUNE,), c.trained_tasks)}


def _mean_head_norms(source: LLaDAModelLM, ids: torch.Tensor) -> list[tuple[float, float]]:
    """Per layer, the root-mean-square of the tiny model's query and key heads on ``ids``."""
    c, found, hooks = source.config, [], []
    for b in source.model.transformer.blocks:
        for proj in (b.q_proj, b.k_proj):
            hooks.append(proj.register_forward_hook(
                lambda _m, _i, out: found.append(out.view(*out.shape[:2], -1, c.head_dim).pow(2).mean(-1).sqrt().mean().item())))
    with torch.no_grad():
        source(ids)
    for h in hooks:
        h.remove()
    return list(zip(found[0::2], found[1::2]))


def carry(source: LLaDAModelLM, tok: PreTrainedTokenizerFast, calibration: torch.Tensor) -> SDARForCausalLM:
    """Step 1: the tiny LLaDA's weights under SDAR's names (float32)."""
    raw = carried_config(source, tok)
    target = SDARForCausalLM(SDARConfig.from_dict(raw)).float()
    t = source.model.transformer
    embed, head = t.wte.weight.detach().clone(), t.ff_out.weight.detach().clone()
    rows = embed.shape[0]
    embed, head = F.pad(embed, (0, 0, 0, raw["vocab_size"] - rows)), F.pad(head, (0, 0, 0, raw["vocab_size"] - rows))
    known = tok.convert_tokens_to_ids
    for new in range(len(PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)), len(tok)):
        like = known(SAME_ROLE.get(tok.convert_ids_to_tokens(new), MASK))  # the rest: never predicted
        embed[new], head[new] = embed[like], head[like]
    state = {"model.embed_tokens.weight": embed, "model.norm.weight": t.ln_f.weight, "lm_head.weight": head}
    for i, (b, (q_rms, k_rms)) in enumerate(zip(t.blocks, _mean_head_norms(source, calibration))):
        layer = f"model.layers.{i}."
        state |= {
            layer + "input_layernorm.weight": b.attn_norm.weight,
            layer + "self_attn.q_proj.weight": b.q_proj.weight, layer + "self_attn.k_proj.weight": b.k_proj.weight,
            layer + "self_attn.v_proj.weight": b.v_proj.weight, layer + "self_attn.o_proj.weight": b.attn_out.weight,
            layer + "self_attn.q_norm.weight": torch.full((source.config.head_dim,), q_rms),
            layer + "self_attn.k_norm.weight": torch.full((source.config.head_dim,), k_rms),
            layer + "post_attention_layernorm.weight": b.ff_norm.weight,
            layer + "mlp.gate_proj.weight": b.ff_proj.weight, layer + "mlp.up_proj.weight": b.up_proj.weight,
            layer + "mlp.down_proj.weight": b.ff_out.weight,
        }
    target.load_state_dict({k: v.detach().float() for k, v in state.items()}, strict=True)
    return target


def block_loss(model, ids: torch.Tensor, answer: torch.Tensor, mask_id: int, gen: torch.Generator,
               block: int = BLOCK, eps: float = 1e-3) -> torch.Tensor:
    """Step 2's objective on rows of prompt + answer (``answer`` marks the answer positions)."""
    rows, width = ids.shape
    index = torch.arange(width) // block
    first = index[answer.int().argmax(dim=1)]
    last = index[(width - 1) - answer.flip(1).int().argmax(dim=1)]
    current = first + (torch.rand(rows, generator=gen) * (last - first + 1)).long()
    in_block = index[None, :] == current[:, None]
    t = (1 - eps) * torch.rand(rows, 1, generator=gen) + eps
    masked = in_block & answer & (torch.rand(rows, width, generator=gen) < t)
    noisy = torch.where(masked, mask_id, ids)
    end = int((current.max() + 1) * block)
    logits = model(noisy[:, :end]).logits
    ce = F.cross_entropy(logits[masked[:, :end]], ids[:, :end][masked[:, :end]], reduction="none")
    weight = t.expand(rows, width)[masked]
    return (ce / weight).sum() / (in_block & answer).sum()


def save(model: SDARForCausalLM, raw: dict, tok: PreTrainedTokenizerFast, out: Path) -> None:
    """Step 3: SDAR's upload layout, bf16."""
    for stale in out.glob("model*.safetensors*"):  # train_loop's own checkpoints
        stale.unlink()
    random_sdar._write_weights({k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}, out)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    end_of_turn = tok.convert_tokens_to_ids(END_OF_TURN)
    generation = {"bos_token_id": tok.eos_token_id, "eos_token_id": [end_of_turn, tok.eos_token_id],
                  "pad_token_id": tok.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    # The tiny BPE's own class, so the files load as the tokenizer it was trained with: Qwen2's class
    # (the random SDARs') would split each digit from the space before it, ids it never saw.
    random_sdar._write_tokenizer(tok, out, tokenizer_class=TOKENIZER_CLASS)


def fine_tune(out: Path, steps: int, seed: int, token_budget: int, save_every: int = 0, quiet: bool = False) -> Path:
    """Steps 1-3, from the embedded tiny model to ``out``."""
    tok = random_sdar.tokenizer()
    source = LLaDAModelLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    stage = replace(FINE_TUNE, steps=steps)
    calibration, _ = diffusion_batch(PreTrainedTokenizerFast.from_pretrained(TINY_MODEL), random.Random(seed), seed,
                                     -1, token_budget, stage)
    raw = carried_config(source, tok)
    model = carry(source, tok, calibration).train()
    out.mkdir(parents=True, exist_ok=True)

    def batch_loss(step: int, rng: random.Random, gen: torch.Generator) -> torch.Tensor:
        ids, answer = diffusion_batch(tok, rng, seed, step, token_budget, stage, END_OF_TURN)
        return block_loss(model, ids, answer, tok.mask_token_id, gen)
    print(f"fine-tuning the tiny model as SDAR (blocks of {BLOCK}): {steps} steps -> {out}")
    with (out / "train_log.jsonl").open("w") as log:
        train_loop(model, stage.name, out, tok, steps, seed, stage.lr, stage.warmup, batch_loss, save_every, log, quiet)
    save(model, raw, tok, out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=FINE_TUNE.steps)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-budget", type=int, default=6144, help="tokens per batch")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    fine_tune(args.out, args.steps, args.seed, args.token_budget, args.save_every, args.quiet)


if __name__ == "__main__":
    main()
