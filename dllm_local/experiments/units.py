"""A sweep's or an evaluation's work as units a worker decodes: one grid point and a run of its
problems. Every problem decoded becomes one record, appended to a results file (JSON lines) as it
arrives; the report is built from the records alone. So a run in this process, on a Ray cluster
(``cluster.py``) or resumed from its results file reports the same, problem for problem: problem
``i`` always decodes with the point's settings and seed + ``i``.

Torch-free until a worker decodes: the CLI plans units and reads results files before any model loads.
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol

from pydantic import TypeAdapter, ValidationError
from tqdm import tqdm
from typing_extensions import TypedDict

from ..errors import DllmError, schema_message
from ..values import Count, Flag, Number, Text
from ..tiny.tasks import check_task

if TYPE_CHECKING:
    from ..models.loader import GuiderHandle, ModelHandle
    from .problems import Problem

RESULTS_FORMAT = "dllm-local results v1"
DEFAULT_CHUNK = 4  # problems per unit: small enough that a lost worker costs little, large enough to hide dispatch


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
        (device, threads and batch size change no answer)."""
        return {"model": self.model.name, "quantization": self.model.quantization, "guider": self.model.guider,
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
    (rounded up to whole batches), points in order."""
    size = -(-max(int(chunk), 1) // job.batch_size) * job.batch_size
    done = set(done)
    units = []
    for point in range(len(job.points)):
        left = [i for i in range(job.n) if (point, i) not in done]
        units += [Unit(point, tuple(left[k : k + size])) for k in range(0, len(left), size)]
    return units


class Record(TypedDict):
    """One problem decoded: a line of the results file, read back through this schema on --resume."""
    point: Count
    problem: Count
    correct: Flag
    kind: Text
    prompt: Text
    output: Text
    token_ids: list[Count]
    clean_end: Flag  # everything after the content is end-of-text padding
    nfe: Count
    tau: Number
    tau_content: Number
    content_tokens: Count
    g: Number
    model_s: Number  # this problem's share of the forwards' time (a batch's split by positions computed)
    wall_s: Number
    worker: Text


RECORD = TypeAdapter(Record)


class Results:
    """The records of a run, by (point, problem): each kept once, however often a unit ran (a
    lost worker's unit runs again elsewhere). With a ``path`` each new record is appended to it as
    a JSON line as it arrives, after a first line naming the job; ``resume`` reads a file that a
    stopped run left and goes on appending to it."""

    def __init__(self, job: Job, path: str | Path | None = None, resume: bool = False) -> None:
        self.job, self.path = job, Path(path) if path else None
        self.records: dict[tuple[int, int], dict] = {}
        self._header: dict | None = None  # written before the first record of a new file
        if self.path is None:
            return
        self._header = {"format": RESULTS_FORMAT, "job": job.identity()}
        if resume:
            self._read(self._header)
            self._header = None
        elif self.path.is_dir() or not os.access(self.path.parent, os.W_OK):
            if self.path.is_dir():
                why = "it is a folder"
            elif not self.path.parent.is_dir():
                why = "its folder does not exist"
            else:
                why = "its folder is not writable"
            raise DllmError(f"cannot write the results file {self.path}: {why}")
        elif self.path.exists() and self.path.stat().st_size:
            raise DllmError(f"the results file {self.path} already holds results: go on with it with "
                            f"--resume {self.path}, or name a new file")

    def _read(self, header: dict) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise DllmError(f"cannot read the results file {self.path}: {exc.strerror or exc}") from exc
        # Every record ends with a newline: text after the last one is a record a stopped run did
        # not finish writing. It is left out, and cut from the file once the file is known to be ours.
        whole = data[: data.rfind(b"\n") + 1]
        try:
            lines = whole.decode("utf-8").splitlines()
            first = json.loads(lines[0]) if lines else None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            first = None
        if not isinstance(first, dict) or first.get("format") != RESULTS_FORMAT:
            raise DllmError(f"{self.path} is not a results file of dllm-local (its first line names none)")
        if first.get("job") != header["job"]:
            theirs = first.get("job") if isinstance(first.get("job"), dict) else {}
            differ = [k for k in header["job"] if theirs.get(k) != header["job"][k]]
            raise DllmError(f"{self.path} holds the results of another run: these differ from this command's: "
                            f"{', '.join(differ)}. Resume with the same model, task, --n, --seed-data and settings, "
                            "or name a new results file")
        for number, line in enumerate(lines[1:], 2):
            try:
                raw = json.loads(line)
                record = RECORD.validate_python(raw)
            except (json.JSONDecodeError, RecursionError):
                raise DllmError(f"{self.path} line {number} is not a result record (not JSON)") from None
            except ValidationError as exc:
                raise DllmError(f"{self.path} line {number} is not a result record: "
                                f"{schema_message(exc, raw, subject='the record')}") from None
            key = (record["point"], record["problem"])
            if key[0] < len(self.job.points) and key[1] < self.job.n:
                self.records.setdefault(key, record)
        if len(whole) < len(data):
            with self.path.open("rb+") as f:
                f.truncate(len(whole))

    def _write(self, rows: list[dict], mode: str = "a") -> None:
        with self.path.open(mode, encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    def add(self, records: list[dict]) -> list[dict]:
        """Keep the records not seen yet (appended to the file first); return those."""
        new = [r for r in records if (r["point"], r["problem"]) not in self.records]
        if new and self.path is not None:
            # The file starts with the first record: a run that fails before any leaves no file.
            try:
                self._write(([self._header] if self._header else []) + new, "w" if self._header else "a")
            except OSError as exc:
                raise DllmError(f"cannot append to the results file {self.path} ({exc.strerror or exc}); the "
                                f"{len(self.records)} problems before these are in it") from None
            self._header = None
        for r in new:
            self.records[(r["point"], r["problem"])] = r
        return new

    def of_point(self, point: int) -> list[dict]:
        return [self.records[(point, i)] for i in range(self.job.n) if (point, i) in self.records]

    def complete(self, point: int) -> bool:
        return all((point, i) in self.records for i in range(self.job.n))


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
        from ..models.loader import apply_threads, load, load_guider
        from ..settings import Settings

        spec = job.model
        handle = load(spec.name, device=spec.device, quantization=spec.quantization)
        apply_threads(spec.threads, handle, batched=job.batch_size > 1)
        needs_guider = any(Settings.from_dict(s).unmask_spec.needs_guider for s in job.settings)
        guider = load_guider(spec.guider or "tiny-guider", device=handle.device) if needs_guider else None
        return cls(job, handle, guider, name)

    def run(self, unit: Unit) -> list[dict]:
        from ..batch import generate_all
        from ..sampler import generate

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


def row_of(records: list[dict]) -> dict:
    """One point's figures from its problems' records: accuracy, the means of NFE, tokens per
    forward (all, and content only) and G, content tokens per second of model time, and the
    model and wall time per answer."""
    model_total = sum(r["model_s"] for r in records)
    return {
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "nfe": statistics.mean(r["nfe"] for r in records),
        "tau": statistics.mean(r["tau"] for r in records),
        "tau_content": statistics.mean(r["tau_content"] for r in records),
        "g": statistics.mean(r["g"] for r in records),
        "model_tok_s": sum(r["content_tokens"] for r in records) / model_total if model_total else 0.0,
        "model_s": model_total / len(records),
        "wall_s": statistics.mean(r["wall_s"] for r in records),
    }
