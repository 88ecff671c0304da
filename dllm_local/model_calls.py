"""The model calls an unmasking policy may make (``StepCalls``), each one a forward of its run:
over a fork of the run's cache (which it leaves unchanged) or the guider's, timed and counted
as the run's, the ids no draft may be ruled out as in the drafts."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .policies.unmask import StepCalls
from .recorder import timed
from .softmax import draft_probability


def run_calls(run: Any) -> StepCalls:
    """The calls of ``run`` (the sampler's ``Run``, which imports this module), for its policies."""

    def verify(rows: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        positions, cache = run.positions, run.cache.fork()
        logits, seconds = timed(lambda: run.handle.model(rows[:, positions], positions, cache, sequence=rows,
                                                                  layout=run.layout).logits,
                                run.recorder.gpus)
        run.recorder.count_forward(seconds)  # this request's alone, in a batch too
        picked = logits[torch.arange(rows.shape[0], device=logits.device), torch.searchsorted(positions, at)]
        return F.log_softmax(picked.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()

    def read_cache(tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        cache = run.cache.fork(visible)
        logits, seconds = timed(lambda: run.handle.model(tokens[None], positions, cache, sequence=run.state.x,
                                                                  layout=run.layout).logits[0],
                                run.recorder.gpus)
        run.recorder.count_forward(seconds)
        return run.allowed(logits)

    def this_forward(positions: torch.Tensor, what: str) -> torch.Tensor:
        """The logits this step's forward gave at ``positions``."""
        index = torch.searchsorted(run.positions, positions)
        if not torch.equal(run.positions[index.clamp(max=len(run.positions) - 1)], positions):
            raise ValueError(f"{what}: a position outside this step's forward")
        return run.logits[index]

    def current_probabilities(positions: torch.Tensor) -> torch.Tensor:
        logits = this_forward(positions, "current_probabilities")
        return draft_probability(run.allowed(logits), run.state.x[0, positions])

    def current_drafts(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        drafts = run.draft_at(positions, this_forward(positions, "current_drafts"))
        return drafts.tokens, drafts.confidence

    def guider_forward(input_ids: torch.Tensor, past):
        from transformers import DynamicCache

        model = run.guider.model
        past = past if past is not None else DynamicCache(config=model.config)
        out, seconds = timed(lambda: model(input_ids=input_ids[None].to(model.device), cache=past, use_cache=True),
                             run.recorder.gpus)
        run.recorder.count_guider_forward(seconds)
        return out.logits[0].to(run.handle.device), out.cache

    return StepCalls(run.rng, verify, current_probabilities, current_drafts, guider_forward, read_cache)
