"""The tiny models' tokenizer: byte-level BPE with single-digit tokens and whole words.

Special tokens and the chat template follow LLaDA-8B-Instruct's, so the tiny model's prompts
are laid out exactly as the real model's are.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .tasks import TASKS, make_problems

BOS, EOS, MASK = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"
HEADER_START, HEADER_END, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, MASK, HEADER_START, HEADER_END, EOT]

# LLaDA-8B-Instruct's chat template, verbatim.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
)

# One digit per token (optionally with its leading space), words and punctuation runs whole.
_PIECES = Regex(r" ?\d| ?[A-Za-z]+| ?[^\sA-Za-z\d]+|\s+")


def corpus(seed: int, per_task: int = 4000) -> list[str]:
    texts = []
    for task in TASKS:
        for ex in make_problems(task, per_task, seed):
            texts += [ex.prompt, ex.answer]
    texts += ["user", "assistant", "system", "Hello! How are you?", "What can you do?"] + ["\n\n"] * 50
    return texts


def build_tokenizer(seed: int = 0, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(_PIECES, behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS, mask_token=MASK,
        additional_special_tokens=[HEADER_START, HEADER_END, EOT], clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
