"""Boundaries, round 2 (issue 45), one table per kind, each driving the real component: the CLI
(in this process, or as a command where a process boundary is the point), the preset folder the
page reads, a real Ray head and a server that is not one, the results file a resumed run reads.
Every refusal is one bounded message naming the input and the rule; nothing else is written."""
from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dllm_local import Settings
from dllm_local.cli import main as cli_main
from dllm_local.errors import MAX_MESSAGE, DllmError, SettingsError, TraceError
from dllm_local.experiments.ray_address import reach_head
from dllm_local.analysis.reports import add_points
from dllm_local.experiments.sweep import sweep_job
from dllm_local.experiments.units import RESULTS_FORMAT, ModelSpec, Results
from dllm_local.files import MAX_DEPTH, FileRefused, read_json
from dllm_local.trace import load_trace_file, parse_trace
from ui.parts.presets import CURRENT_RUN, load_presets

ROOT = Path(__file__).resolve().parents[1]
SMALL_TRACE = ROOT / "tests" / "data" / "trace_small.json"


def _cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = cli_main(list(argv))
    except SystemExit as exc:  # argparse's own refusals exit 2 as well
        code = exc.code
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- files read with a bound

def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "pipe")
    return str(tmp_path / "pipe")


def _deep(tmp_path: Path) -> str:
    (tmp_path / "deep.jsonl").write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n")
    return str(tmp_path / "deep.jsonl")


def _endless(tmp_path: Path) -> str:
    (tmp_path / "endless.jsonl").write_text("[" * 200_000 + "]" * 200_000 + "\n")
    return str(tmp_path / "endless.jsonl")


def _surrogate(tmp_path: Path) -> str:
    (tmp_path / "odd.jsonl").write_text('{"prompt": "hi \\ud800", "answer": "1"}\n')
    return str(tmp_path / "odd.jsonl")


SWEEP = ["sweep", "--n", "1", "--gen-length", "8", "--block-size", "8", "--block-sizes", "8", "--thresholds", "0.9",
         "--quiet"]


@pytest.mark.parametrize("argv, path, message", [
    (["bench", "--n", "1", "--jsonl"], lambda _: "/dev/zero", "the evaluation set /dev/zero is a device, not a file"),
    (SWEEP + ["--resume"], lambda _: "/dev/zero", "the results file /dev/zero is a device, not a file"),
    (["bench", "--n", "1", "--jsonl"], _fifo, "pipe is a pipe (FIFO), not a file"),
    (SWEEP + ["--resume"], _fifo, "pipe is a pipe (FIFO), not a file"),
    (["bench", "--n", "1", "--jsonl"], _deep, f"deep.jsonl line 1 nests deeper than {MAX_DEPTH} levels"),
    (["bench", "--n", "1", "--jsonl"], _endless, f"endless.jsonl line 1 nests deeper than {MAX_DEPTH} levels"),
    (["bench", "--n", "1", "--jsonl"], _surrogate, "odd.jsonl line 1 holds text that is not valid Unicode (a lone surrogate, \"hi \\ud800\")"),
    (["bench", "--n", "1", "--jsonl"], lambda p: str(p), "is a folder, not a file"),
], ids=["jsonl device", "resume device", "jsonl fifo", "resume fifo", "jsonl deep", "jsonl endless",
        "jsonl surrogate", "jsonl folder"])
def test_a_file_named_on_the_command_line_is_read_with_a_bound(capsys, tmp_path, argv, path, message):
    code, err = _cli(capsys, *argv, path(tmp_path))
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err) < MAX_MESSAGE + 100


@pytest.mark.parametrize("content, message", [
    (lambda: "/dev/zero", "trace file zero is a device, not a file"),
    (lambda: "[" * 100 + "]" * 100, f"nests deeper than {MAX_DEPTH} levels"),
    (lambda: json.dumps({**json.loads(SMALL_TRACE.read_text()), "vocab": {"7\ud800": "x"}}),
     'trace file t.json holds text that is not valid Unicode (a lone surrogate, "7\\ud800")'),
    (lambda: json.dumps({**json.loads(SMALL_TRACE.read_text()), "settings": {f"k{i}": 1 for i in range(10_000)}}),
     "10,000 unknown settings, first: k0, k1, k10, k100, k1000"),
], ids=["device", "deep", "surrogate key", "10,000 unknown settings"])
def test_an_imported_trace_is_read_with_a_bound_and_refused_in_one_short_line(tmp_path, content, message):
    text = content()
    path = Path(text) if text.startswith("/dev/") else tmp_path / "t.json"
    if path != Path(text):
        path.write_text(text)
    with pytest.raises(TraceError) as refused:
        load_trace_file(path)
    assert message in str(refused.value) and len(str(refused.value)) <= MAX_MESSAGE


def test_the_reader_takes_the_size_as_read_not_as_stated():
    """/proc's files say they are empty; read, they are not: the bound holds on the bytes read."""
    with pytest.raises(FileRefused, match="is over 0.1 kB, its limit"):
        read_json("/proc/self/maps", max_bytes=100)


# ---------------------------------------------------------------- bounded messages

@pytest.mark.parametrize("call, message", [
    (lambda: Settings.from_dict({f"k{i}": 1 for i in range(10_000)}), "10,000 unknown settings, first: k0, k1"),
    (lambda: Settings.from_dict({"unmask": "threshold", "unmask_params": {f"p{i}": 1 for i in range(10_000)}}),
     "threshold: 10,000 unknown parameters, first: p0, p1, p10"),
    (lambda: Settings.from_dict({"x" * 100_000: 1}), "1 unknown setting: xxxxxxxx"),
    (lambda: add_points({}, {"rows": [{"point": {}, "accuracy": 2, "model_tok_s": -1, "nfe": "x" * 10_000}] * 500},
                        "r.json"), "r.json: rows[0].accuracy must be less than or equal to 1"),
    (lambda: parse_trace({"steps": [{"x" * 50_000: 1}] * 1000}), "not a valid trace"),
], ids=["unknown settings", "unknown parameters", "a 100 kB key", "500 bad rows", "a trace of 1,000 bad steps"])
def test_every_refusal_is_a_short_message(call, message):
    with pytest.raises(DllmError) as refused:
        call()
    text = str(refused.value)
    assert message in text and len(text) <= MAX_MESSAGE, (len(text), text[:300])


def test_a_message_past_the_bound_says_how_much_was_left_out():
    text = str(DllmError("x" * 10_000))
    assert len(text) <= MAX_MESSAGE and text.endswith(f"… ({10_000 - MAX_MESSAGE + 40:,} more characters)")


# ---------------------------------------------------------------- names that collide

def _preset(folder: Path, file: str, name: str) -> None:
    (folder / file).write_text(json.dumps({"name": name, "description": "d", "settings": {"cache": "dual"}}))


@pytest.mark.parametrize("files, kept, message", [
    ({"a.json": "Mine", "b.json": "Mine"}, ["Mine"], "preset b.json was skipped: its name 'Mine' is taken (a.json has it"),
    ({"a.json": CURRENT_RUN}, [], f"preset a.json was skipped: its name '{CURRENT_RUN}' is taken (the page's own entry"),
    ({"a.json": "current run SETTINGS"}, [], "is taken (the page's own entry has it)"),
    ({"a.json": "Mine", "b.json": "Yours"}, ["Mine", "Yours"], None),
], ids=["two files, one name", "the page's own entry", "the page's own entry in other letters", "no clash"])
def test_preset_names_are_unique_and_a_clash_names_both(tmp_path, files, kept, message):
    for file, name in files.items():
        _preset(tmp_path, file, name)
    presets, problems = load_presets(tmp_path)
    assert sorted(presets) == kept
    assert (len(problems) == 1 and message in problems[0]) if message else problems == [], problems


# ---------------------------------------------------------------- outside addresses

@pytest.mark.parametrize("address", ["127.0.0.1:103715", "127.0.0.1:0", "host:port", "http://x:1", "a b:1", ":6379"])
def test_a_ray_address_that_is_no_address_is_refused_before_anything_loads(capsys, address):
    code, err = _cli(capsys, *SWEEP, "--ray", address)
    assert code == 2 and "argument --ray: --ray takes local" in err and "(a port is 1..65535)" in err
    assert "Traceback" not in err


def _silent_server() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def _web_server() -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("serve, found", [
    (_silent_server, "it accepted the connection and said nothing for 3 s"),
    (_web_server, "it answered"),
], ids=["silent", "a web server"])
def test_a_server_that_is_not_ray_is_named_in_seconds(serve, found):
    server = serve()
    port = server.getsockname()[1] if isinstance(server, socket.socket) else server.server_address[1]
    start = time.monotonic()
    with pytest.raises(DllmError, match=f"the server at 127.0.0.1:{port} is not a Ray head \\({found}"):
        reach_head(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    server.close() if isinstance(server, socket.socket) else server.shutdown()


def test_a_ray_head_passes_the_check():
    """A real Ray head (a local instance): its GCS port answers as a head does."""
    import ray

    from dllm_local.experiments.cluster import Cluster, connect

    connect(Cluster("local"))
    try:
        reach_head(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def test_a_plugin_whose_behaviour_cannot_be_imported_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "broken_policies.py").write_text(
        "from dllm_local.policies.registry import PolicySpec, register\n"
        "register(PolicySpec('unmask', 'broken', 'Broken', 'A behaviour that is not there.', "
        "'no_such_module:Nothing', ()))\n")
    done = subprocess.run([sys.executable, "-m", "dllm_local", "generate", "--policies", "broken_policies", "--unmask",
                           "broken", "--prompt", "hi", "--gen-length", "8", "--block-size", "8"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: policy broken: its behaviour no_such_module:Nothing cannot be loaded: ModuleNotFoundError" \
           in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- resume refuses another job

@pytest.fixture
def job():
    return sweep_job(Settings(gen_length=8, block_size=8, cache="dual", unmask="threshold"), {"threshold": [0.9]}, "arithmetic", 2, 1000,
                     ModelSpec("tiny", "cpu"))


@pytest.mark.parametrize("change, named", [
    (lambda j: {**j, "code": "0123456789abcdef"}, "code (dllm-local's code changed since it was written"),
    (lambda j: {**j, "model": "other"}, "differ from this command's: model."),
    (lambda j: {**j, "task": "poker", "n": 3}, "differ from this command's: task, n."),
    (lambda j: {k: v for k, v in j.items() if k != "code"}, "differ from this command's: code"),
], ids=["another code", "another model", "another task and n", "a file from before the code was recorded"])
def test_resume_refuses_a_file_of_another_job_and_names_what_differs(job, tmp_path, change, named):
    path = tmp_path / "r.jsonl"
    header = {"format": RESULTS_FORMAT, "job": change(job.identity())}
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(DllmError, match="holds the results of another run") as refused:
        Results(job, path, resume=True)
    assert named in str(refused.value)
    path.write_text(json.dumps({"format": RESULTS_FORMAT, "job": job.identity()}) + "\n")
    assert Results(job, path, resume=True).records == {}  # its own job's file resumes


# ---------------------------------------------------------------- text is safe text

@pytest.mark.parametrize("call, message", [
    (lambda: Settings.from_dict({"cache": "dual\ud800"}), "cache must be valid Unicode text"),
    (lambda: add_points({}, {"rows": [{"point": {"a\udc00": 1}, "accuracy": 0.5, "model_tok_s": 1, "nfe": 1}]}, "r.json"),
     "r.json: rows[0].point must be valid Unicode text (a lone surrogate at character 1)"),
    (lambda: add_points({}, {"rows": [{"point": {}, "accuracy": 0.5, "model_tok_s": 1, "nfe": 1, "label": "\ud83d"}]},
                        "r.json"), "rows[0].label must be valid Unicode text"),
    (lambda: parse_trace({**json.loads(SMALL_TRACE.read_text()), "text": "a\ud800"}), "text must be valid Unicode"),
], ids=["a setting", "a report's key", "a report's label", "a trace's text"])
def test_a_lone_surrogate_is_refused_where_it_comes_in(call, message):
    with pytest.raises((SettingsError, DllmError)) as refused:
        call()
    assert message in str(refused.value)
    str(refused.value).encode("utf-8")  # the message itself can be written anywhere


# ---------------------------------------------------------------- files go where the user said

def test_a_cluster_sweep_writes_only_beside_its_report_and_names_every_file(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    done = subprocess.run([sys.executable, "-m", "dllm_local", *SWEEP, "--ray", "local", "--out", str(there / "x.json")],
                          cwd=here, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(here.iterdir()) == []
    written = sorted(p.name for p in there.iterdir())
    assert written[0] == "sweep-" + written[0][6:] and written[0].endswith(".jsonl") and written[1] == "x.json"
    assert f"wrote {there / 'x.json'}" in done.stdout and f"each problem's record: {there / written[0]}" in done.stderr
