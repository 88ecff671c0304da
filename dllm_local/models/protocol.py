"""What every model family offers the engine: the ``DiffusionLM`` protocol and its config's.

LLaDA (``llada.LLaDAModelLM``) and Dream (``dream.DreamModel``) both keep it; the loader, the
handle, the footprint and the engine type a model by it, not by probing the object. Structural
types, never checked at run time, and ``DiffusionLMOutput``, what every family's forward returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

import torch
from transformers.utils import ModelOutput

if TYPE_CHECKING:
    from .attention import AttentionLayout, ForwardObserver, Segment
    from .cache import CacheFork, CacheView, KVCache


class FamilyConfig(Protocol):
    """What the loader and the engine read from a family's config: LLaDAConfig and DreamConfig
    both declare it."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_hidden_layers(self) -> int: ...

    @property
    def max_positions(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def tie_word_embeddings(self) -> bool:
        """The output head reuses the input embedding's weight (LLaDA's is F.linear on it)."""


@dataclass
class DiffusionLMOutput(ModelOutput):
    """A forward's output (a ``ForwardOutput``): the logits, ``[batch, n, vocab]``."""

    logits: torch.Tensor | None = None


class ForwardOutput(Protocol):
    @property
    def logits(self) -> torch.Tensor:
        """``[batch, n, vocab]`` for the ``n`` positions computed."""


class DiffusionLM(Protocol):
    """A diffusion LM as the engine drives it; each family declares ``packs_requests`` and
    ``layout`` as class attributes."""

    config: FamilyConfig
    # Several requests' positions in one forward (``segments``): False where a position's logits
    # read another position's hidden state (Dream's shifted head), so one request a forward.
    packs_requests: bool
    layout: AttentionLayout  # which keys each query may attend (attention.py)
    # A block-diffusion model's trained block (``layout`` is ``BlockCausal`` of it); None: bidirectional.
    block_size: int | None
    experts: tuple[int, int] | None  # a mixture of experts': (experts per layer, routed per token)
    sub_block: int | None  # the sub-block its released sampler decodes a block in (Fast-dLLM v2: 8)

    def new_cache(self, slots: int = 1, max_len: int | None = None) -> KVCache:
        """A KV cache of ``slots`` requests, each up to ``max_len`` positions (default: the model's)."""

    def get_input_embeddings(self) -> torch.nn.Embedding: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: CacheView | CacheFork | None = None,
        observers: Sequence[ForwardObserver] = (),
        segments: list[Segment] | None = None,
        layout: AttentionLayout | None = None,
        **extra: Any,
    ) -> ForwardOutput:
        """Logits for the given tokens at absolute ``positions``; with a cache, only they are
        recomputed (their K/V written, ``observers`` watching); ``segments``: several requests
        packed in one row, each over its own cache; ``layout``: this forward's, when not the
        model's own (a block-diffusion run's block size); ``attention_backend`` (in ``extra``): the
        name of the backend that attends (``attention_backends``). A mixture-of-experts layer reports its
        routing through the forward's ``Attention.routed``."""
