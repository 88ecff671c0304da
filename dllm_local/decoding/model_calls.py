"""The model calls an unmasking policy may make (``StepCalls``), each one a forward of its run:
over a fork of the run's cache (which it leaves unchanged) or the guider's, timed and counted
as the run's, the ids no draft may be ruled out as in the drafts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from ..models.attention import AttentionLayout
from ..models.cache import CacheFork, CacheView
from ..models.loading.loader import GuiderHandle
from ..policies.unmask import Candidates, StepCalls
from ..runner import ForwardRunner
from ..runner.timing import timed
from ..softmax import draft_probability


class ThisStep(Protocol):
    """This step's forward as its run holds it (the sampler's ``Run``): read when a call is made."""

    positions: torch.Tensor | None  # the positions it computed, sorted (None between steps)
    read_positions: torch.Tensor | None  # those it gave logits at (the block's, or all of them)
    logits: torch.Tensor | None  # its logits there, [n, vocab]


class ForwardCounter(Protocol):
    """Where a run's forwards are timed and counted (the run's ``Recorder``)."""

    gpus: list[torch.device]  # synchronised around each timed forward

    def count_forward(self, seconds: float) -> None: ...

    def count_guider_forward(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class RunModel:
    """What a run's model calls use of it, fixed as it starts: every field the calls read, and
    ``step`` for what changes with each step."""

    runner: ForwardRunner  # the run's model, as its forwards run
    layout: AttentionLayout | None  # the run's forwards' layout (None: the model's own)
    cache: CacheView
    sequence: torch.Tensor  # [1, L] the run's ids, committed in place as it decodes
    counter: ForwardCounter
    device: torch.device  # where the run's logits live (the guider's come back there)
    guider: GuiderHandle | None
    rng: torch.Generator
    allowed: Callable[[torch.Tensor], torch.Tensor]  # logits with the ids no draft may be at -inf
    draft_at: Callable[[torch.Tensor, torch.Tensor], Candidates]  # drafts drawn as the masks' are
    step: ThisStep


def run_calls(run: RunModel) -> StepCalls:
    """The calls of ``run`` (a sampler's ``Run``, which imports this module), for its policies."""

    def forward(tokens: torch.Tensor, positions: torch.Tensor, cache: CacheFork, sequence: torch.Tensor) -> torch.Tensor:
        forward = run.runner(tokens, positions, cache, sequence=sequence, layout=run.layout)
        run.counter.count_forward(forward.seconds)  # this request's alone, in a batch too
        return forward.logits

    def verify(rows: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        positions = computed("verify")
        logits = forward(rows[:, positions], positions, run.cache.fork(), rows)
        picked = logits[torch.arange(rows.shape[0], device=logits.device), torch.searchsorted(positions, at)]
        return F.log_softmax(picked.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()

    def read_cache(tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return run.allowed(forward(tokens[None], positions, run.cache.fork(visible), run.sequence)[0])

    def computed(what: str) -> torch.Tensor:
        """The positions this step's forward computed."""
        if run.step.positions is None:
            raise ValueError(f"{what}: called outside a step")
        return run.step.positions

    def this_forward(positions: torch.Tensor, what: str) -> torch.Tensor:
        """The logits this step's forward gave at ``positions``."""
        computed(what)
        done, logits = run.step.read_positions, run.step.logits
        if logits is None:
            raise ValueError(f"{what}: called before this step's forward")
        index = torch.searchsorted(done, positions)
        if not torch.equal(done[index.clamp(max=len(done) - 1)], positions):
            raise ValueError(f"{what}: a position outside this step's forward")
        return logits[index]

    def current_probabilities(positions: torch.Tensor) -> torch.Tensor:
        logits = this_forward(positions, "current_probabilities")
        return draft_probability(run.allowed(logits), run.sequence[0, positions])

    def current_drafts(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        drafts = run.draft_at(positions, this_forward(positions, "current_drafts"))
        return drafts.tokens, drafts.confidence

    def guider_forward(input_ids: torch.Tensor, past):
        from transformers import DynamicCache

        if run.guider is None:
            raise ValueError("guider_forward: this run has no guider")
        model = run.guider.model
        past = past if past is not None else DynamicCache(config=model.config)
        out, seconds = timed(lambda: model(input_ids=input_ids[None].to(model.device), cache=past, use_cache=True),
                             run.counter.gpus)
        run.counter.count_guider_forward(seconds)
        return out.logits[0].to(run.device), out.cache

    return StepCalls(run.rng, verify, current_probabilities, current_drafts, guider_forward, read_cache)
