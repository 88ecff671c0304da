"""The decoding loop: ask the cache policy what to recompute, run the model, ask the unmasking
policy what to commit, record the step. One step record per model forward, yielded as it happens.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from .errors import SequenceTooLongError, SettingsError
from .loader import GuiderHandle, ModelHandle
from .models.cache import position_cosine
from .policies import CACHE_POLICIES, UNMASK_POLICIES
from .policies.base import DecodeState
from .policies.unmask import Candidates
from .settings import Settings
from .trace import StepRecord, Trace

Prompt = str | list[dict]


@dataclass
class Result:
    text: str
    token_ids: list[int]  # the whole answer region, EOS padding included
    trace: Trace

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


def _sync(device: torch.device) -> None:
    # Every GPU: a model spread over several by device_map finishes on the last one.
    if device.type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def _round(values, digits: int = 5) -> list:
    return [None if (v != v) else round(float(v), digits) for v in values]


class Run:
    """One generation in progress: iterate for step records; ``stop()`` ends it between steps."""

    def __init__(self, handle: ModelHandle, prompt: Prompt, settings: Settings, guider: GuiderHandle | None = None):
        self.handle, self.settings, self.guider = handle, settings, guider
        self.cache_policy = CACHE_POLICIES[settings.cache].from_params(settings.cache_params)
        self.unmask_policy = UNMASK_POLICIES[settings.unmask].from_params(settings.unmask_params)
        if self.unmask_policy.needs_guider:
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
        self.cache = self._guider_cache = None

    def __iter__(self) -> Iterator[StepRecord]:
        return self._decode()

    @torch.inference_mode()
    def _setup(self) -> tuple:
        """Sequence, state, caches and trace for a new generation."""
        s, h = self.settings, self.handle
        device = h.device
        P, L = len(self.prompt_ids), len(self.prompt_ids) + s.gen_length
        x = torch.full((1, L), h.mask_id, dtype=torch.long, device=device)
        x[0, :P] = torch.tensor(self.prompt_ids, device=device)
        steps_per_block = (s.steps // s.num_blocks) if s.steps else s.block_size
        state = DecodeState(x, P, s.gen_length, s.block_size, h.mask_id, steps_per_block)
        cache = h.model.new_cache(1, L)
        cache.seq_len = L
        self.cache = cache
        self.cache_policy.reset(state, cache, h.model)
        self.gen = torch.Generator(device=device).manual_seed(s.seed)
        self.trace = Trace(settings=s.to_dict(), model=h.summary(), prompt_ids=list(self.prompt_ids),
                                   gen_length=s.gen_length, mask_id=h.mask_id)
        self._guider_cache = None
        self._guider_tokens: list[int] = []
        self._g_total = self._reads_total = self._main_forwards = self._committed_total = 0
        self._extra_forwards, self._extra_model_s = 0, 0.0
        shadow = h.model.new_cache(1, L) if s.exact_drift else None
        if shadow is not None:
            shadow.seq_len = L
        return state, shadow

    # ---------------------------------------------------------------- the loop
    def _decode(self) -> Iterator[StepRecord]:
        wall0 = time.perf_counter()
        s = self.settings
        state, shadow = self._setup()
        trace = self.trace
        finished = False
        paused = 0.0
        for block in range(s.num_blocks):
            state.block, state.step_in_block = block, 0
            self.unmask_policy.start_block(state)
            while not finished and bool(state.block_masked_positions().numel()):
                if self._stop.is_set():
                    trace.stats.stopped = True
                    finished = True
                    break
                with torch.inference_mode():  # per step: never left on while the consumer runs
                    record = self._step(state, shadow)
                if s.trace != "off":
                    trace.steps.append(record)
                self._count(record)
                # Time spent suspended here belongs to whoever consumes the records, not to the run.
                t_yield = time.perf_counter()
                yield record
                paused += time.perf_counter() - t_yield
                state.step += 1
                state.step_in_block += 1
                with torch.inference_mode():
                    finished = s.early_stop and self._early_stop(state)
            if finished:
                break
        self._finish(state, time.perf_counter() - wall0 - paused)

    def _step(self, state: DecodeState, shadow) -> StepRecord:
        s, h, cache = self.settings, self.handle, self.cache
        t_start = time.perf_counter()
        plan = self.cache_policy.plan(state, cache)
        block_masked = state.block_masked_positions()
        positions = torch.unique(torch.cat([plan.positions, block_masked]))  # sorted
        self._positions = positions
        recomputed = h.model.run_positions(positions)  # what the forward really recomputes (Dream: + predecessors)
        if s.trace != "off":
            cache.snapshot(recomputed)  # for the KV drift, outside the timed forward
        cache.tokens[:, : state.total_len] = state.x  # a family's implicit recomputes read the current tokens
        logits, model_s = self._forward(state.x[:, positions], positions)
        stats = cache.last_stats
        forwards, self._extra_forwards, self._extra_model_s = 1, 0, 0.0
        logits = logits[0]
        masked_here = state.masked[positions]
        masked_positions = positions[masked_here]
        masked_logits = logits[masked_here]
        entropy = None
        if self.cache_policy.needs_entropy:
            logp = F.log_softmax(logits.float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(-1)
        self.cache_policy.observe(state, cache, positions, entropy)
        # Candidates: the block's masked positions with draft tokens and their confidence, in
        # float64 so that a threshold near 1 is not decided by float32 rounding.
        in_block = (masked_positions >= state.block_start) & (masked_positions < state.block_end)
        cand_logits = masked_logits[in_block]
        draft = self._draft(cand_logits)
        conf = F.softmax(cand_logits.double(), dim=-1).gather(-1, draft[:, None]).squeeze(-1)
        rank = conf if s.remasking == "low_confidence" else torch.rand(conf.shape, generator=self.gen, device=conf.device, dtype=conf.dtype)
        cand = Candidates(masked_positions[in_block], draft, conf, rank)
        t_exact = time.perf_counter()
        exact = self._exact_drift(state, shadow, cand) if shadow is not None else None
        exact_s = time.perf_counter() - t_exact

        selection = self.unmask_policy.select(state, cand, self)
        chosen = selection.positions
        chosen_index = torch.searchsorted(cand.positions, chosen)
        state.x[0, chosen] = cand.tokens[chosen_index]
        committed = [[int(p), int(t), round(float(c), 6)] for p, t, c in
                     zip(chosen.tolist(), cand.tokens[chosen_index].tolist(), cand.confidence[chosen_index].tolist())]
        forwards += self._extra_forwards
        model_s += self._extra_model_s
        record = StepRecord(
            step=state.step, block=state.block, step_in_block=state.step_in_block, full_refresh=plan.full,
            g=int(stats.recomputed), reads=int(stats.reads), committed=committed, forwards=forwards,
            model_ms=round(model_s * 1e3, 4), other_ms=0.0, exact_ms=round(exact_s * 1e3, 4), exact=exact,
            policy={**selection.info, **self.cache_policy.info()},
        )
        if s.trace != "off":
            record.masked_positions = masked_positions.tolist()
            # Confidence (max softmax probability) of every still-masked position this forward scored.
            record.masked_confidence = _round(F.softmax(masked_logits.float(), dim=-1).amax(-1).tolist(), 6)
            record.kv = self._kv_record(cache.drift_cosines())
            if s.trace == "full":
                record.recomputed = recomputed.tolist()
        self.cache_policy.end_step(state, cache)
        total_s = time.perf_counter() - t_start
        record.other_ms = round(max(0.0, total_s - model_s - exact_s) * 1e3, 4)
        return record

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        device = self.handle.device
        _sync(device)
        t = time.perf_counter()
        logits = self.handle.model(ids, positions, self.cache).logits
        _sync(device)
        return logits, time.perf_counter() - t

    def _draft(self, logits: torch.Tensor) -> torch.Tensor:
        """Argmax, with LLaDA's Gumbel-style noise when temperature > 0."""
        t = self.settings.temperature
        if t == 0 or logits.numel() == 0:
            return logits.argmax(-1)
        logits = logits.double()
        noise = torch.rand(logits.shape, generator=self.gen, device=logits.device, dtype=torch.float64)
        return (logits.exp() / (-torch.log(noise)) ** t).argmax(-1)

    # ---------------------------------------------------------------- engine for policies
    def verify(self, rows: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Read-only forward of ``k`` variant sequences: for row r, the probability of
        ``tokens[r]`` at position ``at[r]`` (``[k]``, float64)."""
        cache, positions = self.cache, self._positions
        cache.read_only = True
        try:
            logits, seconds = self._forward(rows[:, positions], positions)
        finally:
            cache.read_only = False
        self._extra_forwards += 1
        self._extra_model_s += seconds
        picked = logits[torch.arange(rows.shape[0], device=logits.device), torch.searchsorted(positions, at)]
        return F.log_softmax(picked.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()

    def guider_logits(self, sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        model = self.guider.model
        end = int(positions.max())
        tokens = sequence[:end].tolist()
        keep = 0
        for a, b in zip(self._guider_tokens, tokens):
            if a != b:
                break
            keep += 1
        keep = min(keep, int(positions.min()) - 1)
        if self._guider_cache is None:
            self._guider_cache = DynamicCache(config=model.config)
        # Reuse the guider's K/V for the prefix it has already read; drop the rest.
        surplus = self._guider_cache.get_seq_length() - keep
        if surplus > 0:
            self._guider_cache.crop(-surplus)
        device = self.handle.device
        _sync(device)
        t = time.perf_counter()
        out = model(input_ids=sequence[keep:end][None].to(model.device), cache=self._guider_cache, use_cache=True)
        _sync(device)
        self._extra_model_s += time.perf_counter() - t
        self.trace.stats.guider_forwards += 1
        self._guider_cache = out.cache
        self._guider_tokens = tokens
        return out.logits[0, positions - 1 - keep].to(device)

    # ---------------------------------------------------------------- diagnostics and bookkeeping
    def _exact_drift(self, state: DecodeState, shadow, cand: Candidates) -> dict:
        """A full uncached forward: the true KV drift and the error the cache introduced."""
        self.trace.stats.exact_forwards += 1
        L = state.total_len
        everything = torch.arange(L, device=state.x.device)
        shadow.snapshot(everything)
        exact_logits = self.handle.model(state.x, everything, shadow).logits[0]
        exact_p = F.softmax(exact_logits[cand.positions].double(), dim=-1)
        cached_p = cand.confidence
        err = (exact_p.gather(-1, cand.tokens[:, None]).squeeze(-1) - cached_p).abs()
        cache_error = {}
        for layer in range(len(self.cache.k)):
            ck = position_cosine(self.cache.k[layer][:, :, :L], shadow.k[layer][:, :, :L])
            cv = position_cosine(self.cache.v[layer][:, :, :L], shadow.v[layer][:, :, :L])
            cache_error[str(layer)] = {"k": _round(ck.tolist()), "v": _round(cv.tolist())}
        drift_k, drift_v = shadow.drift_cosines()
        true_drift = {str(l): {"k": _round(k), "v": _round(v)} for l, (k, v) in enumerate(zip(drift_k.tolist(), drift_v.tolist()))}
        return {
            "max_prob_error": round(float(err.max()), 6) if err.numel() else 0.0,
            "argmax_agree": bool((exact_p.argmax(-1) == cand.tokens).all()) if self.settings.temperature == 0 else None,
            "true_drift": true_drift,
            "cache_vs_exact": cache_error,
        }

    def _kv_record(self, drift: tuple[torch.Tensor, torch.Tensor] | None) -> dict:
        if drift is None:
            return {}
        cos_k, cos_v = drift  # [layers, n]
        if self.settings.trace == "full":
            ks, vs = cos_k.tolist(), cos_v.tolist()
            return {str(l): {"k": _round(ks[l]), "v": _round(vs[l])} for l in range(len(ks))}
        # Summary: four numbers per layer, computed for all layers in one go.
        both = torch.stack([cos_k, cos_v])  # [2, layers, n]
        seen = ~torch.isnan(both)
        count = seen.sum(-1)
        mean = (torch.where(seen, both, 0).sum(-1) / count.clamp(min=1)).tolist()
        low = torch.where(seen, both, float("inf")).min(-1).values.tolist()
        has = (count > 0).tolist()
        out = {}
        for l in range(cos_k.shape[0]):
            pick = lambda table, i: round(table[i][l], 6) if has[i][l] else None  # noqa: E731
            out[str(l)] = {"k_mean": pick(mean, 0), "k_min": pick(low, 0), "v_mean": pick(mean, 1), "v_min": pick(low, 1)}
        return out

    def _count(self, record: StepRecord) -> None:
        st = self.trace.stats
        st.nfe += record.forwards
        st.model_s += record.model_ms / 1e3
        st.other_s += record.other_ms / 1e3
        st.exact_s += record.exact_ms / 1e3
        self._committed_total += len(record.committed)
        self._g_total += record.g
        self._reads_total += record.reads
        self._main_forwards += 1

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

    def _finish(self, state: DecodeState, wall_s: float) -> None:
        h, trace, st = self.handle, self.trace, self.trace.stats
        answer = state.x[0, state.prompt_len:].tolist()
        trace.final_ids = answer
        cut = next((i for i, t in enumerate(answer) if t in h.stop_ids or t == h.mask_id), len(answer))
        trace.text = h.tokenizer.decode(answer[:cut], skip_special_tokens=True)
        ids = set(answer) | set(self.prompt_ids) | {h.mask_id}
        trace.vocab = {str(i): h.tokenizer.decode([i]) for i in sorted(ids)}
        st.gen_length = self.settings.gen_length
        st.content_tokens = cut
        forwards = max(1, st.nfe)
        # Tokens the forwards committed (not EOS filled in by an early stop, nor masks left by Stop).
        committed = self._committed_total
        content = min(cut, committed)
        st.tokens_per_forward = round(committed / forwards, 4)
        st.content_tokens_per_forward = round(content / forwards, 4)
        g, reads = self._g_total, self._reads_total
        st.mean_g = round(g / max(1, self._main_forwards), 2)
        st.cache_hit_rate = round(reads / max(1, g + reads), 4)
        st.wall_s = wall_s
        st.tokens_per_s = round(committed / st.model_s, 2) if st.model_s else 0.0
        st.content_tokens_per_s = round(content / st.model_s, 2) if st.model_s else 0.0
        self.result = Result(text=trace.text, token_ids=answer, trace=trace)


def stream(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Run:
    """Start a generation; iterate the returned run for one step record per forward."""
    return Run(handle, prompt, settings or Settings(), guider)


def generate(handle: ModelHandle, prompt: Prompt, settings: Settings | None = None, guider: GuiderHandle | None = None) -> Result:
    run = stream(handle, prompt, settings, guider)
    for _ in run:
        pass
    return run.result
