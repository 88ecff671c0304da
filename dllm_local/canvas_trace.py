"""What a canvas model's step adds to its step record (``StepRecord.canvas``): the canvas after
the step, what the sampler accepted and renoised, the entropy it bounded, the schedule's
temperature, the stopping rule's state and the experts routed; on a canvas's first step, the
encoder's pass that filled the cache the canvas reads. Positions are absolute, as everywhere in
a trace; ``draft`` holds the canvas from ``start`` on. The record's ``reads`` counts the cached
positions the canvas attends over (the full-attention layers' count: the sliding-window layers
keep the last window of them)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field
from typing_extensions import TypedDict

from .values import Count, Flag, Number, Text

TokenId = Count


class EncoderPass(TypedDict):
    positions: Count  # tokens the encoder computed: the prompt, or the canvas finished before
    cached: Count  # K/V entries it found in its cache, and kept (exact: never recomputed)
    ms: Number


class CanvasStep(TypedDict, total=False):
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
    experts: dict[Text, list[Count]]  # decoder layer -> the distinct experts its router chose this step
    encoder: Annotated[EncoderPass, Field()] | None
