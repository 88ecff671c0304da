"""The command line as a newcomer meets it: `info MODEL`, threads, help with examples, progress
bars and --quiet, bench repeats and its warning when they disagree."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from dllm_local import Settings, SettingsError
from dllm_local.cli import EXAMPLES, main as cli_main
from dllm_local.experiments.side_by_side import SPREAD_WARNING, Strategy, format_table, run_bench
from dllm_local.experiments.problems import task_problems


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_info_takes_the_model_as_its_argument_and_threads_default_to_one_for_the_tiny_model(capsys, keep_threads):
    torch.set_num_threads(2)
    assert cli_main(["info", "tiny"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["family"] == "llada" and summary["trained_length"] == 512
    assert torch.get_num_threads() == 1  # the measured default for a model this small (docs/decoding.md "Threads")
    assert cli_main(["info", "tiny", "--threads", "2"]) == 0 and torch.get_num_threads() == 2


@pytest.mark.parametrize("command", list(EXAMPLES))
def test_every_command_has_help_with_examples(capsys, command):
    with pytest.raises(SystemExit) as done:
        cli_main([command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "examples:" in out and f"python -m dllm_local {command}" in out
    assert "--threads" in out


def test_progress_bar_with_eta_and_quiet(capsys, keep_threads):
    from transformers.utils import logging as hf_logging

    assert cli_main(["eval", "--n", "2", "--gen-length", "32"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"arithmetic: 100%.*2/2 \[[\d:]+<[\d:]+", err)  # tqdm: done/total [elapsed<remaining]
    assert cli_main(["eval", "--n", "2", "--gen-length", "32", "--quiet"]) == 0
    captured = capsys.readouterr()
    hf_logging.enable_progress_bar()
    assert "%|" not in captured.err and "task arithmetic (n=2" in captured.out


def test_bench_repeats_three_times_and_warns_when_repeats_disagree(tiny, monkeypatch, keep_threads):
    from dllm_local.decoding import batch, sampler

    calls = []
    real = sampler.generate
    counted = lambda *a, **k: calls.append(a[1]) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(sampler, "generate", counted)  # the warm-up: bench imports it when it runs
    monkeypatch.setattr(batch, "generate", counted)  # the set, one answer at a time
    torch.set_num_threads(1)
    problems = task_problems("arithmetic", 2, 1000)
    report = run_bench(tiny, problems, [Strategy({"cache": "none"}), Strategy({"cache": "dual"})],
                       Settings(gen_length=32, block_size=32), progress=False)
    assert len(calls) == 2 * (1 + 3 * len(problems))  # per row: one warm-up answer, then the set three times
    assert report["repeats"] == 3 and all(len(r["wall_s_repeats"]) == 3 for r in report["rows"])
    for row in report["rows"]:
        walls = row["wall_s_repeats"]
        assert row["spread"] == pytest.approx((max(walls) - min(walls)) / row["wall_s"])
    steady = {**report, "rows": [dict(r, spread=0.05) for r in report["rows"]]}
    assert "WARNING" not in format_table(steady)
    # row 0's measured spread is whatever this machine gave; pin it so only row 1 is unsteady
    noisy = {**report, "rows": [dict(report["rows"][0], spread=0.05),
                                dict(report["rows"][1], spread=SPREAD_WARNING + 0.1)]}
    table = format_table(noisy)
    name = report["rows"][1]["strategy"]
    assert f"WARNING: the repeats of {name} differ by more than 20%" in table and name.startswith("dual")
    assert report["machine"].endswith(", 1 torch thread")  # the table names the threads it ran with


@pytest.mark.parametrize("argv, answer", [
    (["--help"], "python -m dllm_local COMMAND --help"),
    (["bench", "--help"], "--concurrency"),
    (["generate", "--prompt", "hi", "--cache", "nope"], "invalid choice: 'nope'"),
])
def test_help_and_bad_arguments_answer_without_importing_torch_or_transformers(argv, answer):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dllm_local", *argv], capture_output=True, text=True,
                          timeout=120)
    assert answer in done.stdout + done.stderr
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "dllm_local" in imported and not imported & {"torch", "transformers"}


@pytest.fixture
def sharp():
    """An unmasking policy registered as a plugin would be: its parameter becomes a flag."""
    from dllm_local.policies import registry

    spec = registry.register(registry.PolicySpec(
        "unmask", "sharp", "Sharp (test)", "A test policy.", "no_such_module:Sharp",
        (registry.Param("sharpness", float, 0.25, "Sharpness", "how sharp", low=0, high=1),)))
    yield spec
    registry.unregister("unmask", "sharp")


def _settings(*argv: str):
    from dllm_local.cli import build_parser
    from dllm_local.cli.settings_flags import settings_from_args

    return settings_from_args(build_parser().parse_args(["generate", "--prompt", "hi", *argv]))


def test_every_registered_parameter_is_a_flag_of_the_policy_that_takes_it(sharp, capsys):
    s = _settings("--unmask", "sharp", "--sharpness", "0.75")
    assert (s.unmask, s.unmask_params) == ("sharp", {"sharpness": 0.75})
    with pytest.raises(SystemExit):
        _settings("--unmask", "sharp", "--sharpness", "2")
    assert "argument --sharpness: must be in [0, 1], not '2'" in capsys.readouterr().err
    # a name two chosen policies share goes to both; a cache parameter to the cache policy
    s = _settings("--cache", "drift_refresh", "--unmask", "guided", "--top-k", "3", "--gamma", "0.5")
    assert s.cache_params["top_k"] == 3 == s.unmask_params["top_k"] and s.cache_params["gamma"] == 0.5
    with pytest.raises(SettingsError, match=r"--floor is a parameter of adaptive; the chosen policies \(cache dual, "
                                            r"unmask sharp\) do not take it"):
        _settings("--cache", "dual", "--unmask", "sharp", "--floor", "0.3")


def test_a_parameter_named_after_its_policy_chooses_it():
    assert _settings("--threshold", "0.8").unmask_params == {"threshold": 0.8}
    assert _settings("--threshold", "0.8").unmask == "threshold" and _settings("--factor", "2").unmask == "factor"
    assert _settings("--remasking", "random").unmask == "fixed"
    assert _settings("--unmask", "self_verify", "--threshold", "0.8").unmask_params["threshold"] == 0.8


@pytest.mark.parametrize("command", [["sweep", "--thresholds", "0.9", "--block-sizes", "32", "--gen-length", "32"],
                                     ["bench", "--set", "headline", "--gen-length", "32"],
                                     ["lm-eval", "--tasks", "tiny_arithmetic", "--gen-length", "32"]])
@pytest.mark.parametrize("out, message", [
    (".", r"--out \. is a folder: name a file in it"),
    ("/nowhere/report.json", "the folder /nowhere does not exist"),
])
def test_an_output_path_that_cannot_take_the_report_is_refused_before_the_work(command, out, message, capsys):
    start = time.perf_counter()
    assert cli_main([*command, "--n" if command[0] != "lm-eval" else "--limit", "1", "--out", out]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert time.perf_counter() - start < 5  # no model was loaded, nothing decoded


def test_a_report_whose_write_fails_at_the_end_is_kept_in_a_file_the_error_names(capsys):
    """/dev/full takes the open and refuses the write (no space): the report goes elsewhere."""
    assert cli_main(["sweep", "--n", "2", "--thresholds", "0.9", "--block-sizes", "32", "--gen-length", "32", "--quiet",
                     "--out", "/dev/full"]) == 2
    err = capsys.readouterr().err
    found = re.search(r"could not write --out /dev/full \(No space left on device\); the report is in (\S+\.json)", err)
    assert found, err
    kept = json.loads(Path(found.group(1)).read_text())
    assert [row["point"] for row in kept["rows"]] == [{"threshold": 0.9, "block_size": 32}]
    Path(found.group(1)).unlink()
