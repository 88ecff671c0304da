"""Rebuild the embedded tiny models from scratch: ``python -m dllm_local.tiny.train``.

The diffusion model is the project's LLaDA class trained with the masked-diffusion objective
(t ~ U(eps, 1], each answer token masked with probability t, cross-entropy on masked tokens
weighted 1/t, the prompt never masked). The guider is a tiny Llama trained autoregressively on
the same data with the same tokenizer. Both train in float32 (this CPU has no fast bf16), are
deterministic by seed and are saved in bf16 in the
on-disk format of their real counterparts.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from ..models import LLaDAConfig, LLaDAModelLM
from .tasks import training_mix
from .tokenizer import EOT, build_tokenizer

REFERENCE_CONFIG = Path(__file__).resolve().parents[2] / "assets" / "reference" / "llada-8b-instruct" / "config.json"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "assets" / "models"
# Answer-region lengths seen in training, so the model learns to end anywhere from 32 to 256.
REGION_LENGTHS = {32: 0.7, 64: 0.15, 128: 0.1, 256: 0.05}


def diffusion_config(vocab: int, tokenizer) -> LLaDAConfig:
    """The 8B model's config.json with small sizes: the same keys, the same on-disk format."""
    ref = json.loads(REFERENCE_CONFIG.read_text())
    ref.pop("auto_map")
    ref.update(
        d_model=192, n_heads=4, n_kv_heads=4, n_layers=6, mlp_hidden_size=512, max_sequence_length=1024,
        vocab_size=vocab, embedding_size=vocab, rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    return LLaDAConfig(**ref)


def guider_config(vocab: int, tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab, hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )


def _encode(tokenizer, examples) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}], tokenize=False, add_generation_prompt=True)
        for e in examples
    ]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer([e.answer + EOT for e in examples], add_special_tokens=False)["input_ids"]
    return p_ids, a_ids


def diffusion_batch(tokenizer, rng: random.Random, seed: int, step: int, token_budget: int):
    """Rows of prompt + answer + EOS padding; every row's answer region is at least ``L`` long."""
    region = rng.choices(list(REGION_LENGTHS), weights=list(REGION_LENGTHS.values()))[0]
    n = max(8, token_budget // (region + 40))
    p_ids, a_ids = _encode(tokenizer, training_mix(n, seed * 1_000_003 + step))
    width = max(map(len, p_ids)) + region
    eos = tokenizer.eos_token_id
    ids = torch.full((n, width), eos, dtype=torch.long)
    answer = torch.zeros((n, width), dtype=torch.bool)
    for i, (p, a) in enumerate(zip(p_ids, a_ids)):
        ids[i, : len(p)] = torch.tensor(p)
        ids[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        answer[i, len(p) :] = True
    return ids, answer


def diffusion_loss(model, ids: torch.Tensor, answer: torch.Tensor, mask_id: int, gen: torch.Generator, eps: float = 1e-3):
    t = (1 - eps) * torch.rand(ids.shape[0], 1, generator=gen) + eps
    masked = (torch.rand(ids.shape, generator=gen) < t) & answer
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = model(noisy).logits
    ce = F.cross_entropy(logits[masked].float(), ids[masked], reduction="none")
    return (ce / t.expand_as(ids)[masked]).sum() / answer.sum()


def guider_batch(tokenizer, seed: int, step: int, n: int, rng: random.Random):
    p_ids, a_ids = _encode(tokenizer, training_mix(n, seed * 1_000_003 + step))
    # A few EOS after EOT so the guider also accepts the diffusion model's padding.
    rows = [(p, a + [tokenizer.eos_token_id] * rng.randint(1, 6)) for p, a in zip(p_ids, a_ids)]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((n, width), tokenizer.eos_token_id, dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
    return ids, labels


def _lr(step: int, steps: int, peak: float, warmup: int = 200) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def _save(model, tokenizer, target: Path) -> None:
    # A bf16 copy on disk, as the real checkpoints ship; training continues in fp32.
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    copy.eval().to(torch.bfloat16).save_pretrained(target)
    tokenizer.save_pretrained(target)


def train(kind: str, out: Path, steps: int, seed: int, lr: float, token_budget: int, tokenizer,
          save_every: int = 0) -> Path:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = 64 * math.ceil(len(tokenizer) / 64)
    if kind == "diffusion":
        model = LLaDAModelLM(diffusion_config(vocab, tokenizer))
        target = out / "tiny-llada"
    else:
        model = LlamaForCausalLM(guider_config(vocab, tokenizer))
        target = out / "tiny-guider"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    target.mkdir(parents=True, exist_ok=True)
    log = (target / "train_log.jsonl").open("w")
    params = sum(p.numel() for p in model.parameters())
    print(f"training {kind}: {params / 1e6:.2f}M parameters, {steps} steps -> {target}")
    start = time.time()
    bar = tqdm(range(steps), desc=kind, mininterval=5)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr)
        if kind == "diffusion":
            ids, answer = diffusion_batch(tokenizer, rng, seed, step, token_budget)
            loss = diffusion_loss(model, ids, answer, tokenizer.mask_token_id, gen)
        else:
            ids, labels = guider_batch(tokenizer, seed, step, 96, rng)
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        log.write(json.dumps({"step": step, "loss": round(loss.item(), 5), "lr": opt.param_groups[0]["lr"],
                              "elapsed_s": round(time.time() - start, 1)}) + "\n")
        log.flush()
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            _save(model, tokenizer, target)
    log.close()
    _save(model, tokenizer, target)
    print(f"saved {target} after {(time.time() - start) / 60:.1f} min")
    return target


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--which", choices=["both", "diffusion", "guider"], default="both")
    ap.add_argument("--steps", type=int, default=4000, help="diffusion model optimiser steps")
    ap.add_argument("--guider-steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--token-budget", type=int, default=6144, help="tokens per diffusion batch")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer(args.seed)
    if args.which in ("both", "diffusion"):
        train("diffusion", args.out, args.steps, args.seed, args.lr, args.token_budget, tokenizer, args.save_every)
    if args.which in ("both", "guider"):
        train("guider", args.out, args.guider_steps, args.seed, args.lr, args.token_budget, tokenizer, args.save_every)


if __name__ == "__main__":
    main()
