"""The decoding loop, as LLaDA's ``generate``: one step record per model forward, yielded as it happens.

For each block, while it has masks (or, when the cache policy gives an order instead of fixed
blocks, ``CachePolicy.window``, e.g. Flash-Cache's window sliding over the undecoded positions,
while that window has any left):

1. **plan**: the cache policy picks the positions to recompute; the block's masks (the window) join them.
2. **forward**: the model computes those positions; the rest are read from the KV cache.
3. **observe**: the cache policy reads the forward (its signals are computed when it asks).
4. **draft**: a token and its probability at each of the block's masked positions (the window's).
5. **select**: the unmasking policy picks the drafts to commit (and may take earlier ones back),
   calling the model through ``model_calls.py`` if it needs more.
6. **commit**: the picked drafts replace their masks; a sliding window re-ranks its order.
7. **evict**: the cache policy may drop entries, now that the step's bookkeeping is done.
8. **record**: the step record is built, timed and yielded.

``Run.step`` is 1 to 8; ``batch.py`` runs several runs' 1, one packed forward for their 2, then
each run's 3 to 8 (``Run.after_forward``).
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

import torch

from .. import kinds
from ..errors import DecodingError, SequenceTooLongError, SettingsError
from ..models.cache import CacheView
from ..models.loading.loader import GuiderHandle, ModelHandle
from ..policies.base import CacheAccess, DecodeState, StepSignals
from ..policies.unmask import Candidates, Selection
from .model_calls import RunModel, run_calls
from ..prompts import Prompt, encode_prompt
from .recorder import Recorder, Step
from ..result import Result
from ..runner import Forward, runner_for
from .run_blocks import check_policies, run_blocks
from ..settings import Settings
from ..softmax import draft_probability, draft_tokens
from ..trace import Branch, StepRecord, Trace


class Run:
    """One generation in progress: iterate for step records; ``stop()`` ends it between steps."""

    def __init__(self, handle: ModelHandle, prompt: Prompt, settings: Settings, guider: GuiderHandle | None = None,
                 branch: Branch | None = None):
        kinds.get(handle.kind).check_knobs(settings.knobs_set(), handle.name)  # a canvas knob on the sampler, ...
        self.handle, self.settings, self.guider, self.branch = handle, settings, guider, branch
        self.cache_policy = settings.cache_spec.build(settings.cache_params)
        self.unmask_policy = settings.unmask_spec.build(settings.unmask_params)
        check_policies(handle, settings, guider)
        self.prompt_ids = encode_prompt(handle, prompt)
        blocks = run_blocks(handle, settings, len(self.prompt_ids))
        self.layout, self.blocks_from, self.num_blocks = blocks.layout, blocks.blocks_from, blocks.count
        self._answer_length = blocks.answer_length
        if branch is not None:
            self._check_branch(branch)
        self.padding = self.cache_policy.padding(len(self.prompt_ids), self._answer_length)
        total = len(self.prompt_ids) + self._answer_length + self.padding
        if total > handle.max_length:
            padded = f" and {self.padding} end-of-text positions of the cache policy's span" if self.padding else ""
            raise SequenceTooLongError(
                f"gen_length {settings.gen_length} plus the prompt's {len(self.prompt_ids)} tokens{padded} is {total}, "
                f"beyond the model's maximum of {handle.max_length}"
            )
        self._stop = threading.Event()
        self.result: Result | None = None
        self.cache: CacheView | None = None
        self._owns_cache = False
        self.recorder: Recorder | None = None
        # The current step's forward: the positions it computed, those it read logits at (its head's
        # rows) and those logits, read by current_probabilities.
        self.positions = self.read_positions = self.logits = None
        self._read_rows: tuple[int, int] | None = None

    @property
    def answer_length(self) -> int:
        """The answer region's positions (the trace's ``gen_length``): ``gen_length``, run on to
        the end of its last block on a block-diffusion model."""
        return self._answer_length

    @property
    def state_length(self) -> int:
        """Prompt, answer and the cache policy's end-of-text padding: the positions this run attends over."""
        return len(self.prompt_ids) + self._answer_length + self.padding

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Drop the run's device tensors (its KV cache views, and the model calls holding one); the
        result and trace stay."""
        if self.cache is not None and self._owns_cache:
            with torch.inference_mode():  # its tensors were made there
                self.cache.store.free(self.cache)  # its slot goes back to the runner's pool, emptied
        self.cache = self._cache_access = self.calls = self.positions = self.read_positions = self.logits = None
        if self.recorder is not None:
            self.recorder.shadow = None

    def __iter__(self) -> Iterator[StepRecord]:
        for record in self._decode():
            t = time.perf_counter()
            yield record
            self.recorder.pause(time.perf_counter() - t)

    # ---------------------------------------------------------------- the loop
    def _decode(self) -> Iterator[StepRecord]:
        self.start()
        while self.next_step():  # per block, while it has masks; Stop, early stop, the bound
            yield self.step()

    @torch.inference_mode()
    def next_step(self) -> bool:
        """Whether another step follows, starting the next block when this one has no masks left.
        False: the run is over and ``result`` is set."""
        state, s = self.state, self.settings
        if self.branch is not None and state.step == self.branch.after_step + 1:
            self._intervene(self.branch)
        if state.window is not None:
            if state.window.done():
                return self._finish()
        elif s.early_stop and state.step and self._answer_complete(self.layout is None or self.cache_policy.ends_mid_block()
                                                                   or self.unmask_policy.block_done(state)):
            return self._finish()
        while state.window is None and self.unmask_policy.block_done(state):
            if state.block + 1 == self.num_blocks:
                return self._finish()
            self.start_block(state.block + 1)
        if self._stop.is_set():
            return self._finish(stopped=True)
        if state.step >= self._max_forwards:
            raise DecodingError(
                f"decoding did not finish within {self._max_forwards} forwards (gen_length + blocks): "
                f"the {s.unmask} policy stopped committing tokens with these settings ({s.to_json()}); try the "
                f"fixed schedule, or another unmasking policy")
        return True

    @torch.inference_mode()
    def step(self) -> StepRecord:
        """Stages 1 to 8 of the module's docstring."""
        return self.after_forward(self.forward(self.plan()).logits[0])

    def plan(self) -> torch.Tensor:
        """1. plan: the positions this step's forward computes (sorted), the cache policy's and
        the block's masks, found in one pass."""
        state = self.state
        plan = self._plan = self.cache_policy.plan(state, self._cache_access)
        decodable = torch.zeros(state.total_len, dtype=torch.bool, device=state.x.device)
        lo, hi = (0, 0) if state.window is not None else self.cache_policy.decodable(state) or (state.block_start,
                                                                                              state.block_end)
        decodable[lo:hi] = state.masked[lo:hi]
        if state.window is not None:
            decodable[state.window.positions()] = True
        held = plan.span is not None and plan.span[0] <= lo and hi <= plan.span[1] and state.window is None
        if held or plan.span == (0, state.total_len):  # the plan holds what decodes: known on the host
            self.positions = plan.positions
        elif plan.outside_window:  # apart from the window: the two joined by a sort, unasked
            self.positions = torch.sort(torch.cat([plan.positions, state.window.positions()])).values
        else:
            computed = decodable.clone()
            computed[plan.positions] = True
            self.positions = computed.nonzero().flatten()
        if state.window is not None:
            decodable[state.window.length :] = False  # past the answer's length: scored, never committed
        self._decodable = decodable
        # The head's rows where the host knows them: the block's, unless the trace lists every masked
        # position scored or the cache policy reads every computed position (then every row).
        reads_block = held and self.handle.model.packs_requests and not (self.recorder.reads_masked
                                                                         or self.cache_policy.reads_every_logit)
        self._read_rows, self.read_positions = (lo - plan.span[0], hi - plan.span[0]) if reads_block else None, self.positions
        return self.positions

    def forward(self, positions: torch.Tensor) -> Forward:
        """2. forward: the model on ``positions`` of the sequence (the rest read from the cache),
        watched by the recorder's and the cache policy's observers: the logits ``[1, n, vocab]`` at
        ``read_positions`` (the block's alone where the step reads no others)."""
        x, rows, read = self.state.x, self._read_rows, None
        if rows is not None and rows != (0, positions.numel()):
            self.read_positions, read = positions[rows[0] : rows[1]], torch.arange(*rows, device=positions.device)
        forward = self.runner(x[:, positions], positions, self.cache, self.observers, x, self.layout, read)
        self.recorder.count_forward(forward.seconds)
        self.recorder.exact_forward(x, self.cache)
        return forward

    def after_forward(self, logits: torch.Tensor) -> StepRecord:
        """Stages 3 to 8, given the forward's ``logits`` at ``read_positions``."""
        state, positions = self.state, self.read_positions
        self.logits = logits
        self._cache_access.written(self.positions, state.step)
        self.cache_policy.observe(state, self._cache_access, StepSignals(positions, logits))  # 3. observe
        masked_positions = masked_logits = None
        if self.recorder.reads_masked:  # what the trace shows of every still-masked position scored
            masked = state.masked[positions]
            masked_positions, masked_logits = positions[masked], self.allowed(logits[masked])
            candidates = self.draft(masked_positions, masked_logits, allowed=True)  # 4. draft
        else:
            candidates = self.draft(positions, logits)  # 4. draft
        selection = self.unmask_policy.select(state, candidates, self.calls)  # 5. select
        self.commit(candidates, selection)  # 6. commit
        self.cache_policy.end_step(state, self._cache_access)  # 7. evict
        record = self.recorder.step(Step(state, self._plan.full, candidates, selection, masked_positions,  # 8. record
                                         masked_logits, self.cache_policy.info()))
        state.step += 1
        state.step_in_block += 1
        return record

    # ---------------------------------------------------------------- the loop's parts
    @torch.inference_mode()
    def start(self, cache: CacheView | None = None) -> DecodeState:
        """The run's whole state, set here and only here; ``cache``: its slot of a batch's cache."""
        s, h = self.settings, self.handle
        P, L = len(self.prompt_ids), self.state_length
        G = self._answer_length
        x = torch.full((1, L), h.mask_id, dtype=torch.long, device=h.device)
        x[0, :P] = torch.tensor(self.prompt_ids, device=h.device)
        x[0, P + G :] = h.eos_id  # the cache policy's padding
        # A prompt ending inside a block adds one to the blocks ``steps`` was checked against: each still gets one.
        steps_per_block = max(1, s.steps // self.num_blocks) if s.steps else s.block_size
        self.state = DecodeState(x, P, G, s.block_size, h.mask_id, steps_per_block, blocks_from=self.blocks_from)
        self.state.window = self.cache_policy.window(self.state, h.eos_id)
        self.runner = runner_for(h.model, s.forward_mode, attention=s.attention_backend)
        self._owns_cache = cache is None  # else a batch's slot, which the batch frees
        self.cache = cache if cache is not None else self.runner.new_cache(1, L).alloc(L)
        self._cache_access = CacheAccess(self.cache, L)
        self.cache_policy.reset(self.state, self._cache_access, h.model)
        self.unmask_policy.start_block(self.state)
        self.rng = torch.Generator(device=h.device).manual_seed(s.seed)
        # Ids a draft may never be: the mask itself (a "committed" mask never finishes its block) and
        # padding rows of the embedding that the tokenizer has no token for.
        rows = h.model.get_input_embeddings().weight.shape[0]
        self._banned = torch.tensor([h.mask_id, *range(len(h.tokenizer), rows)], device=h.device)
        self._max_forwards = G + self.num_blocks
        self.recorder = Recorder(h, s, self.prompt_ids, self.cache, self._banned, G, self.layout, self.blocks_from,
                                 self.runner)
        self.calls = run_calls(RunModel(self.runner, self.layout, self.cache, x, self.recorder, h.device, self.guider,
                                        self.rng, self.allowed, self.draft_at, self))
        self.observers = (*self.recorder.observers, *self.cache_policy.observers())
        self._store(self.cache_policy.settle(self.state))
        return self.state

    def start_block(self, block: int) -> None:
        self.state.block, self.state.step_in_block, self.state.masks_left = block, 0, None
        self._store(self.cache_policy.settle(self.state))
        self.unmask_policy.start_block(self.state)

    def _store(self, positions: torch.Tensor | None) -> None:
        """A forward that writes ``positions``' K/V and decodes nothing (block diffusion's prefill, a finished block's store)."""
        if positions is None or not positions.numel():
            return
        x, end = self.state.x, int(positions[-1]) + 1
        # A shifted head's last row predicts the next block's first position: as released, that
        # token is committed from this forward (greedy, no denoising step), when it is a mask.
        handoff = not self.handle.model.packs_requests and end < x.shape[1] and bool(x[0, end] == self.handle.mask_id)
        positions = torch.cat([positions, positions.new_tensor([end])]) if handoff else positions
        forward = self.runner(x[:, positions], positions, self.cache, sequence=x, layout=self.layout)
        logits, seconds = forward.logits[0], forward.seconds
        committed = None
        if handoff:
            draft = self.draft_at(positions[-1:], logits[-1:])
            x[0, end] = draft.tokens[0]
            committed = [end, int(draft.tokens[0]), round(float(draft.confidence[0]), 6)]
        self.recorder.count_store(positions[:-1] if handoff else positions, seconds, committed)

    def allowed(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the ids a draft may never be at -inf."""
        return logits.index_fill(-1, self._banned, float("-inf"))

    def draft(self, positions: torch.Tensor, logits: torch.Tensor, allowed: bool = False) -> Candidates:
        """4. draft: the block's masked positions (the window's) among ``positions`` with their draft
        token and its probability, renormalised over the ids a draft may be (``allowed``: the others
        are at -inf in ``logits`` already)."""
        rows = self._decodable[positions].nonzero().flatten()
        return self.draft_at(positions[rows], logits[rows], allowed)

    def draft_at(self, positions: torch.Tensor, logits: torch.Tensor, allowed: bool = False) -> Candidates:
        """``positions``' drafts from their ``logits``, drawn with the run's temperature and seed."""
        logits = logits if allowed else self.allowed(logits)
        tokens = draft_tokens(logits, self.settings.temperature, self.rng)
        return Candidates(positions, tokens, draft_probability(logits, tokens))

    def commit(self, candidates: Candidates, selection: Selection) -> None:
        """6. commit."""
        x, window = self.state.x[0], self.state.window
        if selection.among is None:
            x[selection.positions] = candidates.tokens[torch.searchsorted(candidates.positions, selection.positions)]
        else:  # every candidate, its draft where the mask says: nothing read back
            x[candidates.positions] = torch.where(selection.among, candidates.tokens, x[candidates.positions])
        if window is not None:
            ranked = candidates.positions[torch.sort(candidates.confidence, descending=True, stable=True).indices]
            chosen = selection.committed()
            committed = ranked[torch.argsort(~torch.isin(ranked, chosen), stable=True)[: chosen.numel()]]
            newest = committed.numel() if selection.newest is None else selection.newest
            window.commit(ranked, committed, x[committed], newest, self.cache_policy.ranking())
        if selection.edits:  # rewritten in place; a forward after the block's last mask is one of finitely many
            x[[e[0] for e in selection.edits]] = torch.tensor([e[1] for e in selection.edits], device=x.device)
        self._max_forwards += not candidates.positions.numel()
        if selection.revoked:  # never with a sliding window: the policies that revoke decode block by block
            x[[r[0] for r in selection.revoked]] = self.handle.mask_id
            self._max_forwards += len(selection.revoked)  # each one a token to commit again, boundedly often

    def _check_branch(self, branch: Branch) -> None:
        """What can be told of a branch before decoding: its cache, position and token."""
        s, P, vocab = self.settings, len(self.prompt_ids), len(self.handle.tokenizer)
        if s.cache_spec.slides:
            raise SettingsError(f"cache policy {s.cache!r} slides a window whose order a forced token would "
                                f"break: branch a run that decodes block by block")
        if not P <= branch.position < P + self._answer_length:
            raise SettingsError(f"position {branch.position} is outside the answer ({P}..{P + self._answer_length - 1})")
        if branch.token is not None and not 0 <= branch.token < vocab:
            raise SettingsError(f"token id {branch.token} is not in the tokenizer's vocabulary (0..{vocab - 1})")

    def _intervene(self, branch: Branch) -> None:
        """A branch's one change, between step ``after_step`` and the next: the position forced to a
        token, or sent back to mask; a mask sent back before the current block would never decode."""
        state, p = self.state, branch.position
        if branch.token is None and p < state.block_start:
            block = (p - state.block_start) // state.block_size + state.block
            raise SettingsError(f"answer position {p - state.prompt_len} is in block {block}, finished before step "
                                f"{branch.after_step + 1}: re-mask a position of block {state.block} or later")
        branch.replaced = None if bool(state.masked[p]) else int(state.x[0, p])
        state.masks_left = None
        state.x[0, p] = self.handle.mask_id if branch.token is None else branch.token
        self._max_forwards += branch.token is None

    def _answer_complete(self, now: bool = True) -> bool:
        """Early stop: a stop token with no mask before it ends the answer; its masks become EOS.
        ``now``: at this step (block diffusion as SDAR and LLaDA2 release it: at a block's end)."""
        if not now:
            return False
        answer = self.state.x[0, self.state.prompt_len:]
        stops = torch.isin(answer, torch.tensor(self.handle.stop_ids, device=answer.device))
        if not bool(stops.any()):
            return False
        first = int(stops.nonzero()[0])
        if bool((answer[:first] == self.handle.mask_id).any()):
            return False
        answer[first:][answer[first:] == self.handle.mask_id] = self.handle.eos_id
        return True

    def _finish(self, stopped: bool = False) -> bool:
        window = self.state.window
        if window is not None and not stopped:  # past the first end-of-text: never decoded, end-of-text
            tail = self.state.x[0, window.length : window.answer_end]
            tail[tail == self.handle.mask_id] = self.handle.eos_id
        self.result = Result(self.recorder.finish(self.state, stopped))
        self.result.trace.branch = self.branch
        self.positions = self.read_positions = self.logits = None  # in a batch, views of the batch's logits
        return False


def stream(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None,
           branch: Branch | None = None) -> Run:
    """Start a generation; iterate the returned run for one step record per forward. ``branch``:
    the run repeated with one change after one of its steps (``trace.Branch``). A canvas model's
    run is canvas.py's, with the same interface."""
    return kinds.get(handle.kind).run_class()(handle, prompt, settings or Settings(), guider, branch)


def generate(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None,
             branch: Branch | None = None) -> Result:
    run = stream(handle, prompt, settings, guider, branch)
    try:
        for _ in run:
            pass
    finally:
        run.release()
    return run.result
