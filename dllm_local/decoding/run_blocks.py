"""Where a run's blocks sit, by the model's kind, and the policies a model refuses.

Masked diffusion (LLaDA, Dream): block 0 starts at the answer's first position and the block
divides the answer. Block diffusion (SDAR, LLaDA2, Fast-dLLM v2): blocks sit at absolute
positions ``p // block_size``, as the released samplers place them: the block holding the
prompt's end is decoded with its first answer positions, and the answer runs on to the end of
the block holding its last position. Every forward then attends block-causally.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import kinds
from ..errors import SettingsError
from ..models.attention import BlockCausal
from ..models.loading.loader import GuiderHandle, ModelHandle
from ..settings import Settings


@dataclass(frozen=True)
class Blocks:
    layout: BlockCausal | None  # the run's forwards' layout; None: the model's own (bidirectional)
    blocks_from: int | None  # where block 0 starts; None: at the answer
    answer_length: int
    count: int


def run_blocks(handle: ModelHandle, settings: Settings, prompt_len: int) -> Blocks:
    """The blocks of a run of ``settings`` on ``handle`` after a prompt of ``prompt_len`` tokens."""
    B = settings.block_size
    if not kinds.get(handle.kind).absolute_blocks:
        if settings.absolute_blocks:  # the length it let through needs blocks this model cannot place
            raise SettingsError(f"absolute_blocks: {handle.name} is a {kinds.get(handle.kind).label} model, whose "
                                f"blocks start at the answer; leave absolute_blocks off")
        return Blocks(None, None, settings.gen_length, settings.num_blocks)
    start, end = prompt_len - prompt_len % B, -(-(prompt_len + settings.gen_length) // B) * B
    return Blocks(BlockCausal(B), start, end - prompt_len, (end - start) // B)


def check_policies(handle: ModelHandle, settings: Settings, guider: GuiderHandle | None) -> None:
    """A policy the model (or the missing guider) cannot run is refused before anything runs: a
    verifying query on a shifted head, a guider of another tokenizer, a cache policy that makes
    no sense for the model's kind."""
    if settings.unmask_spec.position_wise_model and not handle.model.packs_requests:
        raise SettingsError(f"unmask policy {settings.unmask!r} verifies with a query that repeats positions: it "
                            f"needs a model whose logits at a position come from that position alone, as LLaDA's "
                            f"(this model's head reads the position before)")
    if settings.unmask_spec.needs_guider:
        if guider is None:
            raise SettingsError(f"unmask policy {settings.unmask!r} needs a guider model")
        if guider.tokenizer.get_vocab() != handle.tokenizer.get_vocab():
            raise SettingsError("the guider's tokenizer differs from the model's; guided decoding needs the same tokenizer")
    if kinds.get(handle.kind).policy_kind in settings.cache_spec.model_kinds:
        return
    raise SettingsError(kinds.get(handle.kind).cache_refusal.format(cache=settings.cache, name=handle.name,
                                                                    family=handle.family))
