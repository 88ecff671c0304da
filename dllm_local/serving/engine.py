"""The engine process: owns the model and runs generations, sweeps and the cost model for the page.

It runs in a process of its own (``serve``, started by ``dllm_local.serving.session.Session``), so the
page's Python work (building figures, Gradio's serialisation) never holds the engine's GIL: in one
process every torch op waited for the page's thread, and a run took 1.4x longer while drawn.
The engine's main thread does all torch work, so the OpenMP team is created once.
"""
from __future__ import annotations

import importlib.util
import os
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Callable

import torch
from tqdm import tqdm

from ..errors import SettingsError
from ..policies import registry
from ..models.loading.loader import GuiderHandle, ModelHandle, free_device_memory, load, load_guider, pick_device
from ..decoding.sampler import stream
from ..settings import Settings
from ..trace import SCHEMA_VERSION, Branch
from ..limits import BATCH_MODE, SLOTS
from .failures import portable
from .scheduler import Scheduler

Emit = Callable[[dict], None]
def engine_threads(threads: int = 0) -> int:
    """Torch threads for a model on the CPU: ``threads``, or all cores but one, left to the page
    and the browser on the same machine (an OpenMP team that loses a core to them runs every step
    several times slower)."""
    threads = threads or max(1, (os.cpu_count() or 1) - 1)
    torch.set_num_threads(threads)
    return threads


class Engine:
    """One loaded model (and, on demand, the guider). ``stop`` ends the run or sweep in progress
    between steps; the page process sets it."""

    def __init__(self, stop: Event, model: str = "tiny", device: str = "auto", quantization: str | None = None,
                 guider: str | None = "tiny-guider", ray: str | None = None) -> None:
        self.stop, self.device, self.guider_name = stop, device, guider
        self.cluster = ray  # sweeps run on this Ray cluster's workers (app.py --ray), else here
        self.handle: ModelHandle = load(model, device=device, quantization=quantization)
        self._guider: GuiderHandle | None = None

    def describe(self) -> dict:
        """What the page shows without asking again: the model and which quantizations can work."""
        # Whether it is installed, not imported: its import takes seconds, and most runs never quantize.
        usable = importlib.util.find_spec("bitsandbytes") is not None
        if not usable:
            note = "needs bitsandbytes (pip install bitsandbytes)"
        else:
            note = "" if self.handle.device.type == "cuda" else "runs on the CPU, slower than full precision"
        return {"info": self.handle.summary(),
                "quantization": [("none", True, ""), ("8bit", usable, note), ("4bit", usable, note)],
                "policies": registry.all_specs()}

    def switch_model(self, name: str, quantization: str | None = None) -> dict:
        """Load ``name`` in place of the current model. The old weights are released first (two 8B
        models do not fit on one card); if the new one fails to load, the old one comes back. If
        even that fails, ``handle`` stays None and the engine process must end (``serve`` does)."""
        previous = (self.handle.name, self.handle.quantization)
        self.handle = self._guider = None
        free_device_memory()
        try:
            self.handle = load(name, device=self.device, quantization=quantization)
            return self.describe()
        except BaseException as exc:  # noqa: BLE001 - raised again below, once the old model is back
            failure = exc
            # The traceback's frames hold the half-loaded model; they go before the old one comes.
            traceback.clear_frames(exc.__traceback__)
        free_device_memory()
        self.handle = load(previous[0], device=self.device, quantization=previous[1])
        raise failure

    def guider(self) -> GuiderHandle:
        if self._guider is None:
            if not self.guider_name:
                raise SettingsError("no guider model is configured; start the app with --guider")
            self._guider = load_guider(self.guider_name, device=self.handle.device)
        return self._guider

    def events(self, run, settings: Settings, branch: dict | None = None) -> RunEvents:
        """The events of ``run`` (a ``Run`` alone or in the batch) as the page reads them."""
        return RunEvents(self.handle, run, settings, branch)

    def run(self, prompt, settings: dict | Settings, emit: Emit, branch: dict | None = None) -> None:
        """A run alone: emit ``{"start": header}``, ``{"step": record, "vocab": {id: text}}`` per
        forward, then ``{"end": the trace without its steps}`` (see ``RunEvents``). ``branch``: a
        ``trace.Branch`` as a dict, the one change a branch makes to the run it repeats."""
        settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
        guider = self.guider() if settings.unmask_spec.needs_guider else None
        run = stream(self.handle, prompt, settings, guider, Branch(**branch) if branch else None)
        events = self.events(run, settings, branch)
        emit(events.start())
        try:
            for record in run:
                emit(events.step(record))
                if self.stop.is_set():
                    run.stop()
        finally:
            run.release()
        emit(events.end())

    def sweep(self, task: str, n: int, base: dict, axes: dict[str, list], emit: Emit, seed: int = 1000) -> None:
        """Emit ``{"units": {done, total, throughput}}`` as problems finish, ``{"progress": {done,
        total, point, row}}`` per grid point, then ``{"report": ...}``. With a cluster the
        workers load the model by its name; without, the sweep decodes with this engine's model."""
        from ..experiments.sweep import run_sweep, sweep_job
        from ..experiments.units import LocalRunner, ModelSpec, Worker

        self.handle.require_masked("a sweep")
        base_settings = Settings.from_dict(base)
        model = ModelSpec(self.handle.name, self.device, self.handle.quantization, self.guider_name)
        job = sweep_job(base_settings, axes, task, int(n), seed, model)
        if self.cluster:
            from ..experiments.cluster import Cluster, ClusterRunner

            runner = ClusterRunner(Cluster(self.cluster))
        else:
            runner = LocalRunner(Worker(job, self.handle, self.guider() if base_settings.unmask_spec.needs_guider
                                        else None))
        report = run_sweep(job, runner, cancel=self.stop,
                           on_point=lambda p: emit({"progress": {"done": p.done, "total": p.total,
                                                                 "point": p.point, "row": p.row}}),
                           on_unit=lambda u: emit({"units": {"done": u.done, "total": u.total,
                                                             "throughput": u.throughput}}))
        emit({"report": report})




class RunEvents:
    """One run's events for the page: ``start()`` (the header: prompt ids, lengths, settings,
    the model), ``step(record)`` per forward with the texts of tokens not seen before in this
    run, ``end()`` (the trace without its steps)."""

    def __init__(self, handle: ModelHandle, run, settings: Settings, branch: dict | None) -> None:
        self.handle, self.run, self.settings, self.branch = handle, run, settings, branch
        self.seen: set[int] = set()
        self.started = False

    def _texts(self, ids) -> dict:
        new = {int(i) for i in ids} - self.seen
        self.seen.update(new)
        return {str(i): self.handle.tokenizer.decode([i]) for i in new}

    def start(self) -> dict:
        run, branch = self.run, self.branch
        self.started = True
        forced = [branch["token"]] if branch and branch.get("token") is not None else []
        return {"start": {"prompt_ids": run.prompt_ids, "gen_length": run.answer_length,
                          "mask_id": self.handle.mask_id, "settings": self.settings.to_dict(),
                          "model": self.handle.summary(),
                          "vocab": self._texts([*run.prompt_ids, self.handle.mask_id, *forced]),
                          "schema_version": SCHEMA_VERSION, "steps": [], "final_ids": [], "stats": {}, "text": "",
                          **({"branch": branch} if branch else {})}}

    def step(self, record) -> dict:
        return {"step": record.to_dict(), "vocab": self._texts(record.token_ids())}

    def end(self) -> dict:
        return {"end": {k: v for k, v in self.run.result.trace.to_dict().items() if k != "steps"}}


def serve(conn: Connection, stop: Event, spec: dict) -> None:
    """The engine process: load the model, say ``ready``, then serve every page's requests
    (``scheduler.Scheduler``: runs batched, the rest one at a time)."""
    engine_threads(spec.pop("threads", 0))
    memory_fraction = spec.pop("memory_fraction", None)
    slots, max_length = spec.pop("slots", SLOTS), spec.pop("max_length", None)
    batch_mode, lecture_slots = spec.pop("batch_mode", BATCH_MODE), spec.pop("lecture_slots", 0)
    # Progress bars (model loading) lock with a thread lock, not tqdm's default cross-process
    # semaphore, which this process would leave behind when the page process ends it.
    tqdm.set_lock(threading.RLock())
    try:
        # Before any policy is built: the page process's plugin policies (entry points, --policies).
        registry.load_plugins(spec.pop("policies", ()))
        if memory_fraction:
            device = pick_device(spec.get("device", "auto"))
            if device.type == "cuda":  # the caching allocator refuses more than this share of the card
                index = device.index if device.index is not None else torch.cuda.current_device()
                torch.cuda.set_per_process_memory_fraction(float(memory_fraction), index)
        engine = Engine(stop, **spec)
    except BaseException as exc:  # noqa: BLE001 - the page process raises it
        conn.send((None, "error", portable(exc)))
        return
    conn.send((None, "ready", engine.describe()))
    Scheduler(engine, conn, slots, max_length, batch_mode, lecture_slots).serve()
