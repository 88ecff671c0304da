"""Every ``bench/`` script reads its numbers through ``dllm_local.arguments``' types: each numeric
flag of each script, found from the script's own ``build_parser()``, is tried with every value its
type refuses, and each refusal is argparse's exit 2 naming the flag, never a traceback."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# One process imports every script and parses (no model is loaded): a process each would cost
# a torch import per script.
TRY_EVERY_FLAG = r"""
import argparse, contextlib, importlib, io, json, re, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
NUMERIC = re.compile(r"[-+\d.,/ \[\]]+")

def numeric(action):
    if action.type in (int, float):
        return True
    if action.default is None or isinstance(action.default, bool) or action.choices is not None:
        return False
    return bool(NUMERIC.fullmatch(str(action.default)))

report = {}
for stem in sys.argv[2:]:
    parser = importlib.import_module(stem).build_parser()
    tried, unchecked = [], []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        flag = max(action.option_strings, key=len)
        if not hasattr(action.type, "refused"):
            if numeric(action) and action.type is not str:  # type=str: text that looks like a number (a version)
                unchecked.append(flag)
            continue
        for value in action.type.refused:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    parser.parse_args([f"{flag}={value}"])
                    code = 0
                except SystemExit as exc:
                    code = exc.code
                except BaseException as exc:
                    code, err = f"{type(exc).__name__}: {exc}", io.StringIO()
            tried.append([flag, value, code, err.getvalue()])
    report[stem] = {"tried": tried, "unchecked": unchecked}
print(json.dumps(report))
"""


def _scripts_with_flags() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if "ArgumentParser(" in p.read_text())


def test_every_bench_script_builds_its_flags_in_build_parser_and_parses_with_it():
    for stem in _scripts_with_flags():
        text = (BENCH / f"{stem}.py").read_text()
        assert text.count("ArgumentParser(") == 1 and "\ndef build_parser() -> argparse.ArgumentParser:" in text, stem
        assert re.search(r"build_parser\(\)(\.parse_args\(| *\n)", text.split("def build_parser", 1)[1]), stem


def test_every_numeric_flag_of_every_bench_script_refuses_bad_values_with_exit_2_naming_it():
    scripts = _scripts_with_flags()
    out = subprocess.run([sys.executable, "-c", TRY_EVERY_FLAG, str(ROOT), *scripts], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(report) == scripts
    assert {stem: r["unchecked"] for stem, r in report.items() if r["unchecked"]} == {}  # a bare int or float type
    wrong = [(stem, flag, value, code, err[-200:]) for stem, r in report.items() for flag, value, code, err in r["tried"]
             if code != 2 or f"argument {flag}" not in err or "Traceback" in err]
    assert wrong == []
    tried = {(stem, flag) for stem, r in report.items() for flag, *_ in r["tried"]}
    # the flags the issue found (and every other numeric flag with them)
    assert {("lab_load", "--students"), ("lab_load", "--slots"), ("continuous_batching", "--n"),
            ("continuous_batching", "--batch-sizes"), ("continuous_batching", "--rounds")} <= tried
    assert len(tried) > 60


def test_lab_load_with_students_abc_is_a_usage_message_not_a_traceback():
    out = subprocess.run([sys.executable, "bench/lab_load.py", "--students", "abc"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "usage: lab_load.py" in out.stderr
    assert "argument --students: must be whole numbers joined by ',' such as 1,2" in out.stderr
