"""``sweep``: a grid over threshold x block size (and more knobs): accuracy against tokens/s and
the Pareto frontier."""
from __future__ import annotations

import argparse
import json
import sys

from .. import kinds
from ..arguments import COUNT
from ..errors import SettingsError
from ..experiments.sweep import sweepable
from ..limits import SWEEP_BLOCK_SIZES, SWEEP_GEN_LENGTH, SWEEP_THRESHOLDS
from ..tiny.tasks import TASKS
from .common import check_out, write_out
from .settings_flags import add_settings_args, model_defaults, settings_from_args
from .work import add_cluster_args, interrupted, model_spec, results_file, runner, say_results_file

NAME = "sweep"
SUMMARY = "grid over threshold x block size (and more): accuracy vs tokens/s, Pareto frontier"
PROGRESS = True
EXAMPLES = """examples:
  python -m dllm_local sweep --n 30
  python -m dllm_local sweep --thresholds 0.7,0.9 --block-sizes 16,32 --axis floor=0.3,0.5 --cache adaptive --out sweep.json
  python -m dllm_local sweep --n 30 --ray local --results sweep.jsonl     # 2+ workers on this machine
  python -m dllm_local sweep --n 30 --ray local --resume sweep.jsonl      # go on after a stop"""


MASKED_CACHE = "dual"  # a masked model's sweep: Fast-dLLM's dual cache unless --cache says otherwise


def _listed(values: tuple) -> str:
    return ",".join(map(str, values))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--thresholds", default=None,
                   help=f"(default: {_listed(SWEEP_THRESHOLDS)} when the unmasking policy has a threshold, else none)")
    p.add_argument("--block-sizes", default=None,
                   help=f"(default: {_listed(SWEEP_BLOCK_SIZES)}; a block-diffusion model's own block)")
    p.add_argument("--axis", action="append", default=[], metavar="KNOB=V1,V2",
                   help=f"another knob to vary: {', '.join(sweepable())}")
    p.add_argument("--task", default="arithmetic", choices=TASKS)
    p.add_argument("--n", type=COUNT, default=50)
    p.add_argument("--seed-data", type=int, default=1000)
    p.add_argument("--out", default=None)
    add_cluster_args(p)
    add_settings_args(p)
    p.set_defaults(unmask="threshold", gen_length=SWEEP_GEN_LENGTH)  # the cache: the model's kind decides (run)


def _number_list(text: str, flag: str) -> list:
    """``"0.7,0.9"`` -> ``[0.7, 0.9]``; anything but a comma-separated list of numbers names ``flag``."""
    try:
        values = [json.loads(v) for v in text.split(",") if v.strip()]
    except json.JSONDecodeError:
        values = None
    if not values or not all(type(v) in (int, float) for v in values):
        raise SettingsError(f"{flag} must be comma-separated numbers such as 0.7,0.9, not {text!r}")
    return values


def sweep_axes(args: argparse.Namespace, base) -> dict[str, list]:
    """The grid's axes from --thresholds, --block-sizes and each --axis, in that order."""
    axes = {}
    if args.thresholds is not None:
        axes["threshold"] = _number_list(args.thresholds, "--thresholds")
    elif "threshold" in base.unmask_spec.defaults:  # the default axis only where the policy has one (a plugin's may not)
        axes["threshold"] = list(SWEEP_THRESHOLDS)
    axes["block_size"] = _number_list(_listed(SWEEP_BLOCK_SIZES) if args.block_sizes is None else args.block_sizes,
                                      "--block-sizes")
    for extra in args.axis:
        knob, sep, values = extra.partition("=")
        if not sep or not knob:
            raise SettingsError(f"--axis must be KNOB=V1,V2 (for example floor=0.3,0.5), not {extra!r}")
        axes[knob] = _number_list(values, f"--axis {knob}")
    return axes


def run(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from ..experiments.sweep import format_sweep, run_sweep, sweep_job
    from ..experiments.units import progress_bar
    from ..models.loading.loader import decoding_facts

    decoding = decoding_facts(args.model)
    model_defaults(args, decoding)  # a block-diffusion model: its own block and its exact cache
    args.cache = args.cache or MASKED_CACHE  # a kind without its own cache
    if args.block_sizes is None and kinds.get(decoding["kind"]).own_block:  # a model's own block alone
        args.block_sizes = str(args.block_size)
    base = settings_from_args(args)
    job = sweep_job(base, sweep_axes(args, base), args.task, args.n, args.seed_data, model_spec(args))
    check_out(args.out)
    results = results_file(args, job, "sweep", beside=args.out)

    def point_done(p) -> None:
        if not args.quiet:
            tqdm.write(f"[{p.done}/{p.total}] {p.point}: accuracy {p.row['accuracy']:.1%}, "
                       f"{p.row['model_tok_s']:.1f} tok/s", file=sys.stderr)

    try:
        work = runner(args, job, base, masked_only="a sweep")
        with progress_bar(results, "sweep", disable=args.quiet) as on_unit:
            report = run_sweep(job, work, results, on_point=point_done, on_unit=on_unit, chunk=args.chunk)
    except KeyboardInterrupt:
        raise interrupted(results) from None
    print(format_sweep(report))
    write_out(args.out, report, "sweep")
    say_results_file(results)
