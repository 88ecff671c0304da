"""Problem sets a bench, sweep or evaluation runs: the tiny model's tasks, or a user's JSON-lines
file with a scorer. Torch-free: the CLI lists the scorers before it loads anything."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import DllmError
from ..tiny.tasks import make_problems
from ..tiny.tasks import score as score_task


@dataclass
class Problem:
    prompt: str
    is_correct: Callable[[str], bool]
    kind: str = ""


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
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DllmError(f"cannot read the evaluation set {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    problems = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, answer = row["prompt"], str(row["answer"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DllmError(f"{path} line {i}: expected a JSON object with 'prompt' and 'answer' ({exc})") from exc
        problems.append(Problem(prompt, lambda out, a=answer: SCORERS[scorer](out, a)))
    if not problems:
        raise DllmError(f"{path} has no problems: expected one JSON object with 'prompt' and 'answer' per line")
    return problems[:n] if n else problems
