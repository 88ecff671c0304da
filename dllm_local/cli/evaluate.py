"""``eval``: score a model (or the guider alone) on one of the tiny model's tasks."""
from __future__ import annotations

import argparse
import json

from ..arguments import COUNT, SLOT_COUNT
from ..errors import SettingsError
from ..tiny.tasks import TASKS
from .common import BATCH_HELP
from .settings_flags import add_settings_args, model_defaults, settings_from_args
from .work import add_cluster_args, interrupted, model_spec, results_file, runner, say_results_file

NAME = "eval"
SUMMARY = "score a model on one of the tiny model's tasks"
PROGRESS = True
EXAMPLES = """examples:
  python -m dllm_local eval --task arithmetic --n 50
  python -m dllm_local eval --task arithmetic --n 50 --cache dual --unmask threshold --threshold 0.9
  python -m dllm_local eval --model tiny-guider --autoregressive --task records
  python -m dllm_local eval --task arithmetic --n 200 --ray local --results eval.jsonl"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="arithmetic", choices=TASKS)
    p.add_argument("--n", type=COUNT, default=200)
    p.add_argument("--seed-data", type=int, default=1000, help="problem set seed (training uses others)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--autoregressive", action="store_true", help="--model is a causal LM (the guider): decode it greedily")
    p.add_argument("--batch-size", type=SLOT_COUNT, default=1, help=BATCH_HELP)
    add_cluster_args(p)
    add_settings_args(p)


def run(args: argparse.Namespace) -> None:
    from ..experiments.evaluate import eval_job, evaluate_guider, format_report, run_eval
    from ..models.loading.loader import apply_threads, decoding_facts, load_guider

    if args.autoregressive and (args.ray or args.resume or args.results):
        raise SettingsError("--autoregressive decodes the guider here, alone: it takes no --ray, --results or --resume")
    if args.autoregressive:
        guider = load_guider(args.model, device=args.device)
        apply_threads(args.threads, guider, batched=args.batch_size > 1)
        report = evaluate_guider(guider, args.task, args.n, args.seed_data, batch_size=args.batch_size)
        print(json.dumps(report, indent=2) if args.json else
              f"task {args.task} (n={args.n}) | {args.model} alone, greedy | score {report['score']:.1%} | "
              f"{report['wall_s_per_answer'] * 1e3:.1f} ms per answer")
        return

    model_defaults(args, decoding_facts(args.model))  # a block-diffusion model: its own block and exact cache
    settings = settings_from_args(args)
    job = eval_job(args.task, args.n, args.seed_data, settings, model_spec(args), args.batch_size)
    results = results_file(args, job, "eval")
    try:
        report = run_eval(job, runner(args, job, settings, batched=args.batch_size > 1), results,
                          progress=not (args.json or args.quiet), chunk=args.chunk)
    except KeyboardInterrupt:
        raise interrupted(results) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    say_results_file(results)
