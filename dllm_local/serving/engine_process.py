"""The engine process as the page's session holds it: the process, its pipe, the reader thread
that hands each answer to its request, and how its start went. A session replaces it when it
ends (``Session._engine_up``)."""
from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
import time
from dataclasses import dataclass, field

from ..errors import EngineError


@dataclass
class Request:
    """A request the engine is answering, as the session sees it: whose, what, where it stands."""
    owner: str | None
    method: str
    what: str  # a line for the lecturer's list: the prompt's start, or the sweep's task
    inbox: queue.Queue = field(default_factory=queue.Queue)
    place: int | None = None  # its place in line while it waits (None: not told yet); 0 once it runs
    steps: int = 0
    started: float = field(default_factory=time.time)
    engine: EngineProcess | None = None  # the process it was sent to: only that one's death ends it


def ended_how(exitcode: int | None) -> str:
    """How a process ended, as its exit code says it: a signal named (SIGKILL is what the kernel's
    out-of-memory killer sends)."""
    if exitcode is None or exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = "an unknown signal"
    memory = "; the system may have run out of memory" if -exitcode == signal.SIGKILL else ""
    return f"killed by signal {-exitcode}, {name}{memory}"


class EngineProcess:
    """One engine process: its pipe, and a reader thread that hands each of its messages to its
    request as it comes, so the engine never waits on a page that is drawing. ``settled`` is set
    once the process is ready, failed to start or died: every caller waiting for it wakes then,
    however many there are (one shared message queue woke only one of them)."""

    def __init__(self, spec: dict, requests: dict[str, Request], lock: threading.Lock) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch or OpenMP state
        self.conn, child_conn = ctx.Pipe()
        self.stop = ctx.Event()  # set by the engine's reader on a stop of the request that has it alone
        self.process = ctx.Process(target=_serve, args=(child_conn, self.stop, dict(spec)), name="dllm-engine",
                                   daemon=True)
        self.process.start()
        child_conn.close()
        self.settled = threading.Event()
        self.ready: dict | None = None
        self.failure: BaseException | None = None
        self.how: str | None = None  # how the process ended, once its reader has seen it end
        self._requests, self._lock = requests, lock
        threading.Thread(target=self._read, daemon=True).start()

    def alive(self) -> bool:
        """Whether it serves, or may yet: started and not ended (a failed start ends it)."""
        return self.process.is_alive() and self.failure is None

    def send(self, message: tuple) -> None:
        with self._lock:
            self.conn.send(message)

    def wait_ready(self) -> dict:
        """The engine's ``ready`` message, once it has loaded its model; its start's failure raised:
        its load error, or how the process ended."""
        self.settled.wait()
        if self.failure is not None:
            raise self.failure
        return self.ready

    def _read(self) -> None:
        while True:
            try:
                request_id, kind, payload = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(1)
                self._died(ended_how(self.process.exitcode))
                return
            if request_id is None:  # the engine's own: ready, or its load error
                self.ready, self.failure = (payload, None) if kind == "ready" else (None, payload)
                self.settled.set()
                continue
            request = self._requests.get(request_id)
            if request is None:  # its reader left and stopped waiting for it
                continue
            queued = kind == "event" and "queued" in payload
            request.place = payload["queued"] if queued else 0
            if kind == "event" and "step" in payload:
                request.steps += 1
            if not queued or request.method == "run":  # a run's page shows its place; the others just wait
                request.inbox.put((kind, payload))

    def _died(self, how: str) -> None:
        """Tell this process's open requests, and whoever waits for it to start, that it is gone."""
        if not self.settled.is_set():
            self.failure = EngineError(f"the engine process could not start ({how})")
            self.settled.set()
        elif self.failure is None:
            self.failure = EngineError(f"the engine process ended ({how})")
        self.how = how
        with self._lock:
            for request in self._requests.values():
                if request.engine is self:
                    request.inbox.put(("dead", (self, how)))


def _serve(*args) -> None:
    """The engine process's entry point (the engine module and the model code load there)."""
    from .engine import serve

    serve(*args)
