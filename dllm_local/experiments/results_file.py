"""A run's results file: one record per problem decoded, appended as a JSON line as it arrives
after a first line naming the job, read back through the record's schema to resume; and a grid
point's figures from its records alone.

Every record carries its job: a stamp of the unit it is (the model and code that decoded it, its
point's settings, its problem as the job generates it) and a seal over all its fields. On resume
each line is checked against the unit of this job it claims to be, so a line pasted from another
run's file or edited by hand is refused by its line number, and nothing is resumed from the file.

Torch-free: the CLI reads results files before any model loads.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
from functools import cache, cached_property
from pathlib import Path
from typing import Protocol

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from ..errors import DllmError, schema_message
from ..files import FileRefused, parse_json, read_bytes
from ..tiny.tasks import make_problems
from ..values import Count, Flag, Number, Text

# v2: each record carries its unit's stamp and a seal. A v1 file's records cannot be checked, so
# it is refused rather than trusted.
RESULTS_FORMAT = "dllm-local results v2"
_FORMATS = "dllm-local results v"
_DECODER = ("code", "model", "quantization", "guider")  # the job's keys that decode every unit alike
MAX_RESULTS_BYTES = 2**30  # a record is a few kB: hundreds of thousands of problems


class ResultsJob(Protocol):
    """What the results file reads of a job (``units.Job``): what a file must match to be resumed,
    and its points and problems."""

    @property
    def points(self) -> tuple[dict, ...]: ...

    @property
    def n(self) -> int: ...

    @property
    def total(self) -> int: ...

    def identity(self) -> dict: ...


@cache
def code_version() -> str:
    """The engine's source, hashed: a resumed file's answers came from the code that goes on with it."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


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


class Stamp(TypedDict):
    """What ties a record to its job, each a ``digest``: what decoded it (model and code), its
    point's settings, its problem (task, data seed, index, prompt and answer)."""
    decoder: Text
    settings: Text
    problem: Text


class Line(Record):
    """A record as the file holds it."""
    unit: Stamp
    seal: Text  # the digest of every other field: a line edited after it was written no longer matches


LINE = TypeAdapter(Line)


def digest(value: object) -> str:
    """A short hash of a JSON value, the same whatever the order of its keys."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


class Results:
    """The records of a run, by (point, problem): each kept once, however often a unit ran (a
    lost worker's unit runs again elsewhere). With a ``path`` each new record is appended to it as
    a JSON line as it arrives, after a first line naming the job; ``resume`` reads a file that a
    stopped run left and goes on appending to it."""

    def __init__(self, job: ResultsJob, path: str | Path | None = None, resume: bool = False) -> None:
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
        data = read_bytes(self.path, MAX_RESULTS_BYTES, f"the results file {self.path}")
        # Every record ends with a newline: text after the last one is a record a stopped run did
        # not finish writing. It is left out, and cut from the file once the file is known to be ours.
        whole = data[: data.rfind(b"\n") + 1]
        try:
            lines = whole.decode("utf-8").splitlines()
            first = parse_json(lines[0]) if lines else None
        except (UnicodeDecodeError, FileRefused):
            first = None
        fmt = first.get("format") if isinstance(first, dict) else None
        if isinstance(fmt, str) and fmt.startswith(_FORMATS) and fmt != RESULTS_FORMAT:
            raise DllmError(f"{self.path} was written by another version of dllm-local ({fmt[:40]!r}; this one writes "
                            f"{RESULTS_FORMAT!r}) and its records cannot be checked against this run: run the "
                            "command again with a new results file")
        if fmt != RESULTS_FORMAT:
            raise DllmError(f"{self.path} is not a results file of dllm-local (its first line names none)")
        if first.get("job") != header["job"]:
            theirs = first.get("job") if isinstance(first.get("job"), dict) else {}
            differ = [k for k in header["job"] if theirs.get(k) != header["job"][k]]
            code = " (dllm-local's code changed since it was written: its answers may differ)" * ("code" in differ)
            raise DllmError(f"{self.path} holds the results of another run: these differ from this command's: "
                            f"{', '.join(differ)}{code}. Resume with the same model, task, --n, --seed-data and "
                            "settings, or name a new results file")
        # Every record is checked before any is kept: nothing is resumed from a file with a foreign line.
        records = [self._record(line, number) for number, line in enumerate(lines[1:], 2)]
        for record in records:
            self.records.setdefault((record["point"], record["problem"]), record)
        if len(whole) < len(data):
            with self.path.open("rb+") as f:
                f.truncate(len(whole))

    def _record(self, line: str, number: int) -> Record:
        """Line ``number`` of the file as a record of this job: read through its schema, its seal
        checked (no field edited), and its stamp against the unit of this job it claims to be."""
        where = f"{self.path} line {number}"
        try:
            raw = parse_json(line, where)
            row = LINE.validate_python(raw)
        except FileRefused as exc:
            raise DllmError(f"{exc}: it is not a result record") from None
        except ValidationError as exc:
            raise DllmError(f"{where} is not a result record: "
                            f"{schema_message(exc, raw, subject='the record')}") from None
        refuse = ("; nothing was resumed from the file: resume the file this command wrote as it wrote it, "
                  "or name a new results file")
        if digest({k: v for k, v in raw.items() if k != "seal"}) != raw["seal"]:
            raise DllmError(f"{where} was edited after it was written: its fields no longer match its seal{refuse}")
        point, problem = row["point"], row["problem"]
        if point >= len(self.job.points) or problem >= self.job.n:
            raise DllmError(f"{where} holds point {point}, problem {problem}: this run has {len(self.job.points)} "
                            f"points of {self.job.n} problems{refuse}")
        want, have = self._stamp(point, problem), row["unit"]
        differ = [what for key, what in (("decoder", "the model or dllm-local's code that decoded it"),
                                         ("settings", f"point {point}'s settings"),
                                         ("problem", f"problem {problem} (its task, data seed, prompt or answer)"))
                  if have[key] != want[key]]
        if differ:
            raise DllmError(f"{where} holds a record of another run: {' and '.join(differ)} "
                            f"{'differ' if len(differ) > 1 else 'differs'} from this run's{refuse}")
        return {k: v for k, v in row.items() if k not in ("unit", "seal")}

    @cached_property
    def _units(self) -> tuple[str, list[str], list[str]]:
        """The digests of this job's units: what decodes them, each point's settings, each problem."""
        job = self.job.identity()
        examples = make_problems(job["task"], job["n"], job["seed_data"])
        return (digest({k: job[k] for k in _DECODER}), [digest(s) for s in job["settings"]],
                [digest([job["task"], job["seed_data"], i, ex.prompt, ex.answer]) for i, ex in enumerate(examples)])

    def _stamp(self, point: int, problem: int) -> Stamp:
        decoder, settings, problems = self._units
        return {"decoder": decoder, "settings": settings[point], "problem": problems[problem]}

    def _line(self, record: dict) -> dict:
        """``record`` as the file holds it: stamped with its unit of this job, then sealed."""
        line = {**record, "unit": self._stamp(record["point"], record["problem"])}
        return {**line, "seal": digest(line)}

    def _write(self, rows: list[dict], mode: str = "a") -> None:
        with self.path.open(mode, encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    def add(self, records: list[dict]) -> list[dict]:
        """Keep the records not seen yet (appended to the file first); return those."""
        new = [r for r in records if (r["point"], r["problem"]) not in self.records]
        if new and self.path is not None:
            # The file starts with the first record: a run that fails before any leaves no file.
            try:
                lines = [self._line(r) for r in new]
                self._write(([self._header] if self._header else []) + lines, "w" if self._header else "a")
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
