"""Train the embedded tiny models: ``python -m dllm_local.tiny_checkpoints.train`` (every stage, from scratch).

The diffusion model is the project's LLaDA class trained with the masked-diffusion objective
(t ~ U(eps, 1], each answer token masked with probability t, cross-entropy on masked tokens
weighted 1/t, the prompt never masked). A share of the rows (see ``STAGES``) is noised block by
block instead, as semi-autoregressive decoding sees them: earlier blocks clean, the current block
masked with probability t, later blocks fully masked (their masking time is 1, so their weight is
1). The guider is a tiny Llama trained autoregressively on the same data with the same tokenizer.
Both train in float32 (this CPU has no fast bf16), are deterministic by seed and are saved in
bf16 in the on-disk format of their real counterparts.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..models import LLaDAConfig, LLaDAModelLM
from ..tiny.tasks import MIX, TASKS, training_mix
from ..tiny.tokenizer import EOT, build_tokenizer

REFERENCE_CONFIG = Path(__file__).resolve().parents[2] / "assets" / "reference" / "llada-8b-instruct" / "config.json"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "assets" / "models"
# Block sizes drawn for the rows noised block by block (the page's range).
BLOCK_SIZES = (8, 16, 32, 64)


@dataclass(frozen=True)
class Stage:
    """One stage of the diffusion model's training: a cosine schedule of ``steps``, answer regions
    of these lengths (so the model learns to end cleanly at any of them), and this share of rows
    noised block by block."""

    name: str
    steps: int
    lr: float
    warmup: int
    regions: dict[int, float]
    block_suffix_share: float
    mix: dict[str, float] | None = None  # task shares (None: tasks.MIX)


# "base" learns the task content with independent masking on answers of 32 to 256 tokens (the
# first release's recipe). "finish" continues from those weights with a lower learning rate: a
# share of rows noised block by block teaches it to end cleanly after a finished block, answer
# regions to 512 teach it the page's longest lengths, and more rows of sums and poker teach the
# sums as equations and the skewed poker hands. Training block by block from the start does not
# work: with half the rows mostly padding, the content never came (arithmetic 10%).
STAGES = (
    Stage("base", 4000, 1.5e-3, 200, {32: 0.7, 64: 0.15, 128: 0.1, 256: 0.05}, 0.0),
    Stage("finish", 1150, 5e-4, 50, {32: 0.5, 64: 0.18, 128: 0.12, 256: 0.1, 512: 0.1}, 0.3,
          {"arithmetic": 0.5, "poker": 0.12, "sums": 0.26, "records": 0.12}),
)


def trained_tasks(stages: tuple[Stage, ...], before: list[str] = ()) -> list[str]:
    """The tasks a model trained on ``stages`` (after ``before``) has seen, in the suite's order."""
    return [t for t in TASKS if t in before or any((stage.mix or MIX).get(t) for stage in stages)]


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


def _encode(tokenizer, examples, end_of_turn: str = EOT) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}], tokenize=False, add_generation_prompt=True)
        for e in examples
    ]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer([e.answer + end_of_turn for e in examples], add_special_tokens=False)["input_ids"]
    return p_ids, a_ids


def diffusion_batch(tokenizer, rng: random.Random, seed: int, step: int, token_budget: int, stage: Stage,
                    end_of_turn: str = EOT):
    """Rows of prompt + answer + EOS padding, the answer region drawn from the stage's regions."""
    region = rng.choices(list(stage.regions), weights=list(stage.regions.values()))[0]
    n = max(8, token_budget // (region + 40))
    p_ids, a_ids = _encode(tokenizer, training_mix(n, seed * 1_000_003 + step, stage.mix), end_of_turn)
    width = max(map(len, p_ids)) + region
    eos = tokenizer.eos_token_id
    ids = torch.full((n, width), eos, dtype=torch.long)
    answer = torch.zeros((n, width), dtype=torch.bool)
    for i, (p, a) in enumerate(zip(p_ids, a_ids)):
        ids[i, : len(p)] = torch.tensor(p)
        ids[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        answer[i, len(p) :] = True
    return ids, answer


def masking_times(answer: torch.Tensor, gen: torch.Generator, block_suffix_share: float, eps: float = 1e-3) -> torch.Tensor:
    """Per position, the probability it is masked (its masking time): 0 outside the answer.

    Independent rows use one t ~ U(eps, 1] for the whole answer region. Block-suffix rows draw a
    block size and a current block: earlier blocks get 0 (clean), the current block t and every
    later block 1 (fully masked), the state a finished block followed by masked ones is in.
    """
    rows, width = answer.shape
    t = (1 - eps) * torch.rand(rows, 1, generator=gen) + eps
    start = answer.int().argmax(dim=1, keepdim=True)
    region = answer.sum(dim=1, keepdim=True)
    sizes = torch.tensor(BLOCK_SIZES)[torch.randint(len(BLOCK_SIZES), (rows, 1), generator=gen)]
    blocks = (region + sizes - 1) // sizes
    current = (torch.rand(rows, 1, generator=gen) * blocks).long()
    block = (torch.arange(width) - start).clamp(min=0) // sizes
    suffix = torch.where(block < current, 0.0, torch.where(block == current, t, 1.0))
    by_block = torch.rand(rows, 1, generator=gen) < block_suffix_share
    times = torch.where(by_block, suffix, t.expand(rows, width))
    return times * answer


def diffusion_loss(model, ids: torch.Tensor, answer: torch.Tensor, mask_id: int, gen: torch.Generator,
                   block_suffix_share: float) -> torch.Tensor:
    times = masking_times(answer, gen, block_suffix_share)
    masked = torch.rand(ids.shape, generator=gen) < times
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = model(noisy).logits
    ce = F.cross_entropy(logits[masked].float(), ids[masked], reduction="none")
    return (ce / times[masked]).sum() / answer.sum()


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


def train_loop(model, name: str, target: Path, tokenizer, steps: int, seed: int, lr: float, warmup: int,
          batch_loss: Callable[[int, random.Random, torch.Generator], torch.Tensor], save_every: int, log,
          quiet: bool = False) -> None:
    """AdamW on a cosine schedule; ``batch_loss(step, rng, gen)`` draws a batch and returns its loss."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    start = time.time()
    bar = tqdm(range(steps), desc=name, mininterval=5, disable=quiet)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr, warmup)
        loss = batch_loss(step, rng, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        log.write(json.dumps({"stage": name, "step": step, "loss": round(loss.item(), 5),
                              "lr": opt.param_groups[0]["lr"], "elapsed_s": round(time.time() - start, 1)}) + "\n")
        log.flush()
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            _save(model, tokenizer, target)
    _save(model, tokenizer, target)
    print(f"saved {target} after {(time.time() - start) / 60:.1f} min")


def _stage_loss(model, tokenizer, seed: int, token_budget: int, stage: Stage):
    def batch_loss(step: int, rng: random.Random, gen: torch.Generator) -> torch.Tensor:
        ids, answer = diffusion_batch(tokenizer, rng, seed, step, token_budget, stage)
        return diffusion_loss(model, ids, answer, tokenizer.mask_token_id, gen, stage.block_suffix_share)
    return batch_loss


def _guider_loss(model, tokenizer, seed: int):
    def batch_loss(step: int, rng: random.Random, gen: torch.Generator) -> torch.Tensor:
        ids, labels = guider_batch(tokenizer, seed, step, 96, rng)
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    return batch_loss


def train(kind: str, out: Path, seed: int, token_budget: int, tokenizer, save_every: int = 0,
          stages: tuple[Stage, ...] = STAGES, init: Path | None = None, guider_steps: int = 800,
          guider_lr: float = 1.5e-3, quiet: bool = False) -> Path:
    """Train the diffusion model (its ``stages`` in turn, each with seed + its index) or the guider."""
    vocab = 64 * math.ceil(len(tokenizer) / 64)
    # Initial weights from the seed alone, not from whatever ran before in this process.
    torch.manual_seed(seed)
    if kind == "diffusion":
        model = (LLaDAModelLM.from_pretrained(init, dtype=torch.float32) if init
                 else LLaDAModelLM(diffusion_config(vocab, tokenizer)))
        # The longest answer region this model has now been trained on, in its config.json.
        model.config.trained_gen_length = max(getattr(model.config, "trained_gen_length", None) or 0,
                                              *(max(stage.regions) for stage in stages))
        # And the tasks: the page grades a run's answer on those alone.
        model.config.trained_tasks = trained_tasks(stages, getattr(model.config, "trained_tasks", None) or [])
        target = out / "tiny-llada"
    else:
        model = LlamaForCausalLM(guider_config(vocab, tokenizer))
        target = out / "tiny-guider"
    model.train()
    target.mkdir(parents=True, exist_ok=True)
    params = sum(p.numel() for p in model.parameters())
    with (target / "train_log.jsonl").open("w") as log:
        if kind == "diffusion":
            for index, stage in enumerate(stages):
                print(f"training {kind}, stage {stage.name}: {params / 1e6:.2f}M parameters, {stage.steps} steps "
                      f"-> {target}")
                train_loop(model, stage.name, target, tokenizer, stage.steps, seed + index, stage.lr,
                      stage.warmup, _stage_loss(model, tokenizer, seed + index, token_budget, stage), save_every,
                      log, quiet)
        else:
            print(f"training {kind}: {params / 1e6:.2f}M parameters, {guider_steps} steps -> {target}")
            train_loop(model, kind, target, tokenizer, guider_steps, seed, guider_lr, 200,
                  _guider_loss(model, tokenizer, seed), save_every, log, quiet)
    return target


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--which", choices=["both", "diffusion", "guider"], default="both")
    ap.add_argument("--stages", default=",".join(s.name for s in STAGES),
                    help="diffusion model stages to run, in order (a later stage alone needs --init)")
    ap.add_argument("--init", type=Path, default=None,
                    help="start the diffusion model from this model folder's weights and tokenizer")
    ap.add_argument("--guider-steps", type=int, default=800)
    ap.add_argument("--token-budget", type=int, default=6144, help="tokens per diffusion batch")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    by_name = {s.name: s for s in STAGES}
    unknown = [n for n in args.stages.split(",") if n not in by_name]
    if unknown:
        ap.error(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(by_name)}")
    stages = tuple(by_name[n] for n in args.stages.split(","))
    if stages[0] != STAGES[0] and args.init is None:
        ap.error(f"stage {stages[0].name} continues from earlier weights: name them with --init DIR")
    # A later stage keeps the earlier stage's tokenizer (the vocabulary its weights were trained on).
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.init) if args.init else build_tokenizer(args.seed)
    if args.which in ("both", "diffusion"):
        # Stage i runs with seed + its index in STAGES, whichever stages this command runs.
        first = [s.name for s in STAGES].index(stages[0].name)
        train("diffusion", args.out, args.seed + first, args.token_budget, tokenizer, args.save_every, stages, args.init,
              quiet=args.quiet)
    if args.which in ("both", "guider"):
        train("guider", args.out, args.seed, args.token_budget, tokenizer, args.save_every,
              guider_steps=args.guider_steps, quiet=args.quiet)


if __name__ == "__main__":
    main()
