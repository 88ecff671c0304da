"""The engine process: owns the model and runs generations, sweeps and the cost model for the page.

It runs in a process of its own (``serve``, started by ``dllm_local.serving.session.Session``), so the
page's Python work (building figures, Gradio's serialisation) never holds the engine's GIL: in one
process every torch op waited for the page's thread, and a run took 1.4x longer while drawn.
The engine's main thread does all torch work, so the OpenMP team is created once.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Callable

import torch
from tqdm import tqdm

from ..errors import DllmError, EngineError, OutOfMemory, SettingsError
from ..policies import registry
from ..models.loader import GuiderHandle, ModelHandle, free_device_memory, load, load_guider, pick_device
from ..sampler import stream
from ..settings import Settings
from ..trace import SCHEMA_VERSION, Branch

Emit = Callable[[dict], None]
OOM_ADVICE = ("the GPU ran out of memory; the cache was freed. Try 4-bit quantization, "
              "a shorter generation length or a smaller block size.")
LOAD_OOM_ADVICE = ("the GPU has not enough free memory for that model; the previous model is loaded again. "
                   "Try 4-bit or 8-bit quantization, or close other programs that use the GPU.")
# Allocation failures that reach Python as a plain RuntimeError (cuBLAS and bitsandbytes workspaces).
OOM_MARKERS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
# Errors after which the CUDA context is unusable: every later call fails with the same error.
FATAL_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
                 "illegal instruction", "uncorrectable ECC", "CUDA error: unknown error")


def failure_kind(exc: BaseException) -> str | None:
    """"oom" (the cache is freed and the engine goes on), "fatal" (the GPU context is lost: the
    engine process ends and the next request starts a new one) or None (an ordinary error)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom"
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if any(marker in text for marker in FATAL_MARKERS):
        return "fatal"
    if any(marker in text for marker in OOM_MARKERS):
        return "oom"
    return None


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

    def run(self, prompt, settings: dict | Settings, emit: Emit, branch: dict | None = None) -> None:
        """Emit ``{"start": header}``, ``{"step": record, "vocab": {id: text}}`` per forward (texts
        of newly seen tokens), then ``{"end": the trace without its steps}``. ``branch``: a
        ``trace.Branch`` as a dict, the one change a branch makes to the run it repeats."""
        settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
        guider = self.guider() if settings.unmask_spec.needs_guider else None
        run = stream(self.handle, prompt, settings, guider, Branch(**branch) if branch else None)
        tok = self.handle.tokenizer
        seen: set[int] = set()
        forced = [branch["token"]] if branch and branch.get("token") is not None else []

        def texts(ids) -> dict:
            new = {int(i) for i in ids} - seen
            seen.update(new)
            return {str(i): tok.decode([i]) for i in new}

        emit({"start": {"prompt_ids": run.prompt_ids, "gen_length": run.answer_length,
                         "mask_id": self.handle.mask_id, "settings": settings.to_dict(),
                         "model": self.handle.summary(), "vocab": texts([*run.prompt_ids, self.handle.mask_id, *forced]),
                         "schema_version": SCHEMA_VERSION, "steps": [], "final_ids": [], "stats": {}, "text": "",
                         **({"branch": branch} if branch else {})}})
        try:
            for record in run:
                emit({"step": record.to_dict(), "vocab": texts(record.token_ids())})
                if self.stop.is_set():
                    run.stop()
        finally:
            run.release()
        emit({"end": {k: v for k, v in run.result.trace.to_dict().items() if k != "steps"}})

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


STREAMED = {"run", "sweep"}  # these emit items as they go; the others return one value
REQUESTS = STREAMED | {"switch_model"}


def serve(conn: Connection, stop: Event, spec: dict) -> None:
    """The engine process's loop: load the model, say ``ready``, then answer one request at a time.

    A request is ``(method, kwargs)``; the answer is ``("event", item)`` per streamed item and then
    ``("end", None)``, or one ``("result", value)``, or ``("error", exception)``.
    """
    engine_threads(spec.pop("threads", 0))
    memory_fraction = spec.pop("memory_fraction", None)
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
        conn.send(("error", _portable(exc)))
        return
    conn.send(("ready", engine.describe()))
    while True:
        try:
            method, kwargs = conn.recv()
        except (EOFError, OSError):  # the page process went away
            return
        if method == "close":
            return
        if method not in REQUESTS:
            conn.send(("error", DllmError(f"the engine has no request {method!r}")))
            continue
        failure = None
        try:
            if method in STREAMED:
                getattr(engine, method)(**kwargs, emit=lambda item: conn.send(("event", item)))
                conn.send(("end", None))
            else:
                conn.send(("result", getattr(engine, method)(**kwargs)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back as a message; the engine keeps serving
            failure = failure_kind(exc)
            if failure is None:
                conn.send(("error", _portable(exc)))
            else:
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # Outside the except block: the traceback no longer holds the run's tensors.
        if failure == "oom":
            free_device_memory()
            conn.send(("error", OutOfMemory(LOAD_OOM_ADVICE if method == "switch_model" else OOM_ADVICE)))
        elif failure == "fatal":
            conn.send(("error", EngineError(f"the GPU reported an error it cannot recover from ({detail}); the engine "
                                            f"process ends, and the next request starts it again with the model")))
            return
        if engine.handle is None:  # a failed switch could not bring the old model back either
            return


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a DllmError naming it; unexpected
    ones are also printed with their traceback here, for whoever reads the server's log."""
    if not isinstance(exc, DllmError):
        traceback.print_exception(exc)
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        return DllmError(f"{type(exc).__name__}: {exc}")
