"""The page's view of the engine: one loaded model, many pages' runs at once, plain-dict records.

The model lives in an engine process (``dllm_local.serving.engine``); a ``Session`` starts it, sends it
requests and streams its answers back. No model work happens in the page process, so its Python
work (figures, Gradio) never holds the engine's GIL, slows a run or leaks into its timings. Every
request carries an id; the engine's answers come back tagged with it, and a reader thread hands
each to its own request. Runs from different pages decode together in the engine's continuous
batch (``scheduler``); a sweep or a model switch waits for the batch and then has the engine to
itself. ``stop(run_id)`` ends the requests started with that ``run_id`` within one step, and
leaves anyone else's alone.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Callable, Iterator

from ..errors import EngineError, SettingsError
from .engine_process import EngineProcess, Request
from ..hub import HUB_MODELS, TINY_FAMILIES
from ..limits import BATCH_MODE, BATCH_MODES, SLOTS
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
    engine itself; the page process never imports Ray). ``slots``: runs decoding at once in the
    engine's batch; ``max_length``: the positions each slot holds (None: the model's maximum);
    ``batch_mode``: how the batch runs its requests' forwards (``decoding.batch.BatchRun``);
    ``lecture_slots``: slots more, a lecturer's runs' only (``first``), so they never wait in line.
    ``lazy``: return at once and wait for the model (and raise its error) on first use.

    An engine that ended (killed for memory, a lost GPU context, a failed start) is started again
    by the next request; every request waiting for it then, however many, is answered once it is
    up, or told why it could not start."""

    def __init__(self, model: str = "tiny", device: str = "auto", quantization: str | None = None,
                 guider: str | None = "tiny-guider", threads: int = 0, lazy: bool = False,
                 memory_fraction: float | None = None, ray: str | None = None, slots: int = SLOTS,
                 max_length: int | None = None, batch_mode: str = BATCH_MODE, lecture_slots: int = 0) -> None:
        if batch_mode not in BATCH_MODES:  # said here, not at the first batched run
            raise SettingsError(f"the batch mode must be one of {', '.join(BATCH_MODES)} (not {batch_mode!r})")
        self._spec = {"model": model, "device": device, "quantization": quantization, "guider": guider,
                      "ray": ray, "threads": threads, "memory_fraction": memory_fraction,
                      "policies": registry.load_plugins(), "slots": slots, "max_length": max_length,
                      "batch_mode": batch_mode, "lecture_slots": lecture_slots}
        self._lock = threading.Lock()  # the open requests and the pipe's sending end
        self._starting = threading.Lock()  # one restart at a time: the others wait for it, not start their own
        self._open: dict[str, Request] = {}
        self._ids = itertools.count(1)
        self._engine = EngineProcess(self._spec, self._open, self._lock)
        if not lazy:
            self._described  # noqa: B018 - raises the engine's load error (an unknown model) here

    # ---------------------------------------------------------------- the engine process
    @property
    def _process(self):
        """The engine's process now (tests and the CUDA smoke script tell a restart by it)."""
        return self._engine.process

    def _engine_up(self) -> EngineProcess:
        """The engine, started again if it has ended; waits until it has loaded its model."""
        with self._starting:
            if not self._engine.alive() and self._engine.settled.is_set():
                self._engine = EngineProcess(self._spec, self._open, self._lock)
            engine = self._engine
        engine.wait_ready()
        return engine

    @property
    def _described(self) -> dict:
        """The engine's ``ready`` message, waited for on first use: the page process imports its
        UI while the engine loads the model. A failed start raises its error; the next request
        starts the engine again."""
        return self._engine_up().ready

    def _request(self, method: str, on_wait: Callable[[float], None] | None = None, run_id: str | None = None,
                 options: dict | None = None, what: str = "", **kwargs) -> Iterator:
        """Send one request; yield its streamed items (or its one result). ``run_id`` names who
        started it (``stop`` takes the same id). A consumer that leaves early stops the request and
        waits for the engine to end it."""
        engine = self._engine_up()
        request_id = str(next(self._ids))
        request = Request(run_id, method, what, engine=engine)
        with self._lock:
            self._open[request_id] = request
        answer = self._exchange(request_id, request, method, on_wait, kwargs, options or {})
        # Started at once: errors are raised here, and a dropped iterator still runs its clean-up.
        first = next(answer)
        return itertools.chain([first], answer)

    def _send_to_engine(self, request_id: str, request: Request, message: tuple) -> None:
        """Send ``message`` to the request's engine; one found dead (its reader may not have seen it
        end yet) tells the request so, as its reader tells the requests it had."""
        engine = request.engine
        try:
            engine.send(message)
        except OSError:
            pass
        if engine.how is not None:
            request.inbox.put(("dead", (engine, engine.how)))

    def _exchange(self, request_id: str, request: Request, method: str, on_wait, kwargs: dict,
                  options: dict) -> Iterator:
        """The request's answers as they come. An engine that dies before it has answered the
        request at all (it arrived as the engine died, before anyone saw it end) gets it again from
        the engine started in its place, once: its caller waits for that one, as everyone does."""
        kind, heard, resent = "end", False, False
        try:
            self._send_to_engine(request_id, request, (request_id, method, kwargs, options))
            kind = "sent"
            started = time.perf_counter()
            while True:
                try:
                    kind, payload = request.inbox.get(timeout=None if on_wait is None else 0.5)
                except queue.Empty:
                    on_wait(time.perf_counter() - started)
                    continue
                if kind == "dead":
                    engine, how = payload
                    if engine is not request.engine:  # the word of an engine it has left behind
                        continue
                    if not heard and not resent:
                        resent, request.engine = True, self._engine_up()
                        self._send_to_engine(request_id, request, (request_id, method, kwargs, options))
                        kind = "sent"
                        continue
                    raise EngineError(f"the engine process ended unexpectedly ({how}); "
                                      "it starts again with the next request")
                heard = True
                if kind in ("event", "result"):
                    yield payload
                elif kind == "error":
                    raise payload
                if kind in _ENDS:
                    return
        finally:
            if kind not in _ENDS:  # left early: stop the request and drain its answer
                self._send_to_engine(request_id, request, (request_id, "stop", {}, {}))
                while kind not in _ENDS:
                    kind, _ = request.inbox.get()
            with self._lock:
                self._open.pop(request_id, None)

    def close(self) -> None:
        """End the engine process (it also ends with this one), stopping every request first."""
        engine = self._engine
        engine.stop.set()
        try:
            engine.send((None, "close", {}, {}))
        except OSError:
            pass
        engine.process.join(10)
        if engine.process.is_alive():
            engine.process.kill()

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

    @property
    def batch_mode(self) -> str:
        """How the engine's batch runs its requests' forwards: "packed" or "invariant"."""
        return self._spec["batch_mode"]

    def switch_model(self, name: str, quantization: str | None = None,
                     on_wait: Callable[[float], None] | None = None, run_id: str | None = None) -> dict:
        """Load another model in place of the current one, once the runs going have ended;
        ``on_wait(seconds)`` is called about twice a second until it has loaded."""
        request = self._request("switch_model", on_wait, run_id, what=f"load {name}", name=name,
                                quantization=quantization)
        self._engine.ready = next(request)
        self._spec.update(model=name, quantization=quantization)
        return self.info()

    # ---------------------------------------------------------------- runs
    def run(self, prompt, settings: dict | Settings, run_id: str | None = None, branch: dict | None = None,
            first: bool = False, alone: bool = False) -> Iterator[dict]:
        """Stream one generation as plain dicts, each with ``"trace"``: the trace so far (see
        ``dllm_local.trace.fold``).

        ``{"queued": n}`` while it waits (n-th in line), then ``{"start": header}`` (prompt ids,
        lengths, settings: enough to draw the empty grid), ``{"step": record, "vocab": {id: text}}``
        per forward (texts of newly seen tokens), then ``{"end": ...}``, whose ``"trace"`` is the
        whole trace. Bad settings raise here, before anything streams. ``run_id``: who started it,
        for ``stop(run_id)``. ``branch``: the run repeated with one change after one step
        (``dllm_local.trace.Branch`` as a dict). ``first``: ahead of the waiting requests (a
        lecturer's). ``alone``: with the engine to itself, never beside another request (a run
        whose time is compared).
        """
        settings = settings if isinstance(settings, Settings) else Settings.from_dict(settings)
        what = " ".join(str(prompt if isinstance(prompt, str) else prompt[-1]["content"]).split())[:80]
        return fold(self._request("run", run_id=run_id, options={"first": first, "alone": alone}, what=what,
                                  prompt=prompt, settings=settings, branch=branch))  # validation errors raise here

    def stop(self, run_id: str | None = None) -> bool:
        """Stop the requests started with ``run_id`` (within one step / one unit of problems); False,
        and nothing stopped, when none is open. ``run_id=None`` stops every request (for a program
        that owns the session alone)."""
        with self._lock:
            ids = [i for i, request in self._open.items() if run_id is None or request.owner == run_id]
        for request_id in ids:
            try:
                self._open[request_id].engine.send((request_id, "stop", {}, {}))
            except (KeyError, OSError):  # it ended meanwhile, or its engine did (the request is told)
                pass
        return bool(ids)

    def sweep(self, task: str, n: int, base: dict, axes: dict[str, list], seed: int = 1000,
              run_id: str | None = None) -> Iterator[dict]:
        """Stream a sweep: ``{"units": {done, total, throughput}}`` as problems finish, ``{"progress":
        {done, total, point, row}}`` per grid point, then ``{"report": ...}``."""
        return self._request("sweep", run_id=run_id, what=f"sweep: {task}, {n} problems", task=task, n=n, base=base,
                             axes=axes, seed=seed)

    def waiting(self, run_id: str | None = None) -> int:
        """Messages the engine has sent for ``run_id``'s requests (all, if None) that no one has
        read yet: during a streamed run, the steps it is ahead of the page that reads them."""
        with self._lock:
            return sum(r.inbox.qsize() for r in self._open.values() if run_id is None or r.owner == run_id)

    def requests(self) -> list[dict]:
        """The requests open now, oldest first: owner, method, what, place in line (0: going), steps."""
        with self._lock:
            return [{"owner": r.owner, "method": r.method, "what": r.what, "place": r.place, "steps": r.steps,
                     "started": r.started} for r in self._open.values()]

    def owns(self, run_id: str) -> bool:
        """Whether a request started with ``run_id`` is open."""
        with self._lock:
            return any(r.owner == run_id for r in self._open.values())
