"""Problem sets a bench, sweep or evaluation runs: the tiny model's tasks, or a user's JSON-lines
file with a scorer. Torch-free: the CLI lists the scorers before it loads anything."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable

from pydantic import Field, Strict, TypeAdapter
from typing_extensions import TypedDict

from ..errors import DllmError, SettingsError
from ..files import parse_json, read_text
from ..values import Number, Text, read
from ..tiny.tasks import make_problems
from ..tiny.tasks import score as score_task


@dataclass
class Problem:
    prompt: str
    is_correct: Callable[[str], bool]
    kind: str = ""


MAX_SET_BYTES = 64 * 2**20  # an evaluation set: one prompt and answer a line


class _Row(TypedDict):
    """A line of a user's evaluation set (other fields are ignored)."""
    prompt: Annotated[Text, Field(min_length=1)]
    answer: Annotated[int, Strict()] | Number | Text


_ROW = TypeAdapter(_Row)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "exact_number": lambda out, ans: _last_number(out) is not None and float(_last_number(out)) == float(_last_number(ans) or "nan"),
    "exact_string": lambda out, ans: out.strip() == ans.strip(),
    "contains": lambda out, ans: ans.strip().lower() in out.lower(),
}


def task_problems(task: str, n: int, seed: int) -> list[Problem]:
    return [Problem(ex.prompt, lambda out, ex=ex: score_task(ex, out), ex.kind) for ex in make_problems(task, n, seed)]


def jsonl_problems(path: Path, scorer: str, n: int | None = None) -> list[Problem]:
    """A user's evaluation set: one ``{"prompt": ..., "answer": ...}`` object per line."""
    if scorer not in SCORERS:
        raise DllmError(f"scorer must be one of {', '.join(SCORERS)}, not {scorer!r}")
    lines = read_text(path, MAX_SET_BYTES, f"the evaluation set {path}").splitlines()
    problems = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = read(_ROW, parse_json(line, f"{path} line {i}"), owner=f"{path} line {i}")
        except SettingsError as exc:
            raise DllmError(f"{exc}: expected a JSON object with 'prompt' and 'answer'") from None
        prompt, answer = row["prompt"], str(row["answer"])
        problems.append(Problem(prompt, lambda out, a=answer: SCORERS[scorer](out, a)))
    if not problems:
        raise DllmError(f"{path} has no problems: expected one JSON object with 'prompt' and 'answer' per line")
    return problems[:n] if n else problems
