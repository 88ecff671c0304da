"""Vocabulary-wide softmax quantities, a few rows at a time.

A block of 1,024 positions over LLaDA's 126,464-token vocabulary is 130 M logits: one float64
copy of them is 1 GB. Everything here works on row blocks of about CHUNK_ELEMENTS, row-wise, so
the results are the same as over the whole tensor and the temporaries stay a few MB.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows of vocabulary-wide float temporaries per chunk: 2^22 elements (16 MB of float32).
CHUNK_ELEMENTS = 2**22


def row_chunks(*tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Row blocks of ``tensors`` (the first ``[n, vocab]``, the others ``[n, ...]``), about
    CHUNK_ELEMENTS of the first per block: views, no copy."""
    rows = max(1, CHUNK_ELEMENTS // max(1, tensors[0].shape[-1]))
    return list(zip(*(t.split(rows) for t in tensors)))


def draft_probability(logits: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """The softmax probability of ``draft`` in each row, in float64 as LLaDA's generator computes
    it: one token per step ranks positions whose end-of-text probabilities differ only in the last
    float32 bits, and a float32 softmax reorders those commits (the golden traces show it). Row
    blocks keep the float64 copies to a few MB however long the block."""
    return torch.cat([F.softmax(rows.double(), dim=-1).gather(-1, d[:, None]).squeeze(-1)
                      for rows, d in row_chunks(logits, draft)])


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's softmax, float32, a few rows at a time."""
    def of_rows(rows: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(rows.float(), dim=-1)
        return -(logp.exp() * logp).sum(-1)

    return torch.cat([of_rows(rows) for (rows,) in row_chunks(logits)])


def draft_tokens(logits: torch.Tensor, temperature: float, rng: torch.Generator) -> torch.Tensor:
    """Each row's draft: the argmax, with LLaDA's Gumbel-style noise when temperature > 0. The
    noise is float64, as LLaDA draws it (float32 noise changes which low-probability tokens win),
    a few rows at a time so that a long block never holds several float64 copies of its logits.

    LLaDA's form, exp(logits) / (-log u)^T, overflows for large T (at T = 400 the noise is inf
    or 0, and the argmax of 0/0 is a banned id). Where it does, the same argmax is taken in log
    space, logits / T - log(-log u), which is finite for any finite T > 0; elsewhere LLaDA's form
    is kept, so the tokens stay LLaDA's to the last bit."""
    if temperature == 0 or logits.numel() == 0:
        return logits.argmax(-1)

    def noisy_argmax(rows: torch.Tensor) -> torch.Tensor:
        rows = rows.double()
        gumbel = -torch.log(torch.rand(rows.shape, generator=rng, device=rows.device, dtype=torch.float64))
        scores = rows.exp() / gumbel**temperature
        overflowed = ~torch.isfinite(scores).all(-1) | ~(scores > 0).any(-1)
        if overflowed.any():
            scores[overflowed] = rows[overflowed] / temperature - torch.log(gumbel[overflowed])
        return scores.argmax(-1)

    return torch.cat([noisy_argmax(rows) for (rows,) in row_chunks(logits)])
