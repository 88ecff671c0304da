"""The embedded tiny models: their synthetic task suite, tokenizer and training; and the writers
of tiny random checkpoints in each released family's format (``python -m dllm_local.tiny_checkpoints.random_sdar
FOLDER`` and the like), whose command line is ``checkpoint_cli``."""
from __future__ import annotations

from typing import Callable


def checkpoint_cli(build: Callable[..., object], doc: str, flags: dict[str, tuple[str, str, object]] | None = None) -> None:
    """``python -m dllm_local.tiny.<family> FOLDER [--FLAG ...]``: write the checkpoint, print
    where. ``flags``: flag -> (help, build's keyword, its value when given)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("folder")
    for flag, (help_, _, _) in (flags or {}).items():
        parser.add_argument(f"--{flag}", action="store_true", help=help_)
    args = parser.parse_args()
    options = {keyword: value for flag, (_, keyword, value) in (flags or {}).items() if getattr(args, flag)}
    from pathlib import Path

    written = Path(build(args.folder, **options))
    mark_untrained(written / "config.json")
    print(json.dumps({"written": str(written)}))


def mark_untrained(config_file) -> None:
    """Say in a random checkpoint's config.json that it was trained on no task (``"trained_tasks":
    []``, our own key), so the page shows its answers as not graded rather than wrong."""
    import json

    raw = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**raw, "trained_tasks": []}, indent=2) + "\n")
