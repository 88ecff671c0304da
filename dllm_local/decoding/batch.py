"""Several requests decoded together: each keeps its own ``Run`` (positions, policies, seed,
trace, cache slot) and all of them share one forward per step, packed into one sequence (or, batch
mode ``invariant``, each its own forward, as alone, in the same loop)."""
from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Iterator, Literal

import torch
from pydantic import TypeAdapter

from ..errors import SettingsError
from ..limits import BATCH_MODE, BATCH_MODES, MAX_SLOTS
from ..models.attention import Segment
from ..models.cache import KVCache
from ..models.loading.loader import GuiderHandle, ModelHandle
from ..prompts import Prompt
from .quotas import FLOOR_SHARE, QuotaPool
from .sampler import Result, Run, generate
from ..settings import Settings
from ..trace import Branch, StepRecord
from ..values import integer, read

SLOTS = TypeAdapter(integer(1, MAX_SLOTS))  # requests decoding at once: a batch's slots
MODES = TypeAdapter(Literal[BATCH_MODES])  # type: ignore[valid-type] -- the tuple of limits.BATCH_MODES


class TooLong(SettingsError):
    """A request longer than the batch's slots."""


def _batchable(settings: Settings, attention: str | None) -> None:
    """``attention``: the backend a packed batch's requests share (one forward); None: any (invariant)."""
    if settings.exact_drift:
        raise SettingsError("exact_drift runs a second, uncached model per request: turn it off to decode a batch")
    if attention is not None and settings.attention_backend != attention:
        raise SettingsError(f"attention backend {settings.attention_backend}: a batch's requests share one packed "
                            f"forward, attended by {attention}; give them one attention backend")


class BatchRun:
    """Several requests decoded together, continuously: ``slots`` of them at a time (all, by
    default), one forward per step for the requests decoding, each with its own positions,
    policies, seed and trace, and its own slot of one ``KVCache``, so each request decodes as it
    would alone. A request that finishes frees its slot, and the next waiting request takes it at
    once: its first forward (prompt and answer, nothing cached yet) is packed into the same forward
    as the others' next steps. Later forwards no longer compute a finished request.

    With ``share_budget`` the adaptive caches' budgets become one budget shared by quotas (see
    ``QuotaPool``): the one thing that makes a request decode otherwise than alone, in exact
    arithmetic. On a GPU in bf16 the packed forward's kernels are chosen by its shape, which
    depends on who shares it, so a request's tokens may too. ``batch_mode="invariant"`` runs each
    request's step as its own forward, the very call it makes alone (its own cache of its own
    length; budgets never shared): its tokens are its tokens alone, on any hardware, at the cost of
    one forward per request a step instead of one for all (``bench/batch_invariance.py``).

    Iterate for ``(request, StepRecord)`` pairs; ``results`` then holds one result per prompt.
    ``finished(request)`` is called as each request ends (a progress bar). Between records a
    server may ``add`` requests (they wait for a slot, or go first) and ``stop`` one request;
    ``reserved`` slots more are for ``first`` ones only (a lecturer's), which never wait for another
    request to finish.
    """

    def __init__(self, handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings],
                 guider: GuiderHandle | None = None, share_budget: bool = True, slots: int | None = None,
                 finished: Callable[[int], None] | None = None, max_len: int | None = None,
                 batch_mode: str = BATCH_MODE, reserved: int = 0) -> None:
        """``settings``: one for every request, or one per request (an evaluation's own seeds);
        ``max_len``: the positions each slot holds (default: the longest of ``prompts``' runs),
        what a request added later may take at most. A server's batch may start with no prompts
        and a ``max_len``, and ``add`` them as they come."""
        if not isinstance(prompts, (list, tuple)) or not (prompts or max_len):
            raise SettingsError("a batch needs a list of at least one prompt")
        handle.require_masked("batched decoding")
        if not handle.model.packs_requests:
            raise SettingsError(f"{type(handle.model).__name__} decodes one request at a time: batched decoding "
                                f"runs LLaDA-family models (LLaDA and the tiny model)")
        per_request = list(settings) if isinstance(settings, (list, tuple)) else [settings] * len(prompts)
        if len(per_request) != len(prompts):
            raise SettingsError(f"{len(per_request)} settings for {len(prompts)} prompts: give one, or one per prompt")
        self.batch_mode = read(MODES, batch_mode, "the batch mode")
        self.invariant = self.batch_mode == "invariant"
        for s in per_request:
            _batchable(s, None if self.invariant else per_request[0].attention_backend)
        self.slots = read(SLOTS, len(prompts) if slots is None else slots, "the batch size (slots)")
        self.reserved, self.firsts = reserved, set[int]()  # the requests added ``first``
        self.handle, self.guider, self.finished = handle, guider, finished
        self.share_budget = share_budget and not self.invariant
        self.runs = [Run(handle, prompt, s, guider) for prompt, s in zip(prompts, per_request)]
        self.max_len = max_len or max(run.state_length for run in self.runs)
        self.waiting: deque[int] = deque(range(len(self.runs)))
        self.holding: set[int] = set()  # the requests holding a slot now
        self.results: list[Result] | None = None
        self.cache: KVCache | None = None
        self.pool: QuotaPool | None = None
        # What the batch did: forwards, rows computed, model and wall time, each request's latency.
        self.forwards = self.row_forwards = 0
        self.model_s, self.wall_s, self.latency_s = 0.0, 0.0, [0.0] * len(prompts)

    def add(self, prompt: Prompt, settings: Settings, first: bool = False, branch: Branch | None = None) -> int:
        """A request joining the batch: it takes the next free slot (before the waiting ones if
        ``first``: a lecturer's). ``branch``: a run repeated with one change (``trace.Branch``).
        Returns its number."""
        shared = None if self.invariant else (self.runs[0].settings if self.runs else settings).attention_backend
        _batchable(settings, shared)
        run = Run(self.handle, prompt, settings, self.guider, branch)
        if run.state_length > self.max_len:
            raise TooLong(f"this request needs {run.state_length} positions; the batch's slots hold "
                                f"{self.max_len}: a shorter prompt or gen_length")
        self.runs.append(run)
        self.latency_s.append(0.0)
        number = len(self.runs) - 1
        self.firsts.update([number] if first else [])
        (self.waiting.appendleft if first else self.waiting.append)(number)
        return number

    def withdraw(self, request: int) -> bool:
        """Take a request still waiting for a slot out of line (it never runs); False if it started."""
        if request not in self.waiting:
            return False
        self.waiting.remove(request)
        return True

    def stop(self, request: int | None = None) -> None:
        """End one request (its result says it was stopped) or, by default, all of them."""
        for run in self.runs if request is None else [self.runs[request]]:
            run.stop()

    def release(self) -> None:
        """Drop the batch's cache (every request's K/V); results and traces stay."""
        self.cache = None
        for run in self.runs:
            run.release()

    def __iter__(self) -> Iterator[tuple[int, StepRecord]]:
        self._start_s = time.perf_counter()
        self._paused = 0.0
        try:
            with torch.inference_mode():
                self._start()
            active: list[int] = []  # request numbers decoding, in the order they joined
            while True:
                with torch.inference_mode():
                    active = [i for i in active if self._going(i)]
                    active += self._admit()
                    if not active:
                        break
                    records = self._step(active)
                for i, record in records:
                    t = time.perf_counter()
                    yield i, record
                    held = time.perf_counter() - t  # the consumer's time: no request's
                    self._paused += held
                    for j in active:
                        self.runs[j].recorder.pause(held)
        except BaseException:
            self.release()  # a failed batch lets go of its cache at once
            raise
        self.wall_s = time.perf_counter() - self._start_s - self._paused
        self.results = [run.result for run in self.runs]
        self.release()

    @property
    def free_slots(self) -> int:
        """The waiting requests the next forward admits, in line: a ``first`` one while any slot
        is free (a reserved one too), the others while fewer than ``slots`` of them hold one."""
        held, others, admits = len(self.holding), len(self.holding - self.firsts), 0
        for i in self.waiting:
            if held >= self.slots + self.reserved or (i not in self.firsts and others >= self.slots):
                break
            held, others, admits = held + 1, others + (i not in self.firsts), admits + 1
        return admits

    def _start(self) -> None:
        # Invariant: no shared cache; each request takes its own, as alone (Run.start).
        self.cache = None if self.invariant else self.handle.model.new_cache(self.slots + self.reserved, self.max_len)
        self._budgets, self._floors = dict[int, int](), dict[int, int]()

    def _admit(self) -> list[int]:
        """The waiting requests that free slots take, started: each one's first step is planned
        in the next forward, beside the others'."""
        admitted = []
        while self.waiting and self.free_slots:
            i = self.waiting.popleft()
            run = self.runs[i]
            run.start(None if self.cache is None else self.cache.alloc(run.state_length))
            self.holding.add(i)
            if budget := run.cache_policy.max_cached():
                self._budgets[i] = budget
                self._floors[i] = min(budget, math.ceil(FLOOR_SHARE * run.state_length))
            admitted += [i] if self._going(i) else []
        if self.share_budget and self._budgets and admitted:
            # The budget of the slots' requests: each slot's largest own budget, as in a static batch.
            self.pool = QuotaPool(sum(sorted(self._budgets.values(), reverse=True)[: self.slots + self.reserved]))
        return admitted

    def _going(self, i: int) -> bool:
        """Whether request ``i`` decodes another step; if not, its slot is freed and its latency kept."""
        if self.runs[i].next_step():
            return True
        self.latency_s[i] = time.perf_counter() - self._start_s - self._paused
        if self.cache is None:
            self.runs[i].release()  # its own cache, back to the runner's pool
        else:
            self.cache.free(self.runs[i].cache)
        self.holding.discard(i)
        self._budgets.pop(i, None)
        self._floors.pop(i, None)
        if self.finished is not None:
            self.finished(i)
        return False

    def _step(self, active: list[int]) -> list[tuple[int, StepRecord]]:
        """One step of the ``active`` requests: their planned positions' forward (packed, or each
        its own), then each takes its rows."""
        runs = self.runs
        planned = [runs[i].plan() for i in active]
        if self.invariant:  # each its own forward, the call it makes alone: shapes of its own only
            forwards = [runs[i].forward(p) for i, p in zip(active, planned)]
            logits = [forward.logits[0] for forward in forwards]
            self.forwards += len(active)
            self.model_s += sum(forward.seconds for forward in forwards)
        else:
            logits = self._packed(active, planned)
        self.row_forwards += len(active)
        if self.pool is not None:  # quotas from what each holds now, before anyone evicts
            holding = {i: runs[i].cache.num_cached() for i in active if i in self._budgets}
            for i, quota in self.pool.allocate(holding, self._floors).items():
                runs[i].cache_policy.set_quota(quota)
        records = []
        for row, i in enumerate(active):
            runs[i].recorder.in_batch(len(active), self.batch_mode, runs[active[0]].runner)
            records.append((i, runs[i].after_forward(logits[row])))
        return records

    def _packed(self, active: list[int], planned: list[torch.Tensor]) -> list[torch.Tensor]:
        """One forward for every active request's planned positions, packed; each request's logits."""
        runs = self.runs
        # Each request attends under its own run's layout (a block-diffusion run's block size, which
        # requests of one batch may set apart): the segment carries it, Attention masks each row by its own.
        segments = [Segment(runs[i].cache, p, runs[i].observers, runs[i].layout) for i, p in zip(active, planned)]
        counts = [len(p) for p in planned]
        positions = torch.cat(planned)
        ids = torch.cat([runs[i].state.x[0, p] for i, p in zip(active, planned)])[None]
        forward = runs[active[0]].runner.packed(ids, positions, segments)
        self.forwards += 1
        self.model_s += forward.seconds
        for i, count in zip(active, counts):
            runs[i].recorder.count_forward(forward.seconds, count / len(positions))
        return list(forward.logits[0].split(counts))


def stream_batch(handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings] | None = None,
                 guider: GuiderHandle | None = None) -> BatchRun:
    """Start decoding ``prompts`` together; iterate for ``(request, StepRecord)`` pairs."""
    return BatchRun(handle, prompts, Settings() if settings is None else settings, guider)


def generate_batch(handle: ModelHandle, prompts: list[Prompt], settings: Settings | list[Settings] | None = None,
                   guider: GuiderHandle | None = None, share_budget: bool = True) -> list[Result]:
    """One result (and trace) per prompt, decoded as a batch: the same tokens as each alone
    (unless adaptive caches share their budgets, see ``BatchRun``)."""
    run = BatchRun(handle, prompts, Settings() if settings is None else settings, guider, share_budget)
    deque(run, maxlen=0)  # decoded to its end
    return run.results


def batches(count: int, batch_size: int, continuous: bool = True) -> list[range]:
    """The requests each BatchRun of ``batch_size`` slots decodes: all of them continuously, or
    static batches of ``batch_size`` one after another."""
    return [range(count)] if continuous else [range(first, min(first + batch_size, count))
                                              for first in range(0, count, batch_size)]


def generate_all(handle: ModelHandle, prompts: list[Prompt], settings: list[Settings], guider: GuiderHandle | None = None,
                 batch_size: int = 1, done: Callable[[int], None] | None = None,
                 continuous: bool = True, batch_mode: str = BATCH_MODE) -> list[Result]:
    """One result per prompt (each with its own settings), decoded ``batch_size`` at a time:
    continuously (a finished request's slot taken at once by the next prompt), or, with
    ``continuous=False``, in static batches that shrink as their requests finish. ``done(k)`` is
    called as ``k`` more requests finish (a progress bar). Budgets are not shared: an evaluation's
    answers must not depend on its batch size (nor, ``batch_mode="invariant"``, on the GPU's
    kernels for each batch's shape: see ``BatchRun``)."""
    batch_size = read(SLOTS, batch_size, "batch_size")
    if batch_size == 1:
        results = []
        for prompt, s in zip(prompts, settings):
            results.append(generate(handle, prompt, s, guider))
            if done is not None:
                done(1)
        return results
    finished, results = ((lambda _: done(1)) if done is not None else None), []
    for chunk in batches(len(prompts), batch_size, continuous):
        run = BatchRun(handle, [prompts[i] for i in chunk], [settings[i] for i in chunk], guider, share_budget=False,
                       slots=min(batch_size, len(chunk)), finished=finished, batch_mode=batch_mode)
        deque(run, maxlen=0)
        results += run.results
    return results
