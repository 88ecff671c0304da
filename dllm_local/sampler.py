"""The decoding loop: ask the cache policy what to recompute, run the model, ask the unmasking
policy what to commit, record the step. One step record per model forward, yielded as it happens.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from .errors import SequenceTooLongError, SettingsError
from .models.loader import GuiderHandle, ModelHandle
from .policies.base import DecodeState
from .policies.unmask import Candidates
from .recorder import Recorder
from .settings import Settings
from .trace import StepRecord, Trace

Prompt = str | list[dict]


@dataclass
class Result:
    trace: Trace

    @property
    def text(self) -> str:
        return self.trace.text

    @property
    def token_ids(self) -> list[int]:
        """The whole answer region, EOS padding included."""
        return self.trace.final_ids

    @property
    def stats(self):
        return self.trace.stats


def encode_prompt(handle: ModelHandle, prompt: Prompt) -> list[int]:
    """Prompt ids through the model's chat template (multi-turn messages work)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not messages or not any(str(m.get("content", "")).strip() for m in messages):
        raise SettingsError("prompt is empty: type a question or message")
    tok = handle.tokenizer
    if tok.chat_template:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n".join(m["content"] for m in messages)
    return tok(text, add_special_tokens=False)["input_ids"]


class Run:
    """One generation in progress: iterate for step records; ``stop()`` ends it between steps."""

    def __init__(self, handle: ModelHandle, prompt: Prompt, settings: Settings, guider: GuiderHandle | None = None):
        self.handle, self.settings, self.guider = handle, settings, guider
        self.cache_policy = settings.cache_spec.build(settings.cache_params)
        self.unmask_policy = settings.unmask_spec.build(settings.unmask_params)
        if settings.unmask_spec.needs_guider:
            if guider is None:
                raise SettingsError(f"unmask policy {settings.unmask!r} needs a guider model")
            if guider.tokenizer.get_vocab() != handle.tokenizer.get_vocab():
                raise SettingsError("the guider's tokenizer differs from the model's; guided decoding needs the same tokenizer")
        self.prompt_ids = encode_prompt(handle, prompt)
        total = len(self.prompt_ids) + settings.gen_length
        if total > handle.max_length:
            raise SequenceTooLongError(
                f"gen_length {settings.gen_length} plus the prompt's {len(self.prompt_ids)} tokens is {total}, "
                f"beyond the model's maximum of {handle.max_length}"
            )
        self._stop = threading.Event()
        self.result: Result | None = None

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Drop the run's device tensors (its KV caches); the result and trace stay."""
        self.cache = self.recorder.shadow = None

    def __iter__(self) -> Iterator[StepRecord]:
        for record in self._decode():
            yield record
            self.recorder.resume()

    @torch.inference_mode()
    def _setup(self) -> DecodeState:
        """The run's whole state, set here and only here."""
        s, h = self.settings, self.handle
        P, L = len(self.prompt_ids), len(self.prompt_ids) + s.gen_length
        x = torch.full((1, L), h.mask_id, dtype=torch.long, device=h.device)
        x[0, :P] = torch.tensor(self.prompt_ids, device=h.device)
        steps_per_block = (s.steps // s.num_blocks) if s.steps else s.block_size
        state = DecodeState(x, P, s.gen_length, s.block_size, h.mask_id, steps_per_block)
        self.cache = h.model.new_cache(1, L)
        self.cache.seq_len = L
        self.cache_policy.reset(state, self.cache, h.model)
        self.rng = torch.Generator(device=h.device).manual_seed(s.seed)
        self.recorder = Recorder(h, s, self.prompt_ids, self.cache)
        self._positions: torch.Tensor | None = None  # the current step's forward, for verification forwards
        return state

    # ---------------------------------------------------------------- the loop
    def _decode(self) -> Iterator[StepRecord]:
        state, s = self._setup(), self.settings
        stopped = finished = False
        for block in range(s.num_blocks):
            state.block, state.step_in_block = block, 0
            self.unmask_policy.start_block(state)
            while not finished and bool(state.block_masked_positions().numel()):
                if self._stop.is_set():
                    stopped = finished = True
                    break
                with torch.inference_mode():  # per step: never left on while the consumer runs
                    record = self._step(state)
                yield record
                state.step += 1
                state.step_in_block += 1
                with torch.inference_mode():
                    finished = s.early_stop and self._early_stop(state)
        self.result = Result(self.recorder.finish(state, stopped))

    def _step(self, state: DecodeState) -> StepRecord:
        cache = self.cache
        plan = self.cache_policy.plan(state, cache)
        positions = torch.unique(torch.cat([plan.positions, state.block_masked_positions()]))  # sorted
        self._positions = positions
        logits = self.recorder.forward(state.x, positions, cache)
        masked = state.masked[positions]
        self.cache_policy.observe(state, cache, positions, _entropy(logits) if self.settings.cache_spec.needs_entropy else None)
        cand = self._candidates(state, positions[masked], logits[masked])
        selection = self.unmask_policy.select(state, cand, self)
        state.x[0, selection.positions] = cand.tokens[torch.searchsorted(cand.positions, selection.positions)]
        self.cache_policy.end_step(state, cache)
        return self.recorder.step(state, plan, cache, cand, selection, positions[masked], logits[masked],
                                  self.cache_policy.info())

    def _candidates(self, state: DecodeState, masked_positions: torch.Tensor, masked_logits: torch.Tensor) -> Candidates:
        """The block's masked positions with their draft token and its probability (float64, so
        that a threshold near 1 is not decided by float32 rounding)."""
        in_block = (masked_positions >= state.block_start) & (masked_positions < state.block_end)
        logits = masked_logits[in_block]
        draft = self._draft(logits)
        confidence = F.softmax(logits.double(), dim=-1).gather(-1, draft[:, None]).squeeze(-1)
        return Candidates(masked_positions[in_block], draft, confidence)

    def _draft(self, logits: torch.Tensor) -> torch.Tensor:
        """Argmax, with LLaDA's Gumbel-style noise when temperature > 0."""
        t = self.settings.temperature
        if t == 0 or logits.numel() == 0:
            return logits.argmax(-1)
        logits = logits.double()
        noise = torch.rand(logits.shape, generator=self.rng, device=logits.device, dtype=torch.float64)
        return (logits.exp() / (-torch.log(noise)) ** t).argmax(-1)

    def _early_stop(self, state: DecodeState) -> bool:
        answer = state.x[0, state.prompt_len:]
        stops = torch.isin(answer, torch.tensor(self.handle.stop_ids, device=answer.device))
        if not bool(stops.any()):
            return False
        first = int(stops.nonzero()[0])
        if bool((answer[:first] == self.handle.mask_id).any()):
            return False
        answer[first:][answer[first:] == self.handle.mask_id] = self.handle.eos_id
        return True

    # ---------------------------------------------------------------- model calls for policies
    def verify(self, rows: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """For ``k`` variant sequences, the probability of ``tokens[r]`` at position ``at[r]`` in row r
        (``[k]``, float64), from one forward over a fork of the cache (which it leaves unchanged)."""
        positions = self._positions
        logits = self.recorder.extra_forward(rows, positions, self.cache.fork())
        picked = logits[torch.arange(rows.shape[0], device=logits.device), torch.searchsorted(positions, at)]
        return F.log_softmax(picked.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()

    def guider_forward(self, input_ids: torch.Tensor, past):
        """The guider's logits for ``input_ids`` read after its cache ``past`` (None: a new one)."""
        logits, past = self.recorder.guider_forward(self.guider, input_ids, past)
        return logits.to(self.handle.device), past


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def stream(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Run:
    """Start a generation; iterate the returned run for one step record per forward."""
    return Run(handle, prompt, settings or Settings(), guider)


def generate(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Result:
    run = stream(handle, prompt, settings, guider)
    for _ in run:
        pass
    return run.result
