"""Every record of a results file carries its job: on --resume each line is checked against the
unit of this run it claims to be (the model and code, its point's settings, its problem), and a
line from another run's file, or one edited by hand, is refused by its line number with nothing
resumed. Real sweeps of the tiny model, two problems of eight tokens."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dllm_local.cli import main as cli_main
from dllm_local.errors import DllmError
from dllm_local.experiments.results_file import Line, Stamp
from dllm_local.experiments.sweep import run_sweep, sweep_job
from dllm_local.experiments.units import LocalRunner, Results, Worker
from dllm_local.settings import Settings

SWEEP = ["sweep", "--n", "2", "--block-sizes", "8", "--block-size", "8", "--gen-length", "8", "--quiet"]
OURS = ["--task", "arithmetic", "--thresholds", "0.5,0.9"]


def splice(ours: str, theirs: str) -> str:
    """Our file's header and point-0 records, then the other run's point-1 records."""
    mine, other = ours.splitlines(), theirs.splitlines()
    return "\n".join([mine[0], *[line for line in mine[1:] if json.loads(line)["point"] == 0],
                      *[line for line in other[1:] if json.loads(line)["point"] == 1]]) + "\n"


@pytest.mark.parametrize("theirs, named", [
    (["--task", "sums", "--thresholds", "0.5,0.9"], "problem 0 (its task, data seed, prompt or answer) differ"),
    (["--task", "arithmetic", "--thresholds", "0.5,0.7"], "point 1's settings differ"),
    (["--task", "arithmetic", "--thresholds", "0.5,0.9", "--seed-data", "7"], "problem 0 (its task, data seed"),
], ids=["another task, same grid", "another grid", "another data seed"])
def test_records_of_another_run_under_this_runs_header_are_refused_naming_the_line(tmp_path, capsys, theirs, named):
    """The issue's case: a file whose header is this sweep's but whose point-1 records came from
    another sweep resumed silently, its table and AUP taken from the other run's answers."""
    ours, other, spliced = tmp_path / "ours.jsonl", tmp_path / "theirs.jsonl", tmp_path / "spliced.jsonl"
    assert cli_main([*SWEEP, *OURS, "--results", str(ours)]) == 0
    assert cli_main([*SWEEP, *theirs, "--results", str(other)]) == 0
    spliced.write_text(splice(ours.read_text(), other.read_text()))
    before = spliced.read_text()
    capsys.readouterr()
    assert cli_main([*SWEEP, *OURS, "--resume", str(spliced)]) == 2
    err = capsys.readouterr().err
    assert f"error: {spliced} line 4 holds a record of another run: " in err and named in err, err
    assert "nothing was resumed from the file" in err and "Traceback" not in err
    assert spliced.read_text() == before  # nothing decoded, nothing appended


# ---------------------------------------------------------------- one field of one record changed

TIMINGS = ("model_tok_s", "model_s", "wall_s")
FIELDS = [k for k in Line.__annotations__ if k != "unit"] + [f"unit.{k}" for k in Stamp.__annotations__]
VALUES = (st.none() | st.booleans() | st.integers(-2, 40) | st.floats(-1, 50) | st.text(max_size=6)
          | st.lists(st.integers(0, 40), max_size=3))


def figures(report: dict) -> list[dict]:
    """A sweep's table and curves without the measured times, which no two runs share."""
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in report["rows"]] + [report["policies"]]


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    """A real sweep's results file, with the figures of its uninterrupted report."""
    job = sweep_job(Settings(gen_length=8, block_size=8, cache="dual", unmask="threshold"), {"threshold": [0.5, 0.9]},
                    "arithmetic", 2)
    path = tmp_path_factory.mktemp("records") / "sweep.jsonl"
    worker = Worker(job, tiny, None)
    report = run_sweep(job, LocalRunner(worker), Results(job, path))
    return job, worker, path, path.read_text().splitlines(), figures(report)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(number=st.integers(2, 5), field=st.sampled_from(FIELDS), value=VALUES, keep=st.booleans(),
       sort=st.booleans())
@example(number=3, field="nfe", value=7, keep=False, sort=False)  # a count edited by hand
@example(number=4, field="point", value=0, keep=False, sort=False)  # a record moved to another point
@example(number=5, field="wall_s", value=0.5, keep=True, sort=True)  # the same record, keys reordered
def test_a_record_with_one_field_changed_is_refused_by_its_line_or_changes_nothing(written, number, field, value, keep,
                                                                                   sort):
    job, worker, path, lines, whole = written
    record = json.loads(lines[number - 1])
    outer, _, inner = field.partition(".")
    target = record[outer] if inner else record
    key = inner or outer
    target[key] = target[key] if keep else value
    changed = list(lines)
    changed[number - 1] = json.dumps(record, sort_keys=sort)
    path.write_text("\n".join(changed) + "\n")
    try:
        resumed = Results(job, path, resume=True)
    except DllmError as exc:
        assert f"{path} line {number} " in str(exc), exc
        return
    assert figures(run_sweep(job, LocalRunner(worker), resumed)) == whole


def test_a_file_written_before_records_carried_their_job_is_refused_with_what_to_do(written):
    job, _, path, lines, _ = written
    header = json.loads(lines[0])
    old = [json.dumps({**header, "format": "dllm-local results v1"})]
    old += [json.dumps({k: v for k, v in json.loads(line).items() if k not in ("unit", "seal")}) for line in lines[1:]]
    path.write_text("\n".join(old) + "\n")
    with pytest.raises(DllmError, match="written by another version of dllm-local .'dllm-local results v1'.*run the "
                                        "command again with a new results file"):
        Results(job, path, resume=True)
