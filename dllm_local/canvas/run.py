"""Canvas diffusion (DiffusionGemma): transformers' own decoding, one denoising pass at a time.

transformers' ``DiffusionGemmaForBlockDiffusion.generate`` is a closed loop, and the page needs
the run one pass at a time (each streamed as it happens, Stop between two). So ``CanvasRun`` runs
generate's loop itself over transformers' own step functions, called in generate's order with
generate's arguments: they draw from torch's generator in the same order, so the same seed gives
the same tokens and the same number of passes (tests/test_diffusion_gemma.py checks it against
``model.generate``). Nothing of the model or its sampler is re-implemented; forward hooks and the
sampler's own state tell the trace what each pass decided.

The steps, numbered as in transformers' ``generate`` docstring; per canvas:

1.a. encode: the encoder reads the prompt (the first time) or the finished canvas into the KV cache.
1.b. prepare: a canvas of random tokens, and no self-conditioning yet.
1.c. per denoising step, from step N down to 1 (one step record each):
     i.   the decoder runs on the canvas over the encoder's cache, self-conditioned on the last logits;
     ii.  a canvas is sampled under the schedule's temperature, and its argmax is the draft;
     iii. the entropy-bound sampler keeps the lowest-entropy samples and renoises the rest;
     iv.  the stable-and-confident rule may end the canvas here;
     v.   the logits condition the next step.
1.d. the draft joins the answer;
1.e. an end token (or the length) ends the answer; what follows the first end token becomes pad;
1.f. the positions move on to the next canvas.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Iterator

import torch

from .trace import CanvasStep
from .watch import DecoderWatch, KeepScores
from .. import kinds
from ..errors import SequenceTooLongError, SettingsError
from ..limits import MAX_GEN_LENGTH
from ..models.loading.loader import ModelHandle
from ..prompts import Prompt, encode_prompt
from ..runner.timing import model_gpus, timed
from ..result import Result
from ..settings import Settings
from ..trace import StepRecord, Trace

class CanvasRun:
    """One canvas-diffusion generation in progress: iterate for one step record per decoder pass;
    ``stop()`` ends it between passes (the canvas in progress joins the answer as its draft)."""

    def __init__(self, handle: ModelHandle, prompt: Prompt, settings: Settings, guider: Any = None,
                 branch: Any = None) -> None:
        kinds.get(handle.kind).check_knobs(settings.knobs_set(), handle.name)  # its sampler's own, canvas_params
        if branch is not None:
            raise SettingsError("a branch forces one token into a masked-diffusion run; a canvas model redraws its "
                                "whole canvas every step, so it has no branches")
        self.handle, self.settings, self.model = handle, settings, handle.model
        params = dict(settings.canvas_params)
        self.canvas_length = params.pop("canvas_length", None) or handle.canvas_length
        bound = params.pop("entropy_bound", None)
        if bound is not None:
            from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

            params["sampler_config"] = EntropyBoundSamplerConfig(float(bound))
        try:
            self.config, self.model_kwargs = self.model._prepare_generation_config(
                None, max_new_tokens=settings.gen_length, **params)
        except ValueError as exc:  # transformers' own checks of its knobs (t_max above t_min with the checkpoint's)
            raise SettingsError(f"canvas_params: {exc}") from None
        # A static cache makes generate compile its steps; the same computation runs here uncompiled.
        self.config.cache_implementation = None
        self.prompt_ids = encode_prompt(handle, prompt)
        _, new_tokens = self.model._prepare_generated_length(self.config, len(self.prompt_ids))
        self.num_canvases = math.ceil(new_tokens / self.canvas_length)
        self.gen_length = self.num_canvases * self.canvas_length  # the answer region: whole canvases
        total = len(self.prompt_ids) + self.gen_length
        limit = min(len(self.prompt_ids) + MAX_GEN_LENGTH, handle.max_length)
        if total > limit:  # the page's longest answer region, and the model's positions
            raise SequenceTooLongError(f"gen_length {new_tokens} makes {self.num_canvases} canvas(es) of "
                                       f"{self.canvas_length}: with the prompt's {len(self.prompt_ids)} tokens, "
                                       f"{total} positions, beyond the maximum of {limit}")
        self._stop = threading.Event()
        self.result = None
        self._watch: DecoderWatch | None = None
        # Time the consumer held the run since the last record, and in all: never the run's.
        self._paused = self._paused_total = 0.0
        self._reads = 0  # encoder entries the decoder read from the cache, over all passes
        self._decoder_s = 0.0

    @property
    def answer_length(self) -> int:
        return self.gen_length

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Drop the hooks and the encoder's cache, and give the model its own canvas length back;
        the result and trace stay."""
        if self._watch is not None:
            self._watch.remove()
        self._watch = self.cache = None
        self.model.config.canvas_length = self.handle.canvas_length

    def __iter__(self) -> Iterator[StepRecord]:
        generator = self._decode()
        while True:
            with torch.no_grad():  # as generate: a record is made between two passes, outside
                record = next(generator, None)
            if record is None:
                return
            t = time.perf_counter()
            yield record
            self._paused += time.perf_counter() - t

    # ---------------------------------------------------------------- the loop
    def _decode(self) -> Iterator[StepRecord]:
        m, gc, L = self.model, self.config, self.canvas_length
        self._start()
        input_ids, P = self.input_ids, len(self.prompt_ids)
        for canvas in range(self.num_canvases):
            # 1.a. encode
            encoder = self._encode(input_ids, canvas == 0)
            # 1.b. prepare
            current, conditioning, mask_mapping, finished = m._prepare_denoiser_inputs(
                decoder_attention_mask=self.decoder_attention_mask, cache=self.cache, sampler=self.sampler,
                diffusion_stopping_criteria=self.stopping, batch_size=1, device=input_ids.device,
                model_kwargs=self.model_kwargs)
            draft, passes = current, 0
            # 1.c. per denoising step, from N down to 1
            for step_in_canvas, cur_step in enumerate(reversed(range(1, gc.max_denoising_steps + 1))):
                if self._stop.is_set():
                    break
                passes += 1
                history = self._stability_history()
                before = draft
                current, draft, conditioning, finished = m._denoising_step(  # i. to v.
                    decoder_forward=self._timed_decoder, current_canvas=current, argmax_canvas=draft,
                    input_ids=input_ids, decoder_position_ids=self.decoder_position_ids,
                    self_conditioning_logits=conditioning, mask_mapping=mask_mapping, cache=self.cache,
                    finished_denoising=finished, cur_step=cur_step, sampler=self.sampler,
                    logits_processor=self.logits_processor, diffusion_stopping_criteria=self.stopping,
                    **self.model_kwargs)
                yield self._record(canvas, step_in_canvas, cur_step, P + canvas * L, before, current, draft,
                                   bool(finished.all()), history, encoder if step_in_canvas == 0 else None)
                if bool(finished.all()):
                    break
            if not passes:  # stopped before this canvas's first pass: its random tokens are no draft
                break
            # 1.d. the draft joins the answer
            input_ids = torch.cat([input_ids, draft], dim=-1)
            # 1.e. an end token or the length ends the answer
            input_ids, self.finished_sequences = m._finalize_canvas(
                input_ids=input_ids, finished_sequences=self.finished_sequences, generation_config=gc,
                stopping_criteria=self.ar_stopping, canvas_length=L, eos_tensor=self.eos_tensor)
            if bool(self.finished_sequences.all()) or self._stop.is_set():
                break
            # 1.f. the positions move on
            (self.cur_len, self.decoder_attention_mask, self.attention_mask, self.encoder_position_ids,
             self.decoder_position_ids) = m._prepare_kwargs_for_next_canvas(
                attention_mask=self.attention_mask, decoder_attention_mask=self.decoder_attention_mask,
                decoder_position_ids=self.decoder_position_ids, canvas_length=L, cur_len=self.cur_len)
        self._finish(input_ids[0, P:].tolist(), stopped=self._stop.is_set())

    # ---------------------------------------------------------------- the loop's parts
    def _start(self) -> None:
        """Generate's step 0: the seed, the cache, the positions and masks, the sampler, the
        temperature schedule and both stopping rules, as generate sets them."""
        m, gc, h = self.model, self.config, self.handle
        self.model.config.canvas_length = self.canvas_length  # generate reads it from the model's config
        torch.manual_seed(self.settings.seed)  # generate draws from torch's global generator
        self.input_ids = torch.tensor([self.prompt_ids], dtype=torch.long, device=h.device)
        P = self.cur_len = len(self.prompt_ids)
        max_length, _ = m._prepare_generated_length(gc, P)
        self.cache = m._prepare_cache_for_generation(generation_config=gc, batch_size=1, max_length=max_length)
        self.eos_tensor = None if gc.eos_token_id is None else torch.tensor(gc.eos_token_id, device=h.device)
        self.finished_sequences = torch.zeros(1, dtype=torch.bool, device=h.device)
        self.encoder_position_ids = torch.arange(0, P, dtype=torch.int32, device=h.device)[None]
        self.decoder_position_ids = torch.arange(P, P + self.canvas_length, dtype=torch.int32, device=h.device)[None]
        self.attention_mask = torch.ones((1, P), dtype=torch.bool, device=h.device)
        self.decoder_attention_mask = torch.nn.functional.pad(self.attention_mask, (0, self.canvas_length), value=True)
        self.sampler = m._prepare_sampler(gc)
        self.logits_processor = m._prepare_logits_processor(gc, None)
        self._scores = KeepScores()
        self.logits_processor.append(self._scores)  # last: it sees what the sampler and the stopping rule see
        self.ar_stopping = m._prepare_ar_stopping_criteria(gc, None)
        self.stopping = m._prepare_diffusion_stopping_criteria(gc)
        self._watch = DecoderWatch(m.model.decoder, keep_kv=self.settings.trace != "off")
        self._gpus = model_gpus(m)
        self.trace = Trace(settings=self.settings.to_dict(), model=h.summary(), prompt_ids=list(self.prompt_ids),
                           gen_length=self.gen_length, mask_id=h.mask_id)
        self._t0 = self._t_step = time.perf_counter()

    def _encode(self, input_ids: torch.Tensor, prefill: bool) -> dict:
        """1.a: the encoder's pass over what it has not read yet, into the cache."""
        m, st = self.model, self.trace.stats
        cached = self.cache.get_seq_length()
        unread, mask_mapping = m._prepare_encoder_inputs(
            input_ids=input_ids, attention_mask=self.attention_mask, encoder_position_ids=self.encoder_position_ids,
            cache=self.cache, is_prefill=prefill, canvas_length=self.canvas_length, batch_size=1, **self.model_kwargs)
        output, seconds = timed(lambda: m.model.encoder(input_ids=unread, attention_mask=mask_mapping, cache=self.cache,
                                                        position_ids=self.encoder_position_ids, **self.model_kwargs),
                                self._gpus)
        self.cache = output.cache
        st.encoder_forwards += 1
        st.encoder_s += seconds
        if prefill:
            st.prefill_s += seconds
        self._watch.new_canvas()
        return {"positions": int(unread.shape[1]), "cached": int(cached), "ms": round(seconds * 1e3, 4)}

    def _timed_decoder(self, **kwargs):
        output, seconds = timed(lambda: self.model.forward(**kwargs), self._gpus)  # as generate calls it
        self._decoder_s = seconds
        return output

    def _stability_history(self) -> torch.Tensor | None:
        """The stopping rule's drafts before this step (it rolls them in place)."""
        history = None if self.stopping is None else self.stopping.argmax_canvas_history
        return None if history is None else history.clone()

    def _record(self, canvas: int, step_in_canvas: int, cur_step: int, start: int, before: torch.Tensor,
                current: torch.Tensor, draft: torch.Tensor, finished: bool, history: torch.Tensor | None,
                encoder: dict | None) -> StepRecord:
        gc, L = self.config, self.canvas_length
        accepted = self.sampler.accepted_token_mask[0]
        offsets = accepted.nonzero().flatten()
        entropy = torch.distributions.Categorical(logits=self._scores.scores[0]).entropy()
        mean_entropy = float(entropy.mean())
        threshold = gc.stability_threshold or 0
        stable = threshold == 0 or (history is not None and bool((history == draft[None]).all()))
        temperature = gc.t_min + (gc.t_max - gc.t_min) * cur_step / gc.max_denoising_steps
        record: CanvasStep = {
            "canvas": canvas, "start": start, "draft": draft[0].tolist(),
            "accepted": (offsets + start).tolist(), "sampled": current[0, offsets].tolist(),
            "changed": ((draft[0] != before[0]).nonzero().flatten() + start).tolist(),
            "entropy": [round(e, 5) for e in entropy.tolist()],
            "entropy_bound": float(self.sampler.entropy_bound), "temperature": round(float(temperature), 6),
            "mean_entropy": round(mean_entropy, 6), "stable": stable,
            "confident": finished or (gc.confidence_threshold is not None and mean_entropy < gc.confidence_threshold),
            "finished": finished, "experts": self._watch.experts_record(),
            "encoder": encoder,
        }
        st = self.trace.stats
        reads = self.cur_len  # the encoder's K/V entries every canvas position attends over, read as cached
        step = StepRecord(step=len(self.trace.steps), block=canvas, step_in_block=step_in_canvas, full_refresh=False,
                          g=L, reads=reads, committed=[], forwards=1, model_ms=round(self._decoder_s * 1e3, 4),
                          other_ms=0.0, canvas=record,
                          kv=self._watch.kv_record(start, self.canvas_length, len(self.prompt_ids) + self.gen_length,
                                                   self.settings.trace))
        st.nfe += 1
        st.model_s += self._decoder_s + (encoder["ms"] / 1e3 if encoder else 0.0)
        now = time.perf_counter()
        spent = now - self._t_step - self._paused - self._decoder_s - (encoder["ms"] / 1e3 if encoder else 0.0)
        step.other_ms = round(max(0.0, spent) * 1e3, 4)
        st.other_s += step.other_ms / 1e3
        self._t_step, self._paused_total, self._paused = now, self._paused_total + self._paused, 0.0
        self._reads += reads
        if self.settings.trace != "off":
            self.trace.steps.append(step)
        return step

    def _finish(self, produced: list[int], stopped: bool) -> None:
        """final_ids: what the model produced, pads after the first end token included, and pad
        for canvases never started; text: up to the first end token."""
        h, trace, st = self.handle, self.trace, self.trace.stats
        pad = h.mask_id
        trace.final_ids = produced + [pad] * (self.gen_length - len(produced))
        cut = next((i for i, t in enumerate(produced) if t in h.stop_ids), len(produced))
        trace.text = h.tokenizer.decode(produced[:cut], skip_special_tokens=True)
        ids = set(trace.final_ids) | set(trace.prompt_ids) | {pad}
        for step in trace.steps:
            ids.update(step.token_ids())
        trace.vocab = {str(i): h.tokenizer.decode([i]) for i in sorted(ids)}
        pad_named = self.config.pad_token_id  # transformers' tokens per forward: its pads not counted
        generated = sum(t != pad_named for t in produced) if pad_named is not None else len(produced)
        forwards = max(1, st.nfe)
        st.stopped, st.gen_length, st.content_tokens = stopped, self.gen_length, cut
        st.tokens_per_forward = round(generated / forwards, 4)
        st.content_tokens_per_forward = round(cut / forwards, 4)
        st.mean_g = float(self.canvas_length)
        st.cache_hit_rate = round(self._reads / max(1, self._reads + st.nfe * self.canvas_length), 4)
        st.model_share_s = st.model_s
        st.wall_s = time.perf_counter() - self._t0 - self._paused_total - self._paused
        st.tokens_per_s = round(generated / st.model_s, 2) if st.model_s else 0.0
        st.content_tokens_per_s = round(cut / st.model_s, 2) if st.model_s else 0.0
        self.result = Result(trace)
        self.release()
