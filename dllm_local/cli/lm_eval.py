"""``lm-eval``: lm-evaluation-harness tasks (gsm8k, ...) decoded with these settings."""
from __future__ import annotations

import argparse

from ..arguments import COUNT
from ..errors import SettingsError
from .common import check_out, guider_for, load_model, warn_past_trained_length, write_out
from .settings_flags import add_settings_args, settings_from_args

NAME = "lm-eval"
SUMMARY = "lm-evaluation-harness tasks (gsm8k, ...) decoded with these settings"
PROGRESS = True
EXAMPLES = """examples:
  pip install -r requirements-lmeval.txt    # once: the harness is optional
  python -m dllm_local lm-eval --tasks tiny_arithmetic --limit 20 --gen-length 64
  python -m dllm_local lm-eval --model llada-8b-instruct --tasks gsm8k --cache dual --threshold 0.9 --limit 100"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", required=True, help="comma-separated harness tasks or YAML paths; bundled and offline: "
                   "tiny_arithmetic")
    p.add_argument("--limit", type=COUNT, default=None, help="the first N documents of each task")
    p.add_argument("--num-fewshot", type=int, default=None, help="override the tasks' few-shot count")
    p.add_argument("--include-path", default=None, help="a folder of your own task YAML files")
    p.add_argument("--out", default=None, help="also write the report as JSON here")
    add_settings_args(p, long_answers=True)


def run(args: argparse.Namespace) -> None:
    settings = settings_from_args(args)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise SettingsError("--tasks is empty: name one or more harness tasks, such as gsm8k or tiny_arithmetic")
    check_out(args.out)
    from ..experiments.harness import format_harness, run_harness

    handle = load_model(args, args.quiet)
    warn_past_trained_length(settings, handle)
    report = run_harness(handle, settings, tasks, args.limit, guider_for(args, handle, settings), args.num_fewshot,
                         args.include_path, progress=not args.quiet)
    print(format_harness(report))
    write_out(args.out, report, "lm-eval", " (the Tune tab's \"Add results\" shows it beside a sweep)")
