"""The results file a sweep or evaluation appends to: a record per problem, read back on resume,
whatever state a stopped run left it in."""
from __future__ import annotations

import json

import pytest

from dllm_local.errors import DllmError
from dllm_local.experiments.sweep import run_sweep, sweep_job
from dllm_local.experiments.units import LocalRunner, Results, Worker
from dllm_local.settings import Settings

BASE = Settings(gen_length=32, block_size=16, cache="dual", unmask="threshold")


@pytest.fixture(scope="module")
def job():
    return sweep_job(BASE, {"threshold": [0.5, 0.9]}, "arithmetic", 3)


def test_a_record_cut_by_a_stop_is_dropped_and_decoded_again(tiny, job, tmp_path):
    path = tmp_path / "r.jsonl"
    whole = Results(job)
    run_sweep(job, LocalRunner(Worker(job, tiny, None)), whole, chunk=1)
    first = Results(job, path)
    first.add([whole.records[(0, 0)], whole.records[(0, 1)]])
    with path.open("a") as f:  # the run was killed in the middle of writing its third record
        f.write(json.dumps(whole.records[(0, 2)])[:40])
    resumed = Results(job, path, resume=True)
    assert sorted(resumed.records) == [(0, 0), (0, 1)]
    run_sweep(job, LocalRunner(Worker(job, tiny, None)), resumed, chunk=1)
    again = Results(job, path, resume=True)  # every line whole again
    assert {k: r["token_ids"] for k, r in again.records.items()} == {k: r["token_ids"] for k, r in whole.records.items()}
    assert len(path.read_text().splitlines()) == 1 + job.total


@pytest.mark.parametrize("content, message", [
    ('{"hello": 1}\n', "is not a results file of dllm-local"),
    ("", "is not a results file of dllm-local"),
])
def test_a_file_that_is_not_a_results_file_is_refused(job, tmp_path, content, message):
    path = tmp_path / "other.jsonl"
    path.write_text(content)
    with pytest.raises(DllmError, match=message):
        Results(job, path, resume=True)


def test_a_results_file_that_cannot_be_written_is_told_before_any_work(job, tmp_path):
    with pytest.raises(DllmError, match="the results file .*missing.jsonl could not be read"):
        Results(job, tmp_path / "missing.jsonl", resume=True)
    with pytest.raises(DllmError, match="cannot write the results file .*: it is a folder"):
        Results(job, tmp_path)
    with pytest.raises(DllmError, match="cannot write the results file .*: its folder does not exist"):
        Results(job, tmp_path / "nowhere" / "r.jsonl")
    assert not (tmp_path / "new.jsonl").exists() and Results(job, tmp_path / "new.jsonl").records == {}
    assert not (tmp_path / "new.jsonl").exists()  # a run that decodes nothing leaves no file


@pytest.fixture(scope="module")
def record(tiny, job) -> dict:
    from dllm_local.experiments.units import plan_units

    return Worker(job, tiny, None).run(plan_units(job, chunk=1)[0])[0]


def _with(**changes):
    return lambda r: {**r, **changes}


@pytest.mark.parametrize("change, message", [
    (_with(nfe="x"), r"line 2 is not a result record: nfe must be a valid integer \(not 'x'\)"),
    (_with(correct=1), r"correct must be a valid boolean \(not 1\)"),
    (_with(token_ids=[3, -1]), r"token_ids\[1\] must be greater than or equal to 0 \(not -1\)"),
    (_with(tau=float("nan")), r"tau must be a finite number \(not nan\)"),
    (_with(point=-1), r"point must be greater than or equal to 0 \(not -1\)"),
    (lambda r: {k: v for k, v in r.items() if k != "model_s"}, r"model_s is missing"),
    (lambda r: [r], r"the record must be a valid dictionary"),
])
def test_a_record_read_back_goes_through_its_schema_and_a_bad_one_is_named(job, record, tmp_path, change, message):
    """Every field a report reads is checked on --resume: an edited or foreign line is a message
    naming its line, field and rule, never a traceback when the report is built."""
    path = tmp_path / "r.jsonl"
    Results(job, path).add([record])
    assert Results(job, path, resume=True).records == {(0, 0): record}  # read back as written
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + json.dumps(change(json.loads(lines[1]))) + "\n")
    with pytest.raises(DllmError, match=message):
        Results(job, path, resume=True)
