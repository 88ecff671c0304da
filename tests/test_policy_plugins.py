"""A policy of one's own, outside the package: the README's ``my_policies`` written to a folder as
the README shows it, then loaded by ``--policies`` and by an installed package's entry point, in
the CLI, the sweep and the page's spawned engine process."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_readme import ALL_BLOCKS, README, _commands, assert_prints

ROOT = Path(__file__).resolve().parents[1]
FILE_HEADER = re.compile(r"# (my_policies/\w+\.py):")
# The README's commands that use the plugin: the console block after the folder's files.
COMMANDS = next(b for b in ALL_BLOCKS if b.lang == "console" and "--policies my_policies" in b.text)


def _readme_plugin(folder: Path) -> Path:
    """The files the README shows as ``# my_policies/NAME.py: ...`` blocks, written under ``folder``."""
    written = []
    for block in ALL_BLOCKS:
        header = FILE_HEADER.match(block.text) if block.lang == "python" else None
        if header:
            path = folder / header.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text + "\n")
            written.append(header.group(1))
    assert sorted(written) == ["my_policies/__init__.py", "my_policies/top2.py"], f"{README} shows {written}"
    return folder


def _run(args: list[str], cwd: Path, pythonpath: list[Path], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, ROOT])), "HF_HUB_OFFLINE": "1",
           "DLLM_LOCAL_DEVICE": "cpu", "GRADIO_ANALYTICS_ENABLED": "False"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_readme_commands_run_with_the_readme_plugin_in_the_cli_and_the_sweep(tmp_path):
    folder = _readme_plugin(tmp_path)
    for command, expected in _commands(COMMANDS):
        assert command.startswith("python -m dllm_local ")
        done = _run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)], folder, [])
        assert done.returncode == 0, f"`{command}` failed:\n{done.stderr[-3000:]}"
        assert_prints(expected, done.stdout + "\n" + done.stderr, f"`{command}`")


# In a fresh interpreter: the page process loads the plugin without torch, the Session hands it on
# to the engine process it spawns, and a run there uses it.
SESSION_SCRIPT = textwrap.dedent("""
    import json, sys

    from dllm_local.policies import registry
    from dllm_local.serving.session import Session

    if __name__ == "__main__":
        loaded = registry.load_plugins(sys.argv[1:])
        page_side = {"loaded": loaded, "torch": "torch" in sys.modules, "k": registry.UNMASK["top2"].defaults}
        session = Session("tiny", device="cpu", threads=1)
        try:
            specs = [spec["name"] for spec in session.policy_specs()["unmask"]]
            settings = {"gen_length": 32, "block_size": 32, "unmask": "top2", "unmask_params": {"k": 3}}
            for event in session.run("Give two numbers whose sum is 9.", settings):
                trace = event["trace"]
        finally:
            session.close()
        print(json.dumps({**page_side, "engine_specs": specs, "unmask": trace["settings"]["unmask"],
                          "commits": [len(step["committed"]) for step in trace["steps"]]}))
""")


def _session_run(folder: Path, pythonpath: list[Path], *modules: str) -> dict:
    script = folder / "session_run.py"
    script.write_text(SESSION_SCRIPT)
    done = _run([sys.executable, str(script), *modules], folder, pythonpath)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_top2_ran_in_the_engine(result: dict) -> None:
    assert result["loaded"] == ["my_policies"] and result["k"] == {"k": 2}
    assert result["torch"] is False  # the spec module is torch-free; the behaviour loads in the engine
    assert "top2" in result["engine_specs"]
    # 32 masks, three per step: only TopTwo with k=3 commits this way (threshold and fixed do not).
    assert result["unmask"] == "top2" and result["commits"] == [3] * 10 + [2]


def test_policies_flag_reaches_the_spawned_engine(tmp_path):
    folder = _readme_plugin(tmp_path / "work")
    # The plugin is importable because its folder is on the page process's path, which the
    # spawned engine inherits, as with `python -m dllm_local` or `python app.py` started beside it.
    _assert_top2_ran_in_the_engine(_session_run(folder, [folder], "my_policies"))


def test_an_installed_entry_point_registers_the_policy_without_a_flag(tmp_path):
    site = _readme_plugin(tmp_path / "site-packages")
    # What `pip install` of a plugin package leaves: its metadata with the entry point.
    dist_info = site / "my_policies-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[dllm_local.policies]\nmy_policies = my_policies\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _assert_top2_ran_in_the_engine(_session_run(elsewhere, [site]))
    done = _run([sys.executable, "-m", "dllm_local", "generate", "--unmask", "top2", "--k", "4", "--gen-length", "32",
                 "--prompt", "Give two numbers whose sum is 9."], elsewhere, [site])
    assert done.returncode == 0 and "NFE 8 |" in done.stderr, done.stderr[-3000:]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("command", [
    ["-m", "dllm_local", "generate", "--policies", "no_such_module", "--prompt", "hi"],
    ["-m", "dllm_local", "sweep", "--n", "1", "--policies=no_such_module"],
    ["app.py", "--policies", "no_such_module"],
])
def test_a_module_that_is_not_there_is_one_error_line(tmp_path, command):
    if command[0] == "app.py":
        command = [str(ROOT / "app.py"), *command[1:], "--port", str(_free_port())]
    done = _run([sys.executable, *command], tmp_path, [], timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: --policies no_such_module: no module named 'no_such_module' (it must be "
                                   "importable from here: the current folder, PYTHONPATH or an installed package)")


def test_a_plugin_that_fails_to_import_is_named_in_one_line(tmp_path):
    (tmp_path / "broken_policies.py").write_text("import no_such_dependency\n")
    done = _run([sys.executable, "-m", "dllm_local", "generate", "--policies", "broken_policies", "--prompt", "hi"],
                tmp_path, [])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: --policies broken_policies: importing 'broken_policies' failed: "
                                   "No module named 'no_such_dependency'")
