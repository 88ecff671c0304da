"""What a canvas model's step adds to its step record (``StepRecord.canvas``): the canvas after
the step, what the sampler accepted and renoised, the entropy it bounded, the schedule's
temperature, the stopping rule's state and the experts routed; on a canvas's first step, the
encoder's pass that filled the cache the canvas reads. Positions are absolute, as everywhere in
a trace; ``draft`` holds the canvas from ``start`` on. The record's ``reads`` counts the cached
positions the canvas attends over (the full-attention layers' count: the sliding-window layers
keep the last window of them)."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError
from typing_extensions import NotRequired, TypedDict

from .. import values
from ..values import Flag, Number, Text

# A count or a token a run records fits in 64 bits (each is a tensor's size or index): the views read
# counts as floats, and a plot has no JSON number past 64 bits. The whole trace's counts are these.
Count = Annotated[values.Count, Field(le=2**63 - 1)]
TokenId = Count


class EncoderPass(TypedDict):
    positions: Count  # tokens the encoder computed: the prompt, or the canvas finished before
    cached: Count  # K/V entries it found in its cache, and kept (exact: never recomputed)
    ms: Number


class CanvasStep(TypedDict):
    canvas: Count  # which canvas of the answer (the record's ``block`` too)
    start: Count  # the canvas's first position
    draft: list[TokenId]  # the argmax canvas after the step: what transformers appends if the canvas ends here
    accepted: list[Count]  # positions whose sampled token the entropy-bound sampler kept
    sampled: list[TokenId]  # the token kept at each accepted position (the rest were renoised)
    changed: list[Count]  # positions whose draft differs from the step before (the random canvas, at first)
    entropy: list[Number]  # per canvas position, of the temperature-scaled distribution
    entropy_bound: Number
    temperature: Number
    mean_entropy: Number  # the stopping rule's confidence: below confidence_threshold is confident
    stable: Flag  # the draft equal to the last stability_threshold drafts
    confident: Flag
    finished: Flag  # stable and confident: the canvas ends at this step
    experts: NotRequired[dict[Text, list[Count]]]  # decoder layer -> the distinct experts its router chose this step
    encoder: NotRequired[Annotated[EncoderPass, Field()] | None]


def _one_canvas(step: CanvasStep) -> CanvasStep:
    """A canvas as its views read it: a draft of at least one token, one entropy per draft token,
    one sampled token per accepted position, and every accepted or changed position in the canvas."""
    inside = range(step["start"], step["start"] + len(step["draft"]))
    if not step["draft"] or len(step["entropy"]) != len(step["draft"]) or len(step["sampled"]) != len(step["accepted"]):
        raise PydanticCustomError("canvas", "must hold a draft of at least one token, one entropy per draft token "
                                            "and one sampled token per accepted position")
    if not all(p in inside for p in (*step["accepted"], *step["changed"])):
        raise PydanticCustomError("canvas", "must have its accepted and changed positions in the canvas ({low}..{high})",
                                  {"low": inside.start, "high": inside.stop - 1})
    return step


Canvas = Annotated[CanvasStep, AfterValidator(_one_canvas)]
