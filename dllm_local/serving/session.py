"""The page's view of the engine: one loaded model, one run at a time, plain-dict records.

The model lives in an engine process (``dllm_local.serving.engine``); a ``Session`` starts it, sends it
requests and streams its answers back. No model work happens in the page process, so its Python
work (figures, Gradio) never holds the engine's GIL, slows a run or leaks into its timings. Runs
are never mixed: a second request while one is going raises ``BusyError`` (the page queues its
events, so they wait their turn instead); ``stop(run_id)`` ends the run or sweep started with that
``run_id`` within one step, and leaves anyone else's alone.
"""
from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
from typing import Callable, Iterator

from ..errors import BusyError, EngineError
from ..hub import HUB_MODELS, TINY_FAMILIES
from ..policies import registry
from ..settings import Settings
from ..trace import fold

MODEL_CHOICES = ["tiny", "tiny-diffusiongemma", *TINY_FAMILIES, *HUB_MODELS]
_ENDS = {"end", "result", "error", "dead"}


class Session:
    """Starts the engine process with ``model`` loaded (raises its load error, e.g. an unknown
    model) and talks to it. ``threads``: torch threads for a CPU model, 0 = all cores but one.
    ``memory_fraction``: the share of the GPU's memory the engine may use (None: all of it), for a
    GPU shared with other programs. ``ray``: the Ray cluster the engine runs sweeps on (None: the
    engine itself; the page process never imports Ray). ``lazy``: return at once and wait for the
    model (and raise its error) on first use."""

    def __init__(self, model: str = "tiny", device: str = "auto", quantization: str | None = None,
                 guider: str | None = "tiny-guider", threads: int = 0, lazy: bool = False,
                 memory_fraction: float | None = None, ray: str | None = None) -> None:
        self._spec = {"model": model, "device": device, "quantization": quantization, "guider": guider,
                      "ray": ray, "threads": threads, "memory_fraction": memory_fraction,
                      "policies": registry.load_plugins()}
        self._lock = threading.Lock()
        self._owner: str | None = None  # the run_id of the request in progress
        self._start()
        if not lazy:
            self._described  # noqa: B018 - raises the engine's load error (an unknown model) here

    # ---------------------------------------------------------------- the engine process
    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch or OpenMP state
        self._conn, child_conn = ctx.Pipe()
        self._stop = ctx.Event()
        self._process = ctx.Process(target=_serve, args=(child_conn, self._stop, dict(self._spec)),
                                    name="dllm-engine", daemon=True)
        self._process.start()
        child_conn.close()
        # A reader thread drains the pipe at once, so the engine never waits on a page that is drawing.
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=_read, args=(self._conn, self._process, self._inbox), daemon=True).start()
        self._ready: dict | None = None
        self._failure: BaseException | None = None

    @property
    def _described(self) -> dict:
        """The engine's ``ready`` message, waited for on first use: the page process imports its
        UI while the engine loads the model. A failed start raises its error (every time, until a
        request starts the engine again)."""
        if self._ready is None and self._failure is None:
            kind, payload = self._inbox.get()
            if kind == "ready":
                self._ready = payload
            else:
                self._process.join(5)
                self._failure = payload if kind == "error" else EngineError(
                    f"the engine process could not start ({payload})")
        if self._failure is not None:
            raise self._failure
        return self._ready

    def _request(self, method: str, on_wait: Callable[[float], None] | None = None, run_id: str | None = None,
                 **kwargs) -> Iterator:
        """Send one request under the session lock; yield its streamed items (or its one result).
        ``run_id`` names who started it (``stop`` takes the same id). A consumer that leaves early
        stops the work and waits for the engine to finish it."""
        if not self._lock.acquire(blocking=False):
            raise BusyError("a run is already going; wait for it or press Stop")
        self._owner = run_id
        answer = self._exchange(method, on_wait, kwargs)
        # Started at once: errors are raised here, and a dropped iterator still runs its clean-up.
        first = next(answer)
        return itertools.chain([first], answer)

    def _exchange(self, method: str, on_wait, kwargs: dict) -> Iterator:
        kind = "end"
        try:
            if not self._process.is_alive():
                self._start()
            self._described  # noqa: B018 - the engine has loaded its model
            self._stop.clear()
            self._conn.send((method, kwargs))
            kind = "sent"
            started = time.perf_counter()
            while True:
                try:
                    kind, payload = self._inbox.get(timeout=None if on_wait is None else 0.5)
                except queue.Empty:
                    on_wait(time.perf_counter() - started)
                    continue
                if kind in ("event", "result"):
                    yield payload
                elif kind == "error":
                    raise payload
                elif kind == "dead":
                    raise EngineError(f"the engine process ended unexpectedly ({payload}); "
                                      "it starts again with the next request")
                if kind in _ENDS:
                    return
        finally:
            if kind not in _ENDS:  # left early: stop the work and drain its answer
                self._stop.set()
                while kind not in _ENDS:
                    kind, _ = self._inbox.get()
            self._owner = None
            self._lock.release()

    def close(self) -> None:
        """End the engine process (it also ends with this one), stopping any run first."""
        self._stop.set()
        try:
            self._conn.send(("close", {}))  # taken once the current request, if any, has ended
        except OSError:
            pass
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()

    # ---------------------------------------------------------------- models
    def model_options(self) -> list[tuple[str, bool, str]]:
        """(name, usable here, reason) for the model picker."""
        return [(name, True, "") for name in MODEL_CHOICES]

    def quantization_options(self) -> list[tuple[str, bool, str]]:
        return [tuple(option) for option in self._described["quantization"]]

    def policy_specs(self) -> dict[str, list[dict]]:
        """The engine's policies as plain dicts by kind (``registry.all_specs()``): the page's choices."""
        return self._described["policies"]

    def info(self) -> dict:
        return self._described["info"]

    def switch_model(self, name: str, quantization: str | None = None,
                     on_wait: Callable[[float], None] | None = None, run_id: str | None = None) -> dict:
        """Load another model in place of the current one; ``on_wait(seconds)`` is called about
        twice a second while it loads."""
        self._ready = next(self._request("switch_model", on_wait, run_id, name=name, quantization=quantization))
        self._spec.update(model=name, quantization=quantization)
        return self.info()

    # ---------------------------------------------------------------- runs
    def run(self, prompt, settings: dict | Settings, run_id: str | None = None,
            branch: dict | None = None) -> Iterator[dict]:
        """Stream one generation as plain dicts, each with ``"trace"``: the trace so far (see
        ``dllm_local.trace.fold``).

        First ``{"start": header}`` (prompt ids, lengths, settings: enough to draw the empty grid),
        then ``{"step": record, "vocab": {id: text}}`` per forward (texts of newly seen tokens),
        then ``{"end": ...}``, whose ``"trace"`` is the whole trace. Bad settings raise here,
        before anything streams. ``run_id``: who started it, for ``stop(run_id)``. ``branch``: the
        run repeated with one change after one step (``dllm_local.trace.Branch`` as a dict).
        """
        settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
        return fold(self._request("run", run_id=run_id, prompt=prompt, settings=settings, branch=branch))  # validation errors raise here

    def stop(self, run_id: str | None = None) -> bool:
        """Stop the run or sweep in progress (within one step / one unit of problems) if it was started
        with ``run_id``; False, and nothing stopped, when nothing or another id's run is going.
        ``run_id=None`` stops whatever is going (for a program that owns the session alone)."""
        if not self._lock.locked() or (run_id is not None and run_id != self._owner):
            return False
        self._stop.set()
        return True

    def sweep(self, task: str, n: int, base: dict, axes: dict[str, list], seed: int = 1000,
              run_id: str | None = None) -> Iterator[dict]:
        """Stream a sweep: ``{"units": {done, total, throughput}}`` as problems finish, ``{"progress":
        {done, total, point, row}}`` per grid point, then ``{"report": ...}``."""
        return self._request("sweep", run_id=run_id, task=task, n=n, base=base, axes=axes, seed=seed)

    def waiting(self) -> int:
        """Messages the engine has sent that no one has read yet: during a streamed run, the steps
        it is ahead of the page that reads them."""
        return self._inbox.qsize()

    def owner(self) -> str | None:
        """The ``run_id`` of the request in progress (None when none, or started without one)."""
        return self._owner if self._lock.locked() else None


def _read(conn, process, inbox: queue.Queue) -> None:
    """Move the engine's messages into ``inbox`` as they come; say when the engine is gone."""
    while True:
        try:
            inbox.put(conn.recv())
        except (EOFError, OSError):
            process.join(1)
            inbox.put(("dead", f"exit code {process.exitcode}"))
            return


def _serve(*args) -> None:
    """The engine process's entry point (the engine module and the model code load there)."""
    from .engine import serve

    serve(*args)
