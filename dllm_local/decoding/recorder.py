"""Everything about a run that is not the algorithm: time, counts, the trace and its diagnostics.

The sampler makes the model calls, times them (``timed``) and counts them here
(``count_forward``, ``count_guider_forward``); once per step it hands over one ``Step``. The
recorder keeps the counters, builds the step record at the trace level asked for, runs the
exact-drift diagnostic beside the main forward, and computes the final stats. Time the consumer
of the records spends between two steps (``pause``) is never the run's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..models.attention import AttentionLayout, ForwardObserver
from ..models.cache import CacheView
from ..models.loading.loader import ModelHandle
from ..models.observers import DriftMeter, ExpertsRouted, ForwardCounter, position_cosine
from ..policies.base import DecodeState
from ..runner import ForwardRunner, runner_for
from ..policies.unmask import Candidates, Selection
from ..settings import Settings
from ..softmax import draft_probability
from ..trace import StepRecord, Trace


def _round(values, digits: int = 5) -> list:
    return [None if (v != v) else round(float(v), digits) for v in values]


@dataclass
class Step:
    """One step as the sampler hands it over: where it was taken, whether the cache policy
    refreshed everything, the block's drafts and what the unmasking policy did with them."""

    state: DecodeState  # before the step counter moves on
    full_refresh: bool
    candidates: Candidates
    selection: Selection
    masked_positions: torch.Tensor | None  # every still-masked position the forward scored (``reads_masked``)
    masked_logits: torch.Tensor | None  # their logits, the banned ids at -inf
    policy_info: dict  # the cache policy's own report


class Recorder:
    def __init__(self, handle: ModelHandle, settings: Settings, prompt_ids: list[int], cache: CacheView,
                 banned: torch.Tensor, answer_length: int, layout: AttentionLayout | None = None,
                 blocks_from: int | None = None, runner: ForwardRunner | None = None) -> None:
        """``answer_length``: the answer region's positions; ``layout``: the run's forwards' when
        not the model's own (the exact diagnostic's full forward attends as they do);
        ``blocks_from``: where block 0 starts when blocks sit at absolute positions."""
        self.handle, self.settings, self.level = handle, settings, settings.trace
        self.answer_length, self.layout = answer_length, layout
        self.banned = banned  # ids no draft may be: the exact diagnostic renormalises as the drafts do
        self.runner = runner if runner is not None else runner_for(handle.model, settings.forward_mode,
                                                                   attention=settings.attention_backend)
        self.gpus = self.runner.gpus
        self.trace = Trace(settings=settings.to_dict(), model=handle.summary(), prompt_ids=list(prompt_ids),
                           gen_length=answer_length, mask_id=handle.mask_id, blocks_from=blocks_from)
        layers = handle.model.config.num_hidden_layers
        self.counter = ForwardCounter()
        self.experts = ExpertsRouted(handle.experts[0]) if handle.experts and self.level != "off" else None
        self._stored: list[int] | None = None
        self._handed: list[list] = []
        self.drift = DriftMeter(layers) if self.level != "off" else None
        self.shadow = None
        if settings.exact_drift:  # a second cache, fully recomputed each step: the truth to compare with
            self.shadow = handle.model.new_cache(1, cache.seq_len).alloc(cache.seq_len)
            self.shadow_drift = DriftMeter(layers)
        self.reads_masked = self.level != "off"  # the step record lists every masked position scored
        self._committed = self._g = self._reads = self._main_forwards = 0
        self._t0 = self._t_step = time.perf_counter()
        self._paused = 0.0
        self._new_step()

    @property
    def observers(self) -> tuple[ForwardObserver, ...]:
        """What the recorder watches the run's forwards with: counts, and drift with a trace."""
        return tuple(o for o in (self.counter, self.drift, self.experts) if o is not None)

    def in_batch(self, size: int, mode: str, runner: ForwardRunner) -> None:
        """A step of this run decoded in a batch of ``size`` requests, ``mode`` "packed" (one forward
        for them all, run by the batch's ``runner``, whose mode the trace reports; its time theirs
        together: the trace keeps the most that ever shared one) or "invariant" (the run's own
        forward, as alone)."""
        self.trace.stats.batch_mode = mode
        if mode == "packed":
            self.trace.stats.batch_size = max(self.trace.stats.batch_size, size)
            self.runner = runner

    def _new_step(self) -> None:
        self._model_s = self._exact_s = 0.0
        self._forwards = self._guider_forwards = 0
        self._exact: dict | None = None

    # ---------------------------------------------------------------- model calls
    def count_forward(self, seconds: float, share: float = 1.0) -> None:
        """A forward of this step took ``seconds``. In a batch that is the whole batch's forward
        (what this request waited for), of which ``share`` was this request's positions."""
        self._model_s += seconds
        self._forwards += 1
        self.trace.stats.model_share_s += seconds * share

    def count_store(self, positions: torch.Tensor, seconds: float, committed: list | None = None) -> None:
        """A forward that wrote ``positions``' K/V (block diffusion's prefill, a finished block's
        store) took ``seconds``: model time, counted apart from the denoising forwards; the next
        step record names the span, and lists first among its commits the one this forward made
        (``committed``: a shifted head's next position), if any."""
        st = self.trace.stats
        st.store_forwards += 1
        st.store_s += seconds
        st.model_s += seconds
        st.model_share_s += seconds
        first, last = positions[[0, -1]].tolist()
        self._stored = [first, last + 1]
        self._handed = [committed] if committed else []

    def count_guider_forward(self, seconds: float) -> None:
        """A forward of the guider took ``seconds``: in the step's model time, counted apart from
        the diffusion model's forwards (NFE)."""
        self._model_s += seconds
        self._guider_forwards += 1
        self.trace.stats.model_share_s += seconds
        self.trace.stats.guider_forwards += 1

    def exact_forward(self, x: torch.Tensor, cache: CacheView) -> None:
        """With ``exact_drift``, a full uncached forward of the same sequence beside the step's:
        the true KV drift and the error the cache made."""
        if self.shadow is None:
            return
        t = time.perf_counter()
        self.trace.stats.exact_forwards += 1
        everything = torch.arange(x.shape[1], device=x.device)
        logits = self.runner(x, everything, self.shadow, (self.shadow_drift,), layout=self.layout).logits[0]
        shown = len(self.trace.prompt_ids) + self.answer_length  # not a cache policy's padding
        cache_error = {}
        # Block diffusion: a later block's entry, which the cache has not held yet, has no error: null.
        held = cache.valid[:shown] if self.layout is not None else torch.ones_like(cache.valid[:shown])
        for layer in range(len(cache.k)):
            ck = position_cosine(cache.k[layer][:, :, :shown], self.shadow.k[layer][:, :, :shown])
            cv = position_cosine(cache.v[layer][:, :, :shown], self.shadow.v[layer][:, :, :shown])
            nothing = torch.tensor(float("nan"), device=ck.device)
            ck, cv = (torch.where(held.to(c.device), c, nothing) for c in (ck, cv))
            cache_error[str(layer)] = {"k": _round(ck.tolist()), "v": _round(cv.tolist())}
        drift_k, drift_v = (cosines[:, :shown] for cosines in self.shadow_drift.cosines())
        true_drift = {str(layer): {"k": _round(k), "v": _round(v)}
                      for layer, (k, v) in enumerate(zip(drift_k.tolist(), drift_v.tolist()))}
        self._exact = {"logits": logits, "true_drift": true_drift, "cache_vs_exact": cache_error}
        self._exact_s += time.perf_counter() - t

    # ---------------------------------------------------------------- the step record
    def step(self, step: Step) -> StepRecord:
        state, cand, selection = step.state, step.candidates, step.selection
        if selection.among is None:
            index = torch.searchsorted(cand.positions, selection.positions)
            columns = [selection.positions, cand.tokens[index], cand.confidence[index]]
        else:  # every candidate and whether it was committed, sorted out after the read-back
            columns = [cand.positions, cand.tokens, cand.confidence, selection.among]
        # One read-back (float64 holds the ids exactly): the forward's reads, the block's masks left,
        # the commits, and a policy's report of device tensors (positions), each cut out after it.
        policy = {**selection.info, **step.policy_info}
        reported = {key: value for key, value in policy.items() if isinstance(value, torch.Tensor)}
        device = cand.positions.device
        parts = [torch.as_tensor(self.counter.reads, device=device).reshape(1),
                 state.masked[state.block_start : state.block_end].sum().reshape(1),
                 torch.stack([c.double() for c in columns], 1).flatten(), *(t.flatten().to(device) for t in reported.values())]
        numbers, pieces = torch.cat([part.double() for part in parts]).tolist(), []
        for part in parts:
            pieces.append(numbers[: part.numel()])
            numbers = numbers[part.numel() :]
        (reads,), (masks_left,), commits, *reports = pieces
        for (key, value), piece in zip(reported.items(), reports):
            policy[key] = piece if value.is_floating_point() else [int(v) for v in piece]
        rows = zip(*[iter(commits)] * len(columns))
        committed = self._handed + [[int(r[0]), int(r[1]), round(r[2], 6)] for r in rows if len(r) == 3 or r[3]]
        state.masks_left = int(masks_left)
        record = StepRecord(
            step=state.step, block=state.block, step_in_block=state.step_in_block, full_refresh=step.full_refresh,
            g=self.counter.recomputed, reads=int(reads), committed=committed, forwards=self._forwards,
            guider_forwards=self._guider_forwards,
            model_ms=round(self._model_s * 1e3, 4), other_ms=0.0, exact_ms=round(self._exact_s * 1e3, 4),
            exact=self._exact_record(cand) if self._exact is not None else None,
            policy=policy, revoked=selection.revoked, stored=self._stored,
            edited=selection.edits or None,
        )
        self._stored, self._handed = None, []
        if self.level != "off":
            record.masked_positions = step.masked_positions.tolist()
            # Confidence (max softmax probability) of every still-masked position this forward scored.
            logits = step.masked_logits.float()
            best = (logits.amax(-1) - logits.logsumexp(-1)).exp()  # the top softmax probability, one exp per row
            record.masked_confidence = (torch.round(best * 1e6) / 1e6).tolist()
            # A cache policy's end-of-text padding past the answer is computed too; the trace shows the sequence.
            shown = self.counter.positions < len(self.trace.prompt_ids) + self.answer_length
            record.kv = self._kv_record(shown)
            record.experts = self.experts.routed() if self.experts is not None else None
            if self.level == "full":
                record.recomputed = self.counter.positions[shown].tolist()
                record.top_candidates = _top_candidates(cand.positions, step.masked_positions, logits)
            self.trace.steps.append(record)
        self._count(record)
        now = time.perf_counter()
        record.other_ms = round(max(0.0, now - self._t_step - self._model_s - self._exact_s) * 1e3, 4)
        self.trace.stats.other_s += record.other_ms / 1e3
        self._t_step = now
        self._new_step()
        return record

    def pause(self, seconds: float) -> None:
        """The consumer held the run for ``seconds`` (reading its record, or in a batch another
        request's): not the run's time."""
        self._paused += seconds
        self._t_step += seconds

    def _count(self, record: StepRecord) -> None:
        st = self.trace.stats
        st.nfe += record.forwards
        st.model_s += record.model_ms / 1e3
        if record.step == 0:
            st.prefill_s += record.model_ms / 1e3
        elif record.full_refresh:
            st.refresh_s += record.model_ms / 1e3
        st.exact_s += record.exact_ms / 1e3
        self._committed += len(record.committed) - len(record.revoked)
        st.revisions += len(record.revoked)
        self._g += record.g
        self._reads += record.reads
        self._main_forwards += 1

    def _kv_record(self, shown: torch.Tensor) -> dict:
        if self.level == "full":
            ks, vs = (cosines[:, shown].tolist() for cosines in self.drift.cosines())  # [layers, n]
            return {str(layer): {"k": _round(ks[layer]), "v": _round(vs[layer])} for layer in range(len(ks))}
        summary = self.drift.summary(shown)
        names = ("k_mean", "k_min", "v_mean", "v_min")
        return {str(layer): {name: None if value != value else round(value, 6) for name, value in zip(names, row)}
                for layer, row in enumerate(summary.tolist())}

    # ---------------------------------------------------------------- exact-drift diagnostic
    def _exact_record(self, cand: Candidates) -> dict:
        t = time.perf_counter()
        exact_logits = self._exact["logits"][cand.positions].index_fill(-1, self.banned, float("-inf"))
        err = (draft_probability(exact_logits, cand.tokens) - cand.confidence).abs()
        greedy = self.settings.temperature == 0
        record = {
            "max_prob_error": round(float(err.max()), 6) if err.numel() else 0.0,
            "argmax_agree": bool((exact_logits.argmax(-1) == cand.tokens).all()) if greedy else None,
            "true_drift": self._exact["true_drift"], "cache_vs_exact": self._exact["cache_vs_exact"],
        }
        self._exact_s += time.perf_counter() - t
        return record

    # ---------------------------------------------------------------- the end
    def finish(self, state: DecodeState, stopped: bool) -> Trace:
        h, trace, st = self.handle, self.trace, self.trace.stats
        st.stopped = stopped
        answer = state.x[0, state.prompt_len : state.prompt_len + state.gen_length].tolist()
        trace.final_ids = answer
        cut = next((i for i, t in enumerate(answer) if t in h.stop_ids or t == h.mask_id), len(answer))
        trace.text = h.tokenizer.decode(answer[:cut], skip_special_tokens=True)
        ids = set(answer) | set(trace.prompt_ids) | {h.mask_id}
        ids |= {token for s in trace.steps for _, top in s.top_candidates for token, _ in top}
        ids |= {token for s in trace.steps for _, token, _ in s.policy.get("rejected_at", [])}
        trace.vocab = {str(i): h.tokenizer.decode([i]) for i in sorted(ids)}
        st.gen_length = self.answer_length
        st.content_tokens = cut
        forwards = max(1, st.nfe)
        # Tokens the forwards committed (not EOS filled in by an early stop, nor masks left by Stop).
        committed = self._committed
        content = min(cut, committed)
        st.tokens_per_forward = round(committed / forwards, 4)
        st.content_tokens_per_forward = round(content / forwards, 4)
        st.mean_g = round(self._g / max(1, self._main_forwards), 2)
        st.cache_hit_rate = round(self._reads / max(1, self._g + self._reads), 4)
        st.wall_s = time.perf_counter() - self._t0 - self._paused
        st.forward_mode, st.forward_notice = self.runner.mode, self.runner.notice or ""
        st.attention_backend = self.runner.attention
        st.tokens_per_s = round(committed / st.model_s, 2) if st.model_s else 0.0
        st.content_tokens_per_s = round(content / st.model_s, 2) if st.model_s else 0.0
        return trace


TOP_CANDIDATES = 3


def _top_candidates(block_positions: torch.Tensor, masked_positions: torch.Tensor, logits: torch.Tensor) -> list[list]:
    """[position, [[token, probability], ...]] for the block's masked positions: the likeliest
    tokens before any sampling, so a viewer can see why a pair of commits did not fit together."""
    rows = torch.isin(masked_positions, block_positions)
    if not rows.any():
        return []
    probs, tokens = F.softmax(logits[rows], dim=-1).topk(min(TOP_CANDIDATES, logits.shape[-1]), dim=-1)
    return [[p, [[t, round(q, 4)] for t, q in zip(ts, qs)]]
            for p, ts, qs in zip(masked_positions[rows].tolist(), tokens.tolist(), probs.tolist())]
