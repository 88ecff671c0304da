"""The README's examples, run as a newcomer would run them: every ``bash``, ``console`` and
``python`` block, in a fresh process from the repository root.

- ``bash``: each command must succeed.
- ``console``: each ``$ `` command must succeed and print the lines below it, in that order (other
  lines may come between them, such as progress bars; ``…`` in a line stands for any text).
- ``python``: the block must run; a ``text`` block right after it is the output it must print.

A block preceded by ``<!-- readme-test: skip REASON -->`` is reported as skipped with that reason
(installs, the server, hour-long training): pytest lists the reasons with ``-rs``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s+(.+?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    lang: str
    line: int
    text: str
    skip: str | None
    output: str | None = None  # the text block that follows a python block

    @property
    def id(self) -> str:
        return f"{self.lang}-line{self.line}"


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"README line {i + 1}: a code block is never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(before)
        block = Block(m.group(1), i + 1, "\n".join(lines[i + 1:end]), skip.group(1) if skip else None)
        if block.lang == "text" and blocks and blocks[-1].lang == "python" and blocks[-1].output is None \
                and not any(lines[j].strip() for j in range(blocks[-1].line + blocks[-1].text.count("\n") + 2, i)):
            blocks[-1].output = block.text
        else:
            blocks.append(block)
        i = end + 1
    return blocks


RUNNABLE = ("bash", "console", "python")


def _commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) pairs; a trailing backslash continues a command."""
    pairs: list[tuple[str, list[str]]] = []
    pending = ""
    for raw in block.text.splitlines():
        if block.lang == "console" and not raw.startswith("$ ") and not pending:
            if pairs and raw.strip():
                pairs[-1][1].append(raw.strip())
            continue
        line = raw[2:] if block.lang == "console" and raw.startswith("$ ") else raw
        if not line.strip() and not pending:
            continue
        pending += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            pairs.append((pending.strip(), []))
            pending = ""
    return pairs


def assert_prints(expected: list[str], output: str, what: str) -> None:
    """Every expected line appears in ``output``, in order, as a whole line (``…`` = any text)."""
    got = [line.strip() for line in output.splitlines() if line.strip()]
    at = 0
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("…")))
        while at < len(got) and not pattern.fullmatch(got[at]):
            at += 1
        assert at < len(got), f"{what}: expected the line {want!r}; it printed:\n{output}"
        at += 1


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}


def _run(args: list[str] | str, shell: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(args, shell=shell, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
                          executable="/bin/bash" if shell else None)


ALL_BLOCKS = readme_blocks(README.read_text())
BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUNNABLE]


def test_the_readme_has_runnable_examples():
    # Shell and Python examples are tagged so that this test finds them (an `sh` block would go unrun).
    assert not [b.id for b in ALL_BLOCKS if b.lang in ("sh", "shell", "zsh", "py", "python3", "pycon")]
    runnable = [b for b in BLOCKS if b.skip is None]
    assert any(b.lang == "python" and b.output for b in runnable), "a Python example with its output"
    assert any(b.lang == "console" for b in runnable), "a shell example with its output"


@pytest.fixture
def leaves_no_files():
    """Results files an example writes in the repository's folder go after it: a second run of
    the example then starts as the first did."""
    before = set(ROOT.glob("*.jsonl"))
    yield
    for path in set(ROOT.glob("*.jsonl")) - before:
        path.unlink()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_example(block: Block, leaves_no_files):
    if block.skip:
        pytest.skip(f"README line {block.line}: {block.skip}")
    if block.lang == "python":
        done = _run([sys.executable, "-c", block.text])
        assert done.returncode == 0, f"README line {block.line} failed:\n{done.stderr[-3000:]}"
        if block.output:
            assert_prints([line.strip() for line in block.output.splitlines() if line.strip()],
                          done.stdout, f"README line {block.line}")
        return
    for command, expected in _commands(block):
        done = _run(command.replace("python ", f"{sys.executable} ", 1) if command.startswith("python ") else command,
                    shell=True)
        assert done.returncode == 0, f"README line {block.line}: `{command}` failed:\n{done.stderr[-3000:]}"
        assert_prints(expected, done.stdout + "\n" + done.stderr, f"README line {block.line}: `{command}`")
