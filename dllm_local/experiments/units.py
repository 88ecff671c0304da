"""A sweep's or an evaluation's work as units a worker decodes: one grid point and a run of its
problems. Every problem decoded becomes one record, appended to a results file (JSON lines,
``results_file.py``) as it arrives; the report is built from the records alone. So a run in this process, on a Ray cluster
(``cluster.py``) or resumed from its results file reports the same, problem for problem: problem
``i`` always decodes with the point's settings and seed + ``i``.

Torch-free until a worker decodes: the CLI plans units and reads results files before any model loads.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol

from tqdm import tqdm

from ..tiny.tasks import check_task
from .results_file import RECORD, RESULTS_FORMAT, Record, Results, code_version, row_of

if TYPE_CHECKING:
    from ..models.loading.loader import GuiderHandle, ModelHandle
    from .problems import Problem

# The results file's names, importable from here as before.
__all__ = ["DEFAULT_CHUNK", "RECORD", "RESULTS_FORMAT", "Job", "LocalRunner", "ModelSpec", "OnUnit", "Record",
           "Results", "Runner", "Unit", "UnitDone", "Worker", "plan_units", "progress_bar", "report_unit", "row_of"]

DEFAULT_CHUNK = 4  # problems per unit: small enough that a lost worker costs little, large enough to hide dispatch
# With a batch, a unit holds at least this many batches' problems: continuous batching refills a
# finished request's slot from the unit's waiting problems, and only the unit's last batch drains.
BATCHES_PER_UNIT = 4


@dataclass(frozen=True)
class ModelSpec:
    """How a worker loads the model (a worker on another node loads it from its own disk)."""
    name: str = "tiny"
    device: str = "auto"
    quantization: str | None = None
    guider: str | None = None  # the guider model, for a policy that needs one
    threads: int | None = None


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to decode any unit of a run: small and picklable. ``points`` are
    the knob values of each grid point (one ``{}`` for an evaluation), ``settings`` each point's
    full settings (``Settings.to_dict``)."""
    model: ModelSpec
    task: str
    n: int
    seed_data: int
    points: tuple[dict, ...]
    settings: tuple[dict, ...]
    batch_size: int = 1
    base: dict = field(default_factory=dict)  # the settings the points vary (a sweep's report names them)

    def __post_init__(self) -> None:
        # Checked where the job is made: a worker that found a bad task would be told as a node failing.
        check_task(self.task, self.n)

    def identity(self) -> dict:
        """What a results file must match to be resumed: the same model, problems and settings
        and code (device, threads and batch size change no answer)."""
        return {"code": code_version(), "model": self.model.name, "quantization": self.model.quantization, "guider": self.model.guider,
                "task": self.task, "n": self.n, "seed_data": self.seed_data, "points": list(self.points),
                "settings": list(self.settings)}

    @property
    def total(self) -> int:
        return len(self.points) * self.n


@dataclass(frozen=True)
class Unit:
    point: int
    problems: tuple[int, ...]


def plan_units(job: Job, done: Iterable[tuple[int, int]] = (), chunk: int = DEFAULT_CHUNK) -> list[Unit]:
    """The units still to decode: each point's problems not in ``done``, ``chunk`` at a time
    (rounded up to whole batches; with a batch, at least ``BATCHES_PER_UNIT`` of them), points in order."""
    size = -(-max(int(chunk), 1) // job.batch_size) * job.batch_size
    if job.batch_size > 1:
        size = max(size, BATCHES_PER_UNIT * job.batch_size)
    done = set(done)
    units = []
    for point in range(len(job.points)):
        left = [i for i in range(job.n) if (point, i) not in done]
        units += [Unit(point, tuple(left[k : k + size])) for k in range(0, len(left), size)]
    return units


@dataclass
class UnitDone:
    """Progress, told after each unit: problems done of the total, the unit's records, which
    points it completed, and each worker's problems per second so far."""
    done: int
    total: int
    records: list[dict]
    completed_points: list[int]
    throughput: dict[str, float] = field(default_factory=dict)


OnUnit = Callable[[UnitDone], None]


class Runner(Protocol):
    def run(self, job: Job, units: list[Unit], results: Results, on_unit: OnUnit,
            cancel: threading.Event | None) -> None: ...


class Worker:
    """Decodes units of one job with one loaded model. In this process it takes the model already
    loaded; on a cluster node it loads the model itself (``load``)."""

    def __init__(self, job: Job, handle: ModelHandle, guider: GuiderHandle | None, name: str = "local") -> None:
        from ..settings import Settings
        from .problems import task_problems

        self.job, self.handle, self.guider, self.name = job, handle, guider, name
        self.settings = [Settings.from_dict(s) for s in job.settings]
        self.problems: list[Problem] = task_problems(job.task, job.n, job.seed_data)
        self.warm = False

    @classmethod
    def load(cls, job: Job, name: str) -> "Worker":
        from ..models.loading.loader import apply_threads, load, load_guider
        from ..settings import Settings

        spec = job.model
        handle = load(spec.name, device=spec.device, quantization=spec.quantization)
        handle.require_masked("a sweep")
        apply_threads(spec.threads, handle, batched=job.batch_size > 1)
        needs_guider = any(Settings.from_dict(s).unmask_spec.needs_guider for s in job.settings)
        guider = load_guider(spec.guider or "tiny-guider", device=handle.device) if needs_guider else None
        return cls(job, handle, guider, name)

    def run(self, unit: Unit) -> list[dict]:
        from ..decoding.batch import generate_all
        from ..decoding.sampler import generate

        settings = self.settings[unit.point]
        if not self.warm:  # first-call costs (allocations, kernel choice) stay out of the timings
            generate(self.handle, self.problems[unit.problems[0]].prompt, settings, self.guider)
            self.warm = True
        start = time.perf_counter()
        results = generate_all(self.handle, [self.problems[i].prompt for i in unit.problems],
                               [settings.for_problem(i) for i in unit.problems], self.guider, self.job.batch_size)
        wall = (time.perf_counter() - start) / len(unit.problems)
        stop_ids = set(self.handle.stop_ids)
        return [_record(unit.point, i, self.problems[i], r, wall, stop_ids, self.name)
                for i, r in zip(unit.problems, results)]


def _record(point: int, problem: int, ex: Problem, result, wall_s: float, stop_ids: set[int], worker: str) -> Record:
    s = result.stats
    cut = s.content_tokens
    return {"point": point, "problem": problem, "correct": bool(ex.is_correct(result.text)), "kind": ex.kind,
            "prompt": ex.prompt, "output": result.text, "token_ids": list(result.token_ids),
            "clean_end": cut > 0 and all(t in stop_ids for t in result.token_ids[cut:]),
            "nfe": s.nfe, "tau": s.tokens_per_forward, "tau_content": s.content_tokens_per_forward,
            "content_tokens": cut, "g": s.mean_g, "model_s": s.model_share_s, "wall_s": wall_s, "worker": worker}


class LocalRunner:
    """Units decoded one after another by one worker in this process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def run(self, job: Job, units: list[Unit], results: Results, on_unit: OnUnit,
            cancel: threading.Event | None) -> None:
        start, decoded = time.perf_counter(), 0
        for unit in units:
            if cancel is not None and cancel.is_set():
                return
            records = self.worker.run(unit)
            decoded += len(records)
            speed = {self.worker.name: decoded / max(1e-9, time.perf_counter() - start)}
            report_unit(results, records, on_unit, speed)


def report_unit(results: Results, records: list[dict], on_unit: OnUnit, throughput: dict[str, float]) -> None:
    """Keep a unit's records and tell ``on_unit``, naming the points they completed."""
    new = results.add(records)
    points = sorted({r["point"] for r in new if results.complete(r["point"])})
    on_unit(UnitDone(len(results.records), results.job.total, new, points, throughput))


@contextmanager
def progress_bar(results: Results, desc: str, disable: bool = False) -> Iterator[OnUnit]:
    """A bar over the problems done (those a resumed file holds counted from the start), with each
    worker's problems per second; yields the ``on_unit`` that moves it."""
    with tqdm(total=results.job.total, initial=len(results.records), desc=desc, unit="problem", disable=disable,
              mininterval=1) as bar:
        def on_unit(progress: UnitDone) -> None:
            bar.update(len(progress.records))
            bar.set_postfix_str(" ".join(f"{w} {v:.2f}/s" for w, v in progress.throughput.items()), refresh=False)
        yield on_unit
