"""``bench``: strategies side by side on an evaluation set (one table), or throughput against
concurrent requests (--concurrency)."""
from __future__ import annotations

import argparse
import sys

from .. import kinds
from ..arguments import COUNT, SLOT_COUNT
from ..devices import DEVICES
from ..errors import SettingsError
from ..limits import BATCH_MODE, BATCH_MODES
from ..experiments.side_by_side import STRATEGY_SETS
from ..experiments.problems import SCORERS
from ..tiny.tasks import TASKS
from .common import BATCH_HELP, check_out, guider_for, load_model, write_out
from .settings_flags import add_settings_args, model_defaults, settings_from_args

NAME = "bench"
SUMMARY = "strategies side by side on an evaluation set: one table"
PROGRESS = True
EXAMPLES = """examples:
  python -m dllm_local bench --n 20
  python -m dllm_local bench --set cache-x-unmask --n 10 --repeats 5 --out bench.json
  python -m dllm_local bench --jsonl my_set.jsonl --scorer contains --model llada-8b-instruct"""


def _levels(text: str) -> list[int]:
    """``1,2,4,8``: increasing request counts."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, such as 1,2,4,8, not {text!r}") from None
    if not levels or min(levels) < 1 or levels != sorted(set(levels)):
        raise argparse.ArgumentTypeError(f"expected increasing whole numbers >= 1, such as 1,2,4,8, not {text!r}")
    return levels


def _repeats(text: str) -> int:
    """--repeats read through the bench's own bound: a bad one stops the command before a model loads."""
    from ..experiments.side_by_side import REPEATS
    from ..values import read

    try:
        return read(REPEATS, text, "repeats")
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("repeats ")) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", default="headline", choices=list(STRATEGY_SETS),
                   help="strategy set (a block-diffusion model's: block)")
    p.add_argument("--task", default="arithmetic", choices=TASKS)
    p.add_argument("--jsonl", default=None, help="a file of {prompt, answer} lines instead of a tiny task")
    p.add_argument("--scorer", default="exact_number", choices=list(SCORERS), help="for --jsonl")
    p.add_argument("--n", type=COUNT, default=20)
    p.add_argument("--seed-data", type=int, default=1000)
    p.add_argument("--repeats", type=_repeats, default=3,
                   help="timed passes per row after one warm-up answer; the table shows the median (default: 3); "
                        "with --concurrency, runs per level")
    p.add_argument("--out", default=None, help="also write the report as JSON here")
    p.add_argument("--batch-size", type=SLOT_COUNT, default=1, help=BATCH_HELP)
    p.add_argument("--batch-mode", choices=BATCH_MODES, default=BATCH_MODE,
                   help="with --batch-size: packed (one forward for the batch, default) or invariant (each problem's "
                        "own forward, its tokens those it gets alone on any hardware; app.py --batch-mode)")
    p.add_argument("--concurrency", type=_levels, default=None, metavar="1,2,4,...",
                   help="instead of the strategy table: throughput and latency at each number of concurrent requests, "
                        "the diffusion model (these settings) against the autoregressive guider, and the crossover")
    p.add_argument("--gpu", default="H100", choices=list(DEVICES),
                   help="the GPU of the cost model's prediction next to --concurrency (default: H100)")
    add_settings_args(p, long_answers=True)


def run(args: argparse.Namespace) -> None:
    from pathlib import Path

    from ..experiments.side_by_side import format_concurrency, format_table, run_bench, run_concurrency
    from ..experiments.problems import jsonl_problems, task_problems

    check_out(args.out)
    if args.concurrency and (args.batch_size != 1 or args.set != "headline"):
        raise SettingsError("--concurrency decodes each level as one batch of its own size, with the settings "
                            "given: it takes no --batch-size or --set")
    if args.jsonl:
        problems = jsonl_problems(Path(args.jsonl), args.scorer, args.n)
    else:
        problems = task_problems(args.task, args.n, args.seed_data)
    handle = load_model(args, args.quiet, batched=args.batch_size > 1 or bool(args.concurrency))
    handle.require_masked("bench")
    model_defaults(args, handle.decoding())  # a block-diffusion model: its own block and its exact cache
    base = settings_from_args(args)
    kind = kinds.get(handle.kind)
    if kind.bench_set and args.set != kind.bench_set:  # the one set of the policies that apply to it
        print(f"{handle.name} is a {kind.label} model: the {kind.bench_set} set, not {args.set}", file=sys.stderr)
        args.set = kind.bench_set
    if args.concurrency:
        guider = guider_for(args, handle, needed=True)
        report = run_concurrency(handle, guider, problems, args.concurrency, base, args.gpu, progress=not args.quiet,
                                 repeats=args.repeats)
        print(format_concurrency(report))
    else:
        strategies = STRATEGY_SETS[args.set]()
        guider = guider_for(args, handle, needed=any(s.settings(base).unmask_spec.needs_guider for s in strategies))
        report = run_bench(handle, problems, strategies, base, guider, args.repeats, progress=not args.quiet,
                           batch_size=args.batch_size, batch_mode=args.batch_mode)
        print(format_table(report))
    write_out(args.out, report, "bench")
