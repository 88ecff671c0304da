"""The engine's requests, from every page at once: runs decode together in one continuous batch,
the rest one at a time.

1. Requests arrive on the pipe as ``(request_id, method, kwargs, options)``; a reader thread
   queues them and acts on a ``stop`` at once (the main thread may be deep in a sweep).
2. They wait in arrival order; a lecturer's (``options["first"]``) goes ahead of the waiting ones,
   and in a lab the batch holds ``lecture_slots`` more slots for a lecturer's runs only: one
   starts at the batch's next step, never waiting for a student's run to finish.
3. A run the batch can take (a LLaDA-family model; no exact drift, no guider, not ``alone``; in
   batch mode ``packed`` no compiled or graphs forward mode and no attention backend but the
   default named) joins the batch: it takes a free slot of ``slots``, or waits for one, and is told
   its place in line (``{"queued": n}``) whenever it changes. Its first forward is packed with the
   others' (``invariant``: its own, as alone, in the same loop).
4. Anything else (a sweep, a model switch, a run timed alone, a lecturer's run longer than a
   lab's slots) waits until the batch has drained,
   then has the engine to itself; runs behind it wait for it.
5. Every step goes back to its own request, ``(request_id, "event", item)``, then
   ``(request_id, "end", None)``, or ``(request_id, "result", value)`` / ``(request_id, "error", exc)``.
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from .. import kinds
from ..decoding.batch import BatchRun, TooLong
from ..errors import DllmError, EngineError, NeverRanError, OutOfMemory
from ..limits import BATCH_MODE, SLOTS
from ..models.loading.loader import free_device_memory
from ..decoding.sampler import Run
from ..settings import Settings, knob
from ..trace import Branch
from .failures import LOAD_OOM_ADVICE, OOM_ADVICE, failure_kind, portable

# Without a lab's --max-gen-length, a batch's slots hold its first run's positions rounded up to
# this: runs of about its length join it; a longer one waits for the batch to end.
SLOT_ROUNDING = 512
STREAMED = {"run", "sweep"}  # these emit items as they go; the others return one value
REQUESTS = STREAMED | {"switch_model"}
def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class Request:
    id: str
    method: str
    kwargs: dict
    options: dict = field(default_factory=dict)  # first: a lecturer's; alone: never batched (timed alone)
    told: int = 0  # the place in line it was last told (0: none yet, or decoding)


class Scheduler:
    """The engine process's loop over ``engine`` (``serving.engine.Engine``), answering on ``conn``."""

    def __init__(self, engine, conn: Connection, slots: int = SLOTS, max_length: int | None = None,
                 batch_mode: str = BATCH_MODE, lecture_slots: int = 0) -> None:
        """``max_length``: the positions each slot holds (None: the model's maximum); ``batch_mode``:
        the batch's (``BatchRun``); ``lecture_slots``: its slots for ``first`` runs only (``reserved``)."""
        self.engine, self.conn = engine, conn
        self.slots, self.max_length, self.batch_mode = slots, max_length, batch_mode
        self.lecture_slots = lecture_slots
        self.inbox: queue.Queue = queue.Queue()
        self.stops: set[str] = set()
        self.lock = threading.Lock()
        self.exclusive: str | None = None  # the request that has the engine to itself
        self.pending: deque[Request] = deque()
        self.batch: BatchRun | None = None
        self.records = None  # the batch's iterator
        self.members: dict[int, tuple[Request, object]] = {}  # batch number -> request, its event stream
        self.closed = False

    # ---------------------------------------------------------------- the pipe
    def send(self, request_id: str | None, kind: str, payload) -> None:
        self.conn.send((request_id, kind, payload))

    def read(self) -> None:
        """The reader thread: queue requests, act on stops at once, end on close or a lost pipe."""
        while True:
            try:
                request_id, method, kwargs, options = self.conn.recv()
            except (EOFError, OSError):
                method = "close"
            if method == "stop":
                with self.lock:
                    self.stops.add(request_id)
                    if request_id == self.exclusive:
                        self.engine.stop.set()
                continue
            self.inbox.put(None if method == "close" else Request(request_id, method, kwargs, options))
            if method == "close":
                self.engine.stop.set()
                return

    # ---------------------------------------------------------------- the loop
    def serve(self) -> None:
        threading.Thread(target=self.read, daemon=True).start()
        while not self.closed:
            self._take(block=self.batch is None and not self.pending)
            self._apply_stops()
            if self.batch is None and self.pending and not self._batchable(self.pending[0]):
                self._alone(self.pending.popleft())
                if self.engine.handle is None:  # a failed switch could not bring the old model back either
                    return
                continue
            while self.pending and self._batchable(self.pending[0]) and self._join(self.pending[0]):
                self.pending.popleft()
            self._tell_places()
            if self.batch is not None:
                self._step()

    def _take(self, block: bool) -> None:
        """Move what arrived into ``pending``: a lecturer's request ahead of the waiting ones."""
        try:
            item = self.inbox.get() if block else self.inbox.get_nowait()
            while True:
                if item is None:
                    self.closed = True
                    return
                if item.method not in REQUESTS:
                    self.send(item.id, "error", DllmError(f"the engine has no request {item.method!r}"))
                elif not self._settings_read(item):
                    pass
                elif item.options.get("first"):
                    self.pending.appendleft(item)
                else:
                    self.pending.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _settings_read(self, request: Request) -> bool:
        """A run's settings as ``Settings`` (the session sends them so; a dict is read here), or its error."""
        if request.method == "run" and not isinstance(request.kwargs["settings"], Settings):
            try:
                request.kwargs["settings"] = Settings.from_dict(request.kwargs["settings"])
            except Exception as exc:  # noqa: BLE001 - this request's settings: its error alone
                self.send(request.id, "error", portable(exc))
                return False
        return True

    def _batchable(self, request: Request) -> bool:
        handle, settings = self.engine.handle, request.kwargs.get("settings")
        if request.method != "run" or request.options.get("alone") or not kinds.get(handle.kind).shares_batch:
            return False
        # In a packed batch one runner runs every request's forward, in the mode auto picks and the
        # default attention backend: a run that names others runs alone, in them. An invariant batch
        # runs each request's forward with its own runner, as alone.
        return (handle.model.packs_requests and not settings.exact_drift and not settings.unmask_spec.needs_guider
                and (self.batch_mode == "invariant" or (settings.forward_mode not in ("compiled", "graphs")
                                                        and settings.attention_backend == knob("attention_backend").default)))

    def _apply_stops(self) -> None:
        with self.lock:
            stops, self.stops = self.stops, set()
        for number, (request, _) in list(self.members.items()):
            if request.id in stops and self.batch.withdraw(number):  # never started: ends unrun
                del self.members[number]
                self.send(request.id, "error", NeverRanError())
            elif request.id in stops:
                self.batch.stop(number)
        for request in [r for r in self.pending if r.id in stops]:
            self.pending.remove(request)
            self.send(request.id, "error", NeverRanError())


    def _tell_places(self) -> None:
        """Each waiting request's place in line, when it changed: those the batch's free slots take
        at its next forward wait for nothing; then the batch's waiting ones, then ``pending``."""
        waiting = []
        if self.batch is not None:
            waiting = [self.members[n][0] for n in list(self.batch.waiting)[self.batch.free_slots :]]
        for place, request in enumerate([*waiting, *self.pending], start=1):
            if request.told != place:
                request.told = place
                self.send(request.id, "event", {"queued": place})

    # ---------------------------------------------------------------- one request alone
    def _alone(self, request: Request) -> None:
        with self.lock:
            self.exclusive = request.id
            self.engine.stop.clear()
            if request.id in self.stops:  # stopped as it left the line
                self.engine.stop.set()
        failure = None
        if request.method != "run":  # a run says so with its header
            self.send(request.id, "event", {"queued": 0})
        try:
            method = getattr(self.engine, request.method)
            if request.method in STREAMED:
                method(**request.kwargs, emit=lambda item: self.send(request.id, "event", item))
                self.send(request.id, "end", None)
            else:
                self.send(request.id, "result", method(**request.kwargs))
        except Exception as exc:  # noqa: BLE001 - every failure goes back as a message; the engine keeps serving
            failure = self._failed(exc, [request.id])
        finally:
            with self.lock:
                self.exclusive = None
        self._recover(failure, [request.id], request.method == "switch_model")

    # ---------------------------------------------------------------- the batch
    def _join(self, request: Request) -> bool:
        """Start ``request``'s stream and give it to the batch (a new batch if none is going).
        False: it is longer than the batch's slots, and waits for the batch to end."""
        kwargs = request.kwargs
        try:
            settings = kwargs["settings"]
            branch = Branch(**kwargs["branch"]) if kwargs.get("branch") else None
            if self.batch is None:
                handle = self.engine.handle
                length = self.max_length or round_up(Run(handle, kwargs["prompt"], settings, None, branch).state_length,
                                                     SLOT_ROUNDING)
                self.batch = BatchRun(handle, [], [], slots=self.slots, max_len=min(handle.max_length, length),
                                      finished=self._finished, batch_mode=self.batch_mode,
                                      reserved=self.lecture_slots)
                self.records = iter(self.batch)
            number = self.batch.add(kwargs["prompt"], settings, first=bool(request.options.get("first")), branch=branch)
        except TooLong:  # it waits for the batch to end: the next batch's slots are sized for it, or a
            # lab's slots (--max-gen-length, which a lecturer may pass) are not: then it runs alone
            request.options["alone"] = self.max_length is not None
            return False
        except Exception as exc:  # noqa: BLE001 - this request's settings: its error alone
            self.send(request.id, "error", portable(exc))
            return True
        self.members[number] = member = (request, self.engine.events(self.batch.runs[number], settings,
                                                                     kwargs.get("branch")))
        if list(self.batch.waiting).index(number) < self.batch.free_slots:  # its page draws the empty grid meanwhile
            self._started(*member)
        return True

    def _started(self, request: Request, stream) -> None:
        """The run's header, sent as it takes its slot (a run waiting in line has drawn nothing)."""
        if not stream.started:
            self.send(request.id, "event", stream.start())

    def _finished(self, number: int) -> None:
        request, stream = self.members.pop(number)
        self._started(request, stream)
        self.send(request.id, "event", stream.end())
        self.send(request.id, "end", None)

    def _step(self) -> None:
        """The batch's next record to its request; the batch dropped when every request is done."""
        failure = None
        try:
            number, record = next(self.records)
            request, stream = self.members[number]
            self._started(request, stream)
            self.send(request.id, "event", stream.step(record))
            return
        except StopIteration:
            pass
        except Exception as exc:  # noqa: BLE001 - the batch's forward failed: every request in it hears why
            ids = [request.id for request, _ in self.members.values()]
            failure = self._failed(exc, ids)
        ids = [request.id for request, _ in self.members.values()]
        self.batch = self.records = None
        self.members = {}
        self._recover(failure, ids, False)

    # ---------------------------------------------------------------- failures
    def _failed(self, exc: Exception, ids: list[str]) -> str | None:
        failure = failure_kind(exc)
        if failure is None:
            for request_id in ids:
                self.send(request_id, "error", portable(exc))
        else:
            self._detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return failure

    def _recover(self, failure: str | None, ids: list[str], loading: bool) -> None:
        """Outside the except block, so the traceback no longer holds the run's tensors."""
        if failure == "oom":
            free_device_memory()
            for request_id in ids:
                self.send(request_id, "error", OutOfMemory(LOAD_OOM_ADVICE if loading else OOM_ADVICE))
        elif failure == "fatal":
            for request_id in ids:
                self.send(request_id, "error", EngineError(
                    f"the GPU reported an error it cannot recover from ({self._detail}); the engine process ends, "
                    f"and the next request starts it again with the model"))
            self.closed = True
