"""The decoding loop: ask the cache policy what to recompute, run the model, ask the unmasking
policy what to commit, record the step. One step record per model forward, yielded as it happens.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from .errors import DecodingError, SequenceTooLongError, SettingsError
from .models.cache import BatchKVCache, KVCache
from .models.loader import GuiderHandle, ModelHandle
from .policies.base import DecodeState
from .policies.cache import Plan, QuotaPool
from .policies.unmask import Candidates
from .recorder import Recorder, timed
from .settings import Settings
from .softmax import draft_probability, entropy, row_chunks
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
    """Prompt ids through the model's chat template (multi-turn messages work). Special tokens
    typed in a message (``<|mdm_mask|>``, ``<|eot_id|>``) are plain text: only the template's own
    markers become control tokens, so a prompt can neither plant masks nor forge turns."""
    messages = _messages(prompt)
    tok = handle.tokenizer
    if not tok.chat_template:
        return _text_ids(tok, "\n".join(m["content"] for m in messages))
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids, start = [], 0
    for begin, end, token_id in _template_markers(tok, messages, text):
        ids += _text_ids(tok, text[start:begin]) + [token_id]
        start = end
    return ids + _text_ids(tok, text[start:])


def _messages(prompt: object) -> list[dict]:
    """The prompt as chat messages, checked here so that a wrong type is a SettingsError rather
    than an error deep inside the chat template."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)):
        messages = list(prompt)
    else:
        raise SettingsError(f"prompt must be text or a list of messages {{'role': ..., 'content': ...}}, "
                            f"not {type(prompt).__name__}")
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise SettingsError(f"message {n} must be a dict with 'role' and 'content', not {type(message).__name__}")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise SettingsError(f"message {n} needs a 'role' (user, assistant or system) as text")
        content = message.get("content")
        if not isinstance(content, str):
            given = "none" if content is None else type(content).__name__
            raise SettingsError(f"message {n} needs a 'content' as text, not {given}")
    if not any(m["content"].strip() for m in messages):
        raise SettingsError("prompt is empty: type a question or message")
    return messages


def _text_ids(tok, text: str) -> list[int]:
    """Ids of ``text`` with special-token strings split into ordinary tokens."""
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []


def _control_tokens(tok, text: str) -> list[tuple[int, int, int]]:
    """``(start, end, id)`` of each special token the tokenizer finds in ``text``."""
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return [(a, b, i) for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i in special]


# Private-use characters stand for each message's content: no tokenizer has them in a special token.
_SLOT = re.compile("\ue000(\\d+)\ue001")


def _template_markers(tok, messages: list[dict], text: str) -> list[tuple[int, int, int]]:
    """The special tokens of the rendered ``text`` that the chat template wrote. The template is
    rendered once more with a slot for each content; the special tokens of ``text``, in order,
    are then the template's (between slots) and the typed ones (in each content), by count,
    which holds whatever the template does to the content (LLaDA's trims it)."""
    slots = [{**m, "content": f"\ue000{n}\ue001"} for n, m in enumerate(messages)]
    parts = _SLOT.split(tok.apply_chat_template(slots, add_generation_prompt=True, tokenize=False))
    from_template: list[bool] = []
    for k, part in enumerate(parts):  # template text, slot number, template text, ...
        source = messages[int(part)]["content"] if k % 2 else part
        from_template += [k % 2 == 0] * len(_control_tokens(tok, source))
    found = _control_tokens(tok, text)
    if len(found) != len(from_template):
        raise SettingsError("the prompt's special-token text runs into the chat template's markers; "
                            "remove the <|...|> markup from the prompt")
    return [token for token, ours in zip(found, from_template) if ours]


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

    @property
    def state_length(self) -> int:
        """Prompt plus answer: the positions this run decodes over."""
        return len(self.prompt_ids) + self.settings.gen_length

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Drop the run's device tensors (its KV caches); the result and trace stay."""
        self.cache = None
        if getattr(self, "recorder", None) is not None:  # set up (a batch may fail before)
            self.recorder.shadow = None

    def __iter__(self) -> Iterator[StepRecord]:
        for record in self._decode():
            t = time.perf_counter()
            yield record
            self.recorder.pause(time.perf_counter() - t)

    @torch.inference_mode()
    def _setup(self, cache: KVCache | None = None) -> DecodeState:
        """The run's whole state, set here and only here; ``cache``: its row of a batch's cache."""
        s, h = self.settings, self.handle
        P, L = len(self.prompt_ids), self.state_length
        x = torch.full((1, L), h.mask_id, dtype=torch.long, device=h.device)
        x[0, :P] = torch.tensor(self.prompt_ids, device=h.device)
        steps_per_block = (s.steps // s.num_blocks) if s.steps else s.block_size
        state = DecodeState(x, P, s.gen_length, s.block_size, h.mask_id, steps_per_block)
        if cache is None:
            cache = h.model.new_cache(1, L)
            cache.seq_len = L
        self.cache = cache
        self.cache_policy.reset(state, self.cache, h.model)
        self.unmask_policy.start_block(state)
        self.rng = torch.Generator(device=h.device).manual_seed(s.seed)
        # Ids a draft may never be: the mask itself (a "committed" mask never finishes its block) and
        # padding rows of the embedding that the tokenizer has no token for.
        rows = h.model.get_input_embeddings().weight.shape[0]
        self._banned = torch.tensor([h.mask_id, *range(len(h.tokenizer), rows)], device=h.device)
        self._max_forwards = s.gen_length + s.num_blocks
        self.recorder = Recorder(h, s, self.prompt_ids, self.cache, self._banned)
        self.state = state
        self._stepped = self._finished = self._stopped = False
        # The current step's plan and forward, for policies that read more of it (verification, revision).
        self._plan: Plan | None = None
        self._positions: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        return state

    # ---------------------------------------------------------------- the loop
    def _decode(self) -> Iterator[StepRecord]:
        state = self._setup()
        while True:
            with torch.inference_mode():  # per step: never left on while the consumer runs
                if not self._next_step(state):
                    return
                logits = self.recorder.forward(state.x, self._positions, self.cache)
                record = self._take(state, logits)
            yield record

    def _next_step(self, state: DecodeState) -> bool:
        """Between two forwards: count the step just taken, end early once the answer is whole,
        move on when the block is done, honour Stop, plan the next forward. False: the run is
        over and ``result`` is set."""
        s = self.settings
        if self._stepped:
            state.step += 1
            state.step_in_block += 1
            self._finished = s.early_stop and self._early_stop(state)
        while not self._finished and not bool(state.block_masked_positions().numel()):
            if state.block + 1 == s.num_blocks:
                self._finished = True
            else:
                state.block, state.step_in_block = state.block + 1, 0
                self.unmask_policy.start_block(state)
        if not self._finished and self._stop.is_set():
            self._finished = self._stopped = True
        if self._finished:
            self.result = Result(self.recorder.finish(state, self._stopped))
            self._plan = self._positions = self._logits = None  # in a batch, a view of the batch's logits
            return False
        if state.step >= self._max_forwards:
            raise DecodingError(
                f"decoding did not finish within {self._max_forwards} forwards (gen_length + blocks): "
                f"the {s.unmask} policy stopped committing tokens; this is a bug, please report it with the settings")
        self._plan = self.cache_policy.plan(state, self.cache)
        self._positions = torch.unique(torch.cat([self._plan.positions, state.block_masked_positions()]))  # sorted
        return True

    def _take(self, state: DecodeState, logits: torch.Tensor) -> StepRecord:
        """The step after its forward (``logits`` ``[n, vocab]`` at the planned positions): the
        cache policy observes, the unmasking policy commits, the step is recorded."""
        cache, positions = self.cache, self._positions
        self._logits = logits
        self._stepped = True
        masked = state.masked[positions]
        self.cache_policy.observe(state, cache, positions, entropy(logits) if self.settings.cache_spec.needs_entropy else None)
        masked_logits = logits[masked].index_fill(-1, self._banned, float("-inf"))
        cand = self._candidates(state, positions[masked], masked_logits)
        selection = self.unmask_policy.select(state, cand, self)
        state.x[0, selection.positions] = cand.tokens[torch.searchsorted(cand.positions, selection.positions)]
        if selection.revoked:
            state.x[0, [r[0] for r in selection.revoked]] = self.handle.mask_id
            self._max_forwards += len(selection.revoked)  # each one a token to commit again, boundedly often
        self.cache_policy.end_step(state, cache)
        return self.recorder.step(state, self._plan, cache, cand, selection, positions[masked], masked_logits,
                                  self.cache_policy.info())

    def _candidates(self, state: DecodeState, masked_positions: torch.Tensor, masked_logits: torch.Tensor) -> Candidates:
        """The block's masked positions with their draft token and its probability, renormalised
        over the ids a draft may be."""
        in_block = (masked_positions >= state.block_start) & (masked_positions < state.block_end)
        logits = masked_logits[in_block]
        draft = self._draft(logits)
        return Candidates(masked_positions[in_block], draft, draft_probability(logits, draft))

    def _draft(self, logits: torch.Tensor) -> torch.Tensor:
        """Argmax, with LLaDA's Gumbel-style noise when temperature > 0: float64, as LLaDA draws
        it (float32 noise changes which low-probability tokens win), a few rows at a time so that
        a long block never holds several float64 copies of its logits."""
        t = self.settings.temperature
        if t == 0 or logits.numel() == 0:
            return logits.argmax(-1)

        def noisy_argmax(rows: torch.Tensor) -> torch.Tensor:
            rows = rows.double()
            noise = torch.rand(rows.shape, generator=self.rng, device=rows.device, dtype=torch.float64)
            return (rows.exp() / (-torch.log(noise)) ** t).argmax(-1)

        return torch.cat([noisy_argmax(rows) for (rows,) in row_chunks(logits)])

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

    def current_probabilities(self, positions: torch.Tensor) -> torch.Tensor:
        """The probability this step's forward gives the tokens now at ``positions`` (float64)."""
        index = torch.searchsorted(self._positions, positions)
        if not torch.equal(self._positions[index.clamp(max=len(self._positions) - 1)], positions):
            raise ValueError("current_probabilities: a position outside this step's forward")
        logits = self._logits[index].index_fill(-1, self._banned, float("-inf"))
        tokens = self.state.x[0, positions]
        return draft_probability(logits, tokens)

    def guider_forward(self, input_ids: torch.Tensor, past):
        """The guider's logits for ``input_ids`` read after its cache ``past`` (None: a new one)."""
        logits, past = self.recorder.guider_forward(self.guider, input_ids, past)
        return logits.to(self.handle.device), past


class BatchRun:
    """Several requests decoded together: one forward per step for all the requests still
    decoding, each row with its own positions, policies, seed and trace (rows of one
    ``BatchKVCache``), so each request decodes as it would alone. A request that finishes leaves
    the batch: its row is dropped from the cache and later forwards no longer compute it.

    With ``share_budget`` the adaptive caches' budgets become one budget shared by quotas (see
    ``QuotaPool``): the one thing that makes a request decode otherwise than alone.

    Iterate for ``(request, StepRecord)`` pairs; ``results`` then holds one result per prompt.
    """

    def __init__(self, handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings],
                 guider: GuiderHandle | None = None, share_budget: bool = True) -> None:
        """``settings``: one for every request, or one per request (an evaluation's own seeds)."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise SettingsError("a batch needs a list of at least one prompt")
        if not getattr(handle.model, "packs_requests", False):
            raise SettingsError(f"{type(handle.model).__name__} decodes one request at a time: batched decoding "
                                f"runs LLaDA-family models (LLaDA and the tiny model)")
        per_request = list(settings) if isinstance(settings, (list, tuple)) else [settings] * len(prompts)
        if len(per_request) != len(prompts):
            raise SettingsError(f"{len(per_request)} settings for {len(prompts)} prompts: give one, or one per prompt")
        if any(s.exact_drift for s in per_request):
            raise SettingsError("exact_drift runs a second, uncached model per request: turn it off to decode a batch")
        self.handle, self.share_budget = handle, share_budget
        self.runs = [Run(handle, prompt, s, guider) for prompt, s in zip(prompts, per_request)]
        self.results: list[Result] | None = None
        self.cache: BatchKVCache | None = None
        self.pool: QuotaPool | None = None
        # What the batch did: forwards, the rows they computed, model and wall time, and when each
        # request was done (its latency, from the batch's start).
        self.forwards = self.row_forwards = 0
        self.model_s = self.wall_s = 0.0
        self.latency_s = [0.0] * len(prompts)

    def stop(self) -> None:
        for run in self.runs:
            run.stop()

    def release(self) -> None:
        """Drop the batch's cache (every request's K/V); results and traces stay."""
        self.cache = None
        for run in self.runs:
            run.release()

    def __iter__(self) -> Iterator[tuple[int, StepRecord]]:
        runs = self.runs
        start = time.perf_counter()
        paused = 0.0
        try:
            with torch.inference_mode():
                self._setup()
            active = list(range(len(runs)))  # request numbers, in cache row order
            while True:
                with torch.inference_mode():
                    going = [i for i in active if runs[i]._next_step(runs[i].state)]
                    for i in set(active) - set(going):
                        self.latency_s[i] = time.perf_counter() - start - paused
                    if going != active:
                        self.cache.keep([active.index(i) for i in going])
                        active = going
                    if not active:
                        break
                    records = self._step(active)
                for i, record in records:
                    t = time.perf_counter()
                    yield i, record
                    held = time.perf_counter() - t  # the consumer's time: no request's
                    paused += held
                    for j in active:
                        runs[j].recorder.pause(held)
        except BaseException:
            self.release()  # a failed batch lets go of its cache at once
            raise
        self.wall_s = time.perf_counter() - start - paused
        self.results = [run.result for run in runs]
        self.release()

    def _setup(self) -> None:
        runs = self.runs
        self.cache = BatchKVCache(self.handle.model, [r.state_length for r in runs])
        for run, view in zip(runs, self.cache.views):
            run._setup(view)
            run.recorder.trace.stats.batch_size = len(runs)
        self._budgets = {i: run.cache_policy.allowance for i, run in enumerate(runs)
                         if getattr(run.cache_policy, "allowance", None)}
        if self.share_budget and self._budgets:
            self.pool = QuotaPool(sum(self._budgets.values()))

    def _step(self, active: list[int]) -> list[tuple[int, StepRecord]]:
        """One forward for the ``active`` requests' planned positions, packed; then each takes its rows."""
        runs, cache, h = self.runs, self.cache, self.handle
        cache.row_tokens = [len(runs[i]._positions) for i in active]
        positions = torch.cat([runs[i]._positions for i in active])
        ids = torch.cat([runs[i].state.x[0, runs[i]._positions] for i in active])[None]
        logits, seconds = timed(lambda: h.model(ids, positions, cache).logits[0].split(cache.row_tokens),
                                runs[0].recorder.gpus)
        self.forwards += 1
        self.row_forwards += len(active)
        self.model_s += seconds
        if self.pool is not None:  # quotas from what each holds now, before anyone evicts
            holding = {i: runs[i].cache.num_cached() for i in active if i in self._budgets}
            for i, quota in self.pool.allocate(holding).items():
                runs[i].cache_policy.quota = quota
        records = []
        for row, i in enumerate(active):
            runs[i].recorder.count_forward(seconds, cache.row_tokens[row] / len(positions))
            records.append((i, runs[i]._take(runs[i].state, logits[row])))
        return records


def stream(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Run:
    """Start a generation; iterate the returned run for one step record per forward."""
    return Run(handle, prompt, settings or Settings(), guider)


def stream_batch(handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings] | None = None,
                 guider: GuiderHandle | None = None) -> BatchRun:
    """Start decoding ``prompts`` together; iterate for ``(request, StepRecord)`` pairs."""
    return BatchRun(handle, prompts, Settings() if settings is None else settings, guider)


def generate_batch(handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings] | None = None,
                   guider: GuiderHandle | None = None, share_budget: bool = True) -> list[Result]:
    """One result (and trace) per prompt, decoded as a batch: the same tokens as each alone
    (unless adaptive caches share their budgets, see ``BatchRun``)."""
    run = BatchRun(handle, prompts, Settings() if settings is None else settings, guider, share_budget)
    for _ in run:
        pass
    return run.results


def generate_all(handle: ModelHandle, prompts: list[Prompt], settings: list[Settings], guider: GuiderHandle | None = None,
                 batch_size: int = 1, done: Callable[[int], None] | None = None) -> list[Result]:
    """One result per prompt (each with its own settings), decoded ``batch_size`` at a time;
    ``done(k)`` is called as each batch of ``k`` finishes (a progress bar). Budgets are not
    shared: an evaluation's answers must not depend on its batch size."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SettingsError(f"batch_size must be an integer >= 1, not {batch_size!r}")
    results: list[Result] = []
    for first in range(0, len(prompts), batch_size):
        chunk, chunk_settings = prompts[first : first + batch_size], settings[first : first + batch_size]
        if batch_size == 1:
            results.append(generate(handle, chunk[0], chunk_settings[0], guider))
        else:
            results += generate_batch(handle, chunk, chunk_settings, guider, share_budget=False)
        if done is not None:
            done(len(chunk))
    return results


def generate(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Result:
    run = stream(handle, prompt, settings, guider)
    for _ in run:
        pass
    return run.result
