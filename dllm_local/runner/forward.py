"""``ForwardRunner``: the one way a loaded model's forwards run (see the package's docstring)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch._dynamo.exc import BackendCompilerFailed

from ..models.attention import AttentionLayout, ForwardObserver, Segment
from ..models.attention_backends import DEFAULT, get as get_backend
from ..models.cache import CacheFork, CacheView, KVCache
from ..models.protocol import DiffusionLM
from .buckets import bucket, pad
from .modes import compile_forward, graph_skips, resolve_mode
from .timing import model_gpus, timed

# A session meets a few cache lengths times a few buckets; past dynamo's default of 8 graphs per
# function it would stop compiling and run eagerly without a word.
RECOMPILE_LIMIT = 64
POOLED = 2  # idle caches kept for reuse: a CUDA graph replays on the addresses it was captured with


@dataclass
class Forward:
    logits: torch.Tensor  # [rows, n, vocab] at the positions asked for (padding cut off)
    seconds: float  # device-synchronised


class ForwardRunner:
    """The forwards of one model in one mode (``modes.py``), attended by one attention backend
    (``attention``, a name in ``models.attention_backends``). ``pads``: whether one request's
    forwards are padded to buckets (``buckets.py``; default: in a compiled mode, where each new
    length is a compile or a CUDA graph capture).
    ``shapes``: every (kind, rows, length) run so far; ``notice``: why the mode asked for did not run
    as asked (None while it does); ``mode``: the mode running now."""

    def __init__(self, model: DiffusionLM, mode: str = "auto", backend: str | Callable | None = None,
                 pads: bool | None = None, attention: str = DEFAULT) -> None:
        get_backend(attention)  # an unknown name fails here, not at the first forward
        self.model, self.attention = model, attention
        self.asked = mode
        self.mode = resolve_mode(mode, model.get_input_embeddings().weight.device)
        self.pads = self.mode != "eager" if pads is None else pads
        self.gpus = model_gpus(model)
        self.notice: str | None = None
        self.shapes: set[tuple[str, int, int]] = set()
        self._compiled = self._compiled_packed = None
        if self.mode != "eager":
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            self._compiled = compile_forward(self._eager, self.mode, backend)
            self._compiled_packed = compile_forward(self._eager_packed, self.mode, backend)
        self._static: weakref.WeakSet[KVCache] = weakref.WeakSet()
        self._pool: list[KVCache] = []  # most recently used last

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        """A KV cache for a run: the last one of this shape when every slot of it was freed (a graph
        captured over it replays as it is, without a new capture), else a new one. The pool keeps
        every cache in use (an invariant batch's requests each hold one) and the last ``POOLED`` idle."""
        for store in reversed(self._pool):
            if store.slots == slots and store.max_len == max_len and store.in_use == 0:
                self._pool.remove(store)
                self._pool.append(store)
                return store
        store = self.model.new_cache(slots, max_len)
        idle = [kept for kept in self._pool if kept.in_use == 0]
        dropped = {id(kept) for kept in idle[: max(0, len(idle) - POOLED + 1)]}
        self._pool = [kept for kept in self._pool if id(kept) not in dropped] + [store]
        return store

    def _eager(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: CacheView | CacheFork | None,
               observers: tuple[ForwardObserver, ...], sequence: torch.Tensor | None,
               layout: AttentionLayout | None, read: torch.Tensor | None) -> torch.Tensor:
        return self.model(input_ids, positions, cache, observers=observers, sequence=sequence, layout=layout,
                          read=read, attention_backend=self.attention).logits

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: CacheView | CacheFork | None = None,
                 observers: Sequence[ForwardObserver] = (), sequence: torch.Tensor | None = None,
                 layout: AttentionLayout | None = None, read: torch.Tensor | None = None) -> Forward:
        """One request's forward: ``input_ids`` ``[rows, n]`` at ``positions`` ``[n]`` (sorted) over
        ``cache`` (or none: a full forward), watched by ``observers``. ``read``: the indices into
        ``positions`` whose logits are wanted (a model that ``packs_requests`` computes its head
        on those rows alone); None: every position's."""
        n = positions.numel()
        # A shifted head (Dream) reads each position's predecessor, which a padding row would turn
        # into a real position: those models run their lengths as they are.
        padded = self.pads and cache is not None and self.model.packs_requests
        if padded:
            view = cache.parent if isinstance(cache, CacheFork) else cache
            length = bucket(n, view.seq_len)
            padded = length > n
            if padded:
                input_ids, positions, cache = pad(input_ids, positions, cache, length)
        self.shapes.add((type(cache).__name__, input_ids.shape[0], input_ids.shape[1]))
        args = (input_ids, positions, cache, tuple(observers), sequence, layout, read)
        logits, seconds = timed(lambda: self._run_one(*args), self.gpus)
        if padded:
            logits = logits if read is not None else logits[:, :n]
            for observer in observers:
                observer.on_end(n)
        return Forward(logits, seconds)

    def _eager_packed(self, input_ids: torch.Tensor, positions: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        return self.model(input_ids, positions, segments=segments, attention_backend=self.attention).logits

    def packed(self, input_ids: torch.Tensor, positions: torch.Tensor, segments: list[Segment]) -> Forward:
        """Several requests' positions in one row (a batch's step), in the runner's mode: a
        compiled mode compiles (or captures) one graph per number of requests and, once a second
        length has come, one generic in the length."""
        self.shapes.add(("packed", len(segments), input_ids.shape[1]))
        store = segments[0].cache.store
        logits, seconds = timed(lambda: self._run(self._compiled_packed, self._eager_packed, store,
                                                  input_ids, positions, segments), self.gpus)
        return Forward(logits, seconds)

    def _run_one(self, *args) -> torch.Tensor:
        cache = args[2]
        store = None if cache is None else cache.parent.store if isinstance(cache, CacheFork) else cache.store
        return self._run(self._compiled, self._eager, store, *args)

    def _run(self, compiled: Callable | None, eager: Callable, store: KVCache | None, *args) -> torch.Tensor:
        if compiled is None or self.mode == "eager":
            return eager(*args)
        if self.mode == "graphs" and store is not None:
            self._mark_static(store)
        skips = graph_skips()
        try:
            logits = compiled(*args)
        except Exception as error:  # noqa: BLE001 -- any failure to compile: eager, and say why
            self._fall_back(f"{self.mode} forward failed ({_root_cause(error)}); running eager")
            return eager(*args)
        if self.mode == "graphs" and graph_skips() > skips and self.notice is None:
            self.notice = "CUDA graphs were skipped for a forward (see torch's log): it ran compiled without them"
        return logits

    def _fall_back(self, notice: str) -> None:
        self.notice, self.mode, self._compiled, self._compiled_packed = notice, "eager", None, None

    def _mark_static(self, store: KVCache) -> None:
        """A graph writes the cache in place: its tensors keep their addresses, so the graph is told."""
        if store in self._static:
            return
        for tensor in (*store.k, *store.v, store.valid):
            torch._dynamo.mark_static_address(tensor)
        self._static.add(store)


def _root_cause(error: BaseException) -> str:
    """The innermost cause of a compiler's error (dynamo wraps the backend's), in one short line."""
    while isinstance(error, BackendCompilerFailed) or error.__cause__ is not None:
        error = error.inner_exception if isinstance(error, BackendCompilerFailed) else error.__cause__
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:200]}"


_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner_for(model: DiffusionLM, mode: str = "eager", backend: str | Callable | None = None,
               attention: str = DEFAULT) -> ForwardRunner:
    """The runner of ``model`` in ``mode`` with the ``attention`` backend, kept with the model (a
    compiled mode's graphs are built once and reused by every run after). ``backend``: the
    compiler's, where the first call for a mode names one (tests: ``aot_eager``, or a callable that
    counts the graphs)."""
    runners = _RUNNERS.setdefault(model, {})
    if (mode, attention) not in runners:
        runners[mode, attention] = ForwardRunner(model, mode, backend, attention=attention)
    return runners[mode, attention]
