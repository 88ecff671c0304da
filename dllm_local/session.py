"""The page's view of the engine: one loaded model, one run at a time, plain-dict records.

The UI never touches torch; it talks to a ``Session``, which loads models, validates settings,
streams step records as dicts, stops runs and turns device failures into messages.
"""
from __future__ import annotations

import json
import queue
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import torch

from .errors import DllmError, SettingsError
from .loader import GuiderHandle, ModelHandle, load, load_guider
from .sampler import Run
from .settings import Settings
from .trace import SCHEMA_VERSION

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
MODEL_CHOICES = ["tiny", "llada-8b-instruct", "llada-1.5", "dream-7b"]


_DONE = object()
OOM_ADVICE = ("the GPU ran out of memory; the cache was freed. Try 4-bit quantization, "
              "a shorter generation length or a smaller block size.")


class BusyError(DllmError):
    """A run is already going; runs are never mixed."""


class OutOfMemory(DllmError):
    """The device ran out of memory; the cache was freed."""


def load_presets(directory: Path = PRESETS_DIR) -> tuple[dict[str, dict], list[str]]:
    """Valid presets by name, and one message per broken file (the others still load)."""
    presets, problems = {}, []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "name" not in data or "settings" not in data:
                raise ValueError("needs 'name' and 'settings'")
            Settings.from_dict(data["settings"])
            presets[data["name"]] = data
        except (ValueError, DllmError, TypeError) as exc:
            problems.append(f"preset {path.name} was skipped: {exc}")
    return presets, problems


class Session:
    def __init__(self, model: str = "tiny", device: str = "auto", quantization: str | None = None,
                 guider: str | None = "tiny-guider") -> None:
        self.device = device
        self.handle: ModelHandle = load(model, device=device, quantization=quantization)
        self.guider_name = guider
        self._guider: GuiderHandle | None = None
        self._lock = threading.Lock()
        self._run: Run | None = None
        self._sweep_cancel: threading.Event | None = None

    # ---------------------------------------------------------------- models
    def model_options(self) -> list[tuple[str, bool, str]]:
        """(name, usable here, reason) for the model picker."""
        return [(name, True, "") for name in MODEL_CHOICES]

    def quantization_options(self) -> list[tuple[str, bool, str]]:
        cuda = torch.cuda.is_available()
        reason = "" if cuda else "needs a CUDA GPU (bitsandbytes)"
        return [("none", True, ""), ("8bit", cuda, reason), ("4bit", cuda, reason)]

    def switch_model(self, name: str, quantization: str | None = None) -> dict:
        with self._hold():
            handle = load(name, device=self.device, quantization=None if quantization in (None, "none") else quantization)
            old, self.handle = self.handle, handle
            del old
            self._guider = None
            _free_device_memory()
            return handle.summary()

    def guider(self) -> GuiderHandle:
        if self._guider is None:
            if not self.guider_name:
                raise SettingsError("no guider model is configured; start the app with --guider")
            self._guider = load_guider(self.guider_name, device=self.handle.device)
        return self._guider

    def info(self) -> dict:
        return self.handle.summary()

    # ---------------------------------------------------------------- runs
    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def run(self, prompt, settings: dict | Settings) -> Iterator[dict]:
        """Stream one generation as plain dicts.

        First ``{"start": header}`` (prompt ids, lengths, settings: enough to draw the empty grid),
        then ``{"step": record, "vocab": {id: text}}`` per forward (texts of newly seen tokens),
        then ``{"trace": the full trace}``. The engine runs in its own thread and never waits for
        the consumer, so drawing the page cannot slow the run or leak into its timings.
        """
        settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
        guider = self.guider() if settings.unmask == "guided" else None
        run = Run(self.handle, prompt, settings, guider)  # validation errors surface here, in the caller
        tok = self.handle.tokenizer
        seen: set[int] = set()

        def texts(ids) -> dict:
            new = {int(i) for i in ids} - seen
            seen.update(new)
            return {str(i): tok.decode([i]) for i in new}

        def work(events: queue.Queue) -> None:
            events.put({"start": {"prompt_ids": run.prompt_ids, "gen_length": settings.gen_length,
                                  "mask_id": self.handle.mask_id, "settings": settings.to_dict(),
                                  "model": self.handle.summary(),
                                  "vocab": texts(run.prompt_ids + [self.handle.mask_id]),
                                  "schema_version": SCHEMA_VERSION, "steps": [], "final_ids": [], "stats": {}, "text": ""}})
            for record in run:
                events.put({"step": asdict(record), "vocab": texts(t for _, t, _ in record.committed)})
            events.put({"trace": run.result.trace.to_dict()})

        return self._in_thread(work, on_exit=run.stop, run=run)

    def stop(self) -> bool:
        """Stop the run or sweep in progress (within one step / one grid point)."""
        stopped = False
        if self._run is not None:
            self._run.stop()
            stopped = True
        if self._sweep_cancel is not None:
            self._sweep_cancel.set()
            stopped = True
        return stopped

    def sweep(self, task: str, n: int, base: dict, axes: dict[str, list], seed: int = 1000) -> Iterator[dict]:
        """Stream a sweep: ``{"progress": {done, total, point, row}}`` per grid point, then ``{"report": ...}``."""
        from .bench import task_problems
        from .sweep import run_sweep

        base_settings = Settings.from_dict(base)
        problems = task_problems(task, int(n), seed)
        guider = self.guider() if base_settings.unmask == "guided" else None
        cancel = threading.Event()

        def work(events: queue.Queue) -> None:
            self._sweep_cancel = cancel
            try:
                report = run_sweep(self.handle, problems, base_settings, axes, guider, cancel,
                                   on_point=lambda p: events.put({"progress": {"done": p.done, "total": p.total,
                                                                               "point": p.point, "row": p.row}}))
                events.put({"report": report})
            finally:
                self._sweep_cancel = None

        return self._in_thread(work, on_exit=cancel.set)

    @staticmethod
    def cost_devices() -> list[str]:
        from .costmodel import DEVICES

        return [*DEVICES, "this machine"]

    def cost_model(self, trace: dict, device: str) -> list[dict]:
        """The cost-model panel for a finished run: step floors per strategy on ``device``."""
        from .costmodel import DEVICES, cost_rows, measure_device

        profile = measure_device(self.handle.device) if device == "this machine" else DEVICES[device]
        s, st = trace["settings"], trace["stats"]
        P, gen, bs = len(trace["prompt_ids"]), s["gen_length"], s["block_size"]
        blocks = range(gen // bs)
        window = [gen - b * bs for b in blocks]  # positions from the block start to the end
        geometry = {"none": P + gen, "prefix": sum(window) / len(window), "dual": bs, "freecache": sum(window) / len(window)}
        strategies = [{"name": f"this run ({s['cache']} + {s['unmask']})", "g": st["mean_g"], "tau": st["tokens_per_forward"],
                       "measured_step_s": st["model_s"] / max(1, st["nfe"])}]
        strategies += [{"name": f"{name} (typical step)", "g": g, "tau": 1.0} for name, g in geometry.items()]
        params = self.handle.num_parameters
        weight_bytes = self.handle.memory_bytes
        rows = cost_rows(weight_bytes, params, strategies, profile)
        for row in rows[1:]:
            row["tau"] = None  # the other strategies' tau is only known once they run
            row["speedup_low_batch"] = row["ratio_compute_bound"] = None
        return rows

    def _in_thread(self, work, on_exit=None, run: Run | None = None) -> Iterator[dict]:
        """Run ``work(events)`` in the engine thread under the session lock; yield its events."""
        if not self._lock.acquire(blocking=False):
            raise BusyError("a run is already going; wait for it or press Stop")
        self._run = run  # before the thread starts, so that an early Stop is not lost
        events: queue.Queue = queue.Queue()

        def target() -> None:
            out_of_memory = False
            try:
                work(events)
            except torch.cuda.OutOfMemoryError:
                out_of_memory = True
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                events.put(exc)
            finally:
                if run is not None:
                    run.release()
                self._run = None
                if out_of_memory:
                    # Outside the except block: the traceback no longer holds the run's tensors.
                    _free_device_memory()
                    events.put(OutOfMemory(OOM_ADVICE))
                self._lock.release()
                events.put(_DONE)

        threading.Thread(target=target, daemon=True).start()
        return self._drain(events, on_exit)

    @staticmethod
    def _drain(events: queue.Queue, on_exit) -> Iterator[dict]:
        try:
            while True:
                item = events.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if on_exit is not None:
                on_exit()  # the consumer went away (or finished): never leave work going

    def _hold(self):
        session = self

        class _Holder:
            def __enter__(self):
                if not session._lock.acquire(blocking=False):
                    raise BusyError("a run is already going; wait for it or press Stop")

            def __exit__(self, *exc):
                session._lock.release()

        return _Holder()


def _free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

