"""The examples of the README and of every ``docs/*.md`` file, run as a newcomer would run them:
every ``bash``, ``console`` and ``python`` block, in a fresh process from the repository root, one
test per block named by its file and line (``docs/models.md:python-line40``).

- ``bash``: each command must succeed.
- ``console``: each ``$ `` command must succeed and print the lines below it, in that order (other
  lines may come between them, such as progress bars; ``…`` in a line stands for any text).
- ``python``: the block must run; a ``text`` block right after it is the output it must print.

A block preceded by ``<!-- readme-test: skip REASON -->`` is reported as skipped with that reason
(installs, the server, hour-long training): pytest lists the reasons with ``-rs``.

The README stays a newcomer's read (at most ``README_MAX_LINES`` lines; the rest lives in
``docs/``), and every relative link in these files names a file that exists and, into a Markdown
file, a heading that exists.
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
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the files whose examples are run
README_MAX_LINES = 250
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s+(.+?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    lang: str
    line: int
    text: str
    skip: str | None
    output: str | None = None  # the text block that follows a python block
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.source}:{self.lang}-line{self.line}"

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{source} line {i + 1}: a code block is never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(before)
        block = Block(m.group(1), i + 1, "\n".join(lines[i + 1:end]), skip.group(1) if skip else None, source=source)
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


ALL_BLOCKS = [block for path in DOCS for block in readme_blocks(path.read_text(), path.relative_to(ROOT).as_posix())]
BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUNNABLE]


def test_the_readme_has_runnable_examples():
    # Shell and Python examples are tagged so that this test finds them (an `sh` block would go unrun).
    assert not [b.id for b in ALL_BLOCKS if b.lang in ("sh", "shell", "zsh", "py", "python3", "pycon")]
    runnable = [b for b in BLOCKS if b.skip is None]
    assert any(b.lang == "python" and b.output and b.source == "README.md" for b in runnable), \
        "the README shows a Python example with its output"
    assert any(b.lang == "console" for b in runnable), "a shell example with its output"
    assert {b.source for b in runnable} > {"README.md"}, "the docs' examples are run too"


def test_the_readme_is_a_newcomers_read():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move a topic to docs/ (at most {README_MAX_LINES})"


LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def _prose(text: str) -> str:
    """The text outside code blocks and code spans (a link-like text there is code, not a link)."""
    out, in_block = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(text: str) -> set[str]:
    """GitHub's anchor of each heading outside code blocks: lower case, punctuation dropped, spaces
    to hyphens, and ``-1``, ``-2`` ... after a repeated one."""
    found: set[str] = set()
    count: dict[str, int] = {}
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
        heading = None if in_block else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            seen = count.get(slug, 0)
            count[slug] = seen + 1
            found.add(slug if seen == 0 else f"{slug}-{seen}")
    return found


def test_every_relative_link_names_a_file_and_heading_that_exist():
    broken = []
    for path in DOCS:
        for target in LINK.findall(_prose(path.read_text())):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading in {linked.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


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
        pytest.skip(f"{block.where}: {block.skip}")
    if block.lang == "python":
        done = _run([sys.executable, "-c", block.text])
        assert done.returncode == 0, f"{block.where} failed:\n{done.stderr[-3000:]}"
        if block.output:
            assert_prints([line.strip() for line in block.output.splitlines() if line.strip()],
                          done.stdout, block.where)
        return
    for command, expected in _commands(block):
        done = _run(command.replace("python ", f"{sys.executable} ", 1) if command.startswith("python ") else command,
                    shell=True)
        assert done.returncode == 0, f"{block.where}: `{command}` failed:\n{done.stderr[-3000:]}"
        assert_prints(expected, done.stdout + "\n" + done.stderr, f"{block.where}: `{command}`")
