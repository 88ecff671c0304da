"""lm-evaluation-harness through the adapter, offline: the bundled tiny_arithmetic task (YAML
with a local data file) run by the real harness on the tiny model."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from dllm_local import DllmError, Settings  # noqa: E402
from dllm_local.experiments.evaluate import evaluate  # noqa: E402
from dllm_local.analysis.reports import add_points  # noqa: E402
from dllm_local.experiments.harness import run_harness  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# A setting where parallel decoding gets some problems wrong, so agreement is not 100% = 100%.
PARALLEL = Settings(gen_length=64, block_size=32, cache="dual", unmask="threshold", unmask_params={"threshold": 0.3})


def test_the_bundled_task_is_the_eval_problem_set():
    from dllm_local.experiments.harness import BUNDLED_TASKS
    from dllm_local.tiny.tasks import make_problems

    docs = [json.loads(line) for line in (BUNDLED_TASKS / "tiny_arithmetic.jsonl").read_text().splitlines()]
    problems = make_problems("arithmetic", len(docs), 1000)
    assert len(docs) == 200
    assert all(d == {"question": p.prompt, "answer": str(p.meta["result"])} for d, p in zip(docs, problems))


def test_harness_score_equals_eval_on_the_same_problems_and_settings(tiny):
    report = run_harness(tiny, PARALLEL, ["tiny_arithmetic"], limit=12, progress=False)
    ours = evaluate(tiny, "arithmetic", 12, 1000, PARALLEL)
    assert report["answers"] == 12 and report["samples"]["tiny_arithmetic"] == 12
    assert report["scores"]["tiny_arithmetic"]["exact_match,answer"] == pytest.approx(ours["score"])
    assert report["nfe"] == pytest.approx(ours["nfe"]) and report["nfe"] < 64
    assert report["tau_content"] == pytest.approx(ours["content_tokens_per_forward"])
    row, = report["rows"]  # the Tune tab's point
    assert row["accuracy"] == pytest.approx(ours["score"]) and row["point"]["threshold"] == 0.3 and row["n"] == 12
    assert Settings.from_dict(row["settings"]) == PARALLEL  # a click on it loads these into the Run tab


def test_multiple_choice_tasks_are_refused_with_a_message(tiny, tmp_path):
    data = tmp_path / "yes_no.jsonl"
    data.write_text(json.dumps({"question": "Is 2 + 2 = 4?", "label": 0}) + "\n")
    (tmp_path / "yes_no.yaml").write_text(
        "task: yes_no\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + str(data) + "\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: ['yes', 'no']\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    with pytest.raises(DllmError, match="only generation tasks"):
        run_harness(tiny, Settings(gen_length=32), ["yes_no"], include_path=str(tmp_path), progress=False)


def test_cli_runs_the_harness_and_writes_a_tune_point(tmp_path):
    out = tmp_path / "lm_eval.json"
    done = subprocess.run([sys.executable, "-m", "dllm_local", "lm-eval", "--tasks", "tiny_arithmetic", "--limit", "3",
                           "--gen-length", "32", "--threshold", "0.9", "--cache", "dual", "--quiet", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tiny_arithmetic (n=3): exact_match,answer" in done.stdout and "NFE" in done.stdout
    report = json.loads(out.read_text())
    assert report["settings"]["unmask"] == "threshold" and report["settings"]["cache"] == "dual"
    assert report["rows"][0]["label"] == "tiny_arithmetic exact_match,answer (lm-eval)"
    merged = add_points({}, report, out.name)  # what the Tune tab's "Add results" does with the file
    assert merged["rows"][0]["n"] == 3 and merged["rows"][0]["pareto"]
    bad = subprocess.run([sys.executable, "-m", "dllm_local", "lm-eval", "--tasks", "no_such_task", "--limit", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "1 unknown harness task: no_such_task" in bad.stderr
    assert "Traceback" not in bad.stderr
