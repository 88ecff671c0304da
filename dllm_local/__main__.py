"""Command line: ``python -m dllm_local {info,generate,eval,bench,sweep,lm-eval}``.

The parser is built from torch-free modules (the registry, the task and strategy names), so
``--help`` and a bad argument answer at once; the engine (torch, the model code) is imported
when a command runs.
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import DllmError, SettingsError
from .policies import registry

# Each policy parameter's shorthand flag stores its value under this prefix (``--floor`` -> ``param_floor``).
PARAM_DEST = "param_"


def _policy_help(kind: str) -> str:
    table = registry.CACHE if kind == "cache" else registry.UNMASK
    return "; ".join(f"{spec.name}: {spec.label}" + (f" [{', '.join(p.name for p in spec.params)}]" if spec.params else "")
                     for spec in table.values())


def policy_params() -> dict[str, list[tuple[registry.PolicySpec, registry.Param]]]:
    """Every parameter of every registered policy by name, with the policies that take it."""
    by_name: dict[str, list[tuple[registry.PolicySpec, registry.Param]]] = {}
    for table in (registry.CACHE, registry.UNMASK):
        for spec in table.values():
            for param in spec.params:
                by_name.setdefault(param.name, []).append((spec, param))
    return by_name


def _param_value(takers: list[tuple[registry.PolicySpec, registry.Param]]):
    """An argparse type: the text as the value of a parameter of any policy that takes it."""
    def parse(text: str):
        for spec, param in takers:
            try:
                return param.coerce(text, spec.name)
            except SettingsError:
                continue
        rules = " or ".join(dict.fromkeys(param.rule() for _, param in takers))
        raise argparse.ArgumentTypeError(f"must be {rules}, not {text!r}")
    return parse


def _owners(specs: list[registry.PolicySpec]) -> str:
    """"cache drift_refresh; unmask guided": the policies, by kind."""
    return "; ".join(f"{kind} {', '.join(s.name for s in specs if s.kind == kind)}"
                     for kind in dict.fromkeys(s.kind for s in specs))


def _add_param_shorthands(ap: argparse.ArgumentParser) -> None:
    """``--NAME`` for each parameter of each registered policy (plugins included): it sets the
    parameter of whichever chosen policy takes it. A name that is already a flag is left to
    --cache-param / --unmask-param."""
    params = policy_params()
    choosers = [f"--{name}" for name in params if name in registry.UNMASK]
    group = ap.add_argument_group(
        "policy parameters", "shorthands for --cache-param / --unmask-param KEY=VALUE; each sets the parameter of the "
        f"chosen policy that takes it. {' or '.join(choosers)} without --unmask also chooses that unmasking policy.")
    for name, takers in params.items():
        # Policies that share a parameter's meaning share its line: "(in (0, 1]; unmask threshold, self_verify)".
        meanings: dict[tuple, list[registry.PolicySpec]] = {}
        for spec, param in takers:
            meanings.setdefault((param.label, param.help, param.rule()), []).append(spec)
        help_ = " | ".join(f"{label}: {text} ({rule}; {_owners(specs)})"
                           for (label, text, rule), specs in meanings.items()).replace("%", "%%")
        try:
            group.add_argument(f"--{name.replace('_', '-')}", dest=PARAM_DEST + name, type=_param_value(takers),
                               default=argparse.SUPPRESS, metavar=name.upper(), help=help_)
        except argparse.ArgumentError:
            continue


def add_settings_args(ap: argparse.ArgumentParser) -> None:
    """The sampler knobs as flags (shared by generate, eval, bench and sweep); the policy names and
    their parameters come from the registry."""
    from .settings import TRACE_LEVELS

    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=None, help="forwards for the fixed schedule (default: one token per step)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default="none", choices=list(registry.CACHE), help=_policy_help("cache"))
    ap.add_argument("--cache-param", action="append", default=[], metavar="KEY=VALUE", help="e.g. refresh_every=4, floor=0.5")
    ap.add_argument("--unmask", default=None, choices=list(registry.UNMASK),
                    help="(default: the policy a given parameter flag is named after, such as --threshold, else fixed) "
                    + _policy_help("unmask"))
    ap.add_argument("--unmask-param", action="append", default=[], metavar="KEY=VALUE", help="e.g. rho=0.5, rule=topk")
    ap.add_argument("--trace", choices=list(TRACE_LEVELS), default="summary")
    ap.add_argument("--exact-drift", action="store_true")
    ap.add_argument("--early-stop", action="store_true")
    ap.add_argument("--guider", default=None, help="guider model for a policy that needs one (default: tiny-guider)")
    _add_param_shorthands(ap)


def add_cluster_args(ap: argparse.ArgumentParser) -> None:
    """Where a sweep or evaluation runs, and the file that keeps every finished problem."""
    from .experiments.units import DEFAULT_CHUNK

    group = ap.add_argument_group("cluster and resuming", "README: When one GPU is not enough")
    group.add_argument("--ray", nargs="?", const="auto", default=None, metavar="auto|local|ADDRESS",
                       help="run on a Ray cluster: auto (the cluster this machine joined; the default of a bare --ray), "
                            "local (a Ray instance of this run's own), or the head's HOST:PORT; one worker per GPU, "
                            "or per --worker-cpus CPUs (needs pip install -r requirements-cluster.txt)")
    group.add_argument("--workers", type=_at_least_one, default=None,
                       help="with --ray: at most this many workers (default: one per GPU, or per CPU slot)")
    group.add_argument("--worker-cpus", type=_at_least_one, default=1,
                       help="with --ray on a cluster without GPUs: CPUs per worker (default: 1)")
    group.add_argument("--chunk", type=_at_least_one, default=DEFAULT_CHUNK,
                       help=f"problems per unit of work handed to a worker (default: {DEFAULT_CHUNK})")
    files = group.add_mutually_exclusive_group()
    files.add_argument("--results", default=None, metavar="FILE",
                       help="append each finished problem to this JSON-lines file (with --ray, default: a new "
                            "COMMAND-DATE-TIME.jsonl here)")
    files.add_argument("--resume", default=None, metavar="FILE",
                       help="go on with a stopped run: skip the problems FILE holds, append the rest to it")


BATCH_HELP = ("problems decoded together, each with its own seed: the same answers as one at a time, in less wall "
              "time (default: 1)")


def _levels(text: str) -> list[int]:
    """``1,2,4,8``: increasing request counts."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, such as 1,2,4,8, not {text!r}") from None
    if not levels or min(levels) < 1 or levels != sorted(set(levels)):
        raise argparse.ArgumentTypeError(f"expected increasing whole numbers >= 1, such as 1,2,4,8, not {text!r}")
    return levels


def _at_least_one(text: str) -> int:
    """An argparse type for counts (--n, --batch-size): a bad one stops the command before a model loads."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, not {text!r}")
    return int(text)


def _repeats(text: str) -> int:
    """--repeats read through the bench's own bound: a bad one stops the command before a model loads."""
    from .experiments.bench import REPEATS
    from .values import read

    try:
        return read(REPEATS, text, "repeats")
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("repeats ")) from None


def _parse_params(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise DllmError(f"parameter {pair!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def settings_from_args(args: argparse.Namespace):
    from .settings import Settings

    given = {dest[len(PARAM_DEST):]: value for dest, value in vars(args).items() if dest.startswith(PARAM_DEST)}
    # A parameter named after its policy, given alone, chooses it: `--threshold 0.9` is threshold decoding.
    unmask = args.unmask or next((name for name in registry.UNMASK if name in given), "fixed")
    cache_params, unmask_params = _parse_params(args.cache_param), _parse_params(args.unmask_param)
    chosen = ((registry.get("cache", args.cache), cache_params), (registry.get("unmask", unmask), unmask_params))
    for name, value in given.items():
        takers = [params for spec, params in chosen if name in spec.defaults]
        if not takers:
            owners = ", ".join(spec.name for spec, _ in policy_params()[name])
            raise SettingsError(f"--{name.replace('_', '-')} is a parameter of {owners}; the chosen policies "
                                f"(cache {args.cache}, unmask {unmask}) do not take it")
        for params in takers:
            params[name] = value
    return Settings(
        gen_length=args.gen_length, block_size=args.block_size, steps=args.steps, temperature=args.temperature,
        seed=args.seed, cache=args.cache, cache_params=cache_params,
        unmask=unmask, unmask_params=unmask_params, trace=args.trace, exact_drift=args.exact_drift,
        early_stop=args.early_stop,
    )


def guider_for(args: argparse.Namespace, handle, settings=None, needed: bool | None = None):
    """The guider model when the settings' unmasking policy (or ``needed``) asks for one."""
    if not (needed if needed is not None else settings.unmask_spec.needs_guider):
        return None
    from .models.loader import load_guider

    return load_guider(args.guider or "tiny-guider", device=handle.device)


def warn_past_trained_length(settings, handle) -> None:
    from .settings import length_notice

    notice = length_notice(settings.gen_length, handle.trained_length)
    if notice:
        print(f"notice: {notice}", file=sys.stderr)


def _load(args: argparse.Namespace):
    from .models.loader import apply_threads, load

    if getattr(args, "quiet", False):  # transformers' own bar (loading weights) goes quiet too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    handle = load(args.model, device=args.device, quantization=args.quantize)
    apply_threads(args.threads, handle, batched=getattr(args, "batch_size", 1) > 1 or bool(getattr(args, "concurrency", None)))
    return handle


def _info(args: argparse.Namespace) -> None:
    handle = _load(args)
    print(json.dumps(handle.summary(), indent=2))


def _generate(args: argparse.Namespace) -> None:
    from .sampler import generate

    settings = settings_from_args(args)
    if not args.prompt.strip():
        raise SettingsError("--prompt is empty: give the question or message to answer")
    handle = _load(args)
    warn_past_trained_length(settings, handle)
    result = generate(handle, args.prompt, settings, guider_for(args, handle, settings))
    if args.json:
        print(result.trace.to_json())
        return
    st = result.stats
    print(result.text)
    print(
        f"\nNFE {st.nfe} | tokens/forward {st.tokens_per_forward:.2f} (content {st.content_tokens_per_forward:.2f}) | "
        f"G {st.mean_g:.1f} | cache hits {st.cache_hit_rate:.0%} | {st.content_tokens_per_s:.1f} content tok/s "
        f"({st.tokens_per_s:.1f} all) from model time {st.model_s:.3f}s | wall {st.wall_s:.3f}s",
        file=sys.stderr,
    )


def _eval(args: argparse.Namespace) -> None:
    from .experiments.evaluate import eval_job, evaluate_guider, format_report, run_eval
    from .models.loader import apply_threads, load_guider

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

    settings = settings_from_args(args)
    job = eval_job(args.task, args.n, args.seed_data, settings, _model_spec(args), args.batch_size)
    results = _results(args, job, "eval")
    try:
        runner = _runner(args, job, settings)
        report = run_eval(job, runner, results, progress=not (args.json or args.quiet), chunk=args.chunk)
    except KeyboardInterrupt:
        raise _interrupted(results) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))


def _bench(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .experiments.bench import (
        STRATEGY_SETS,
        format_concurrency,
        format_table,
        run_bench,
        run_concurrency,
    )
    from .experiments.problems import jsonl_problems, task_problems

    base = settings_from_args(args)
    _check_out(args.out)
    if args.concurrency and (args.batch_size != 1 or args.set != "headline"):
        raise SettingsError("--concurrency decodes each level as one batch of its own size, with the settings "
                            "given: it takes no --batch-size or --set")
    if args.jsonl:
        problems = jsonl_problems(Path(args.jsonl), args.scorer, args.n)
    else:
        problems = task_problems(args.task, args.n, args.seed_data)
    handle = _load(args)
    if args.concurrency:
        guider = guider_for(args, handle, needed=True)
        report = run_concurrency(handle, guider, problems, args.concurrency, base, args.gpu, progress=not args.quiet,
                                 repeats=args.repeats)
        print(format_concurrency(report))
    else:
        strategies = STRATEGY_SETS[args.set]()
        guider = guider_for(args, handle, needed=any(s.settings(base).unmask_spec.needs_guider for s in strategies))
        report = run_bench(handle, problems, strategies, base, guider, args.repeats, progress=not args.quiet,
                           batch_size=args.batch_size)
        print(format_table(report))
    _write_out(args.out, report, "bench")


def _lm_eval(args: argparse.Namespace) -> None:
    settings = settings_from_args(args)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise SettingsError("--tasks is empty: name one or more harness tasks, such as gsm8k or tiny_arithmetic")
    _check_out(args.out)
    from .experiments.harness import format_harness, run_harness

    handle = _load(args)
    warn_past_trained_length(settings, handle)
    report = run_harness(handle, settings, tasks, args.limit, guider_for(args, handle, settings), args.num_fewshot,
                         args.include_path, progress=not args.quiet)
    print(format_harness(report))
    _write_out(args.out, report, "lm-eval", " (the Tune tab's \"Add results\" shows it beside a sweep)")


def _check_out(out: str | None) -> None:
    """--out is written after the whole run: a path that cannot take the report is told before it."""
    import os
    from pathlib import Path

    if not out:
        return
    path = Path(out)
    if path.is_dir():
        raise DllmError(f"--out {out} is a folder: name a file in it, such as {path / 'report.json'}")
    if not path.parent.is_dir():
        raise DllmError(f"--out {out}: the folder {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise DllmError(f"--out {out}: {'the file' if path.exists() else 'its folder'} is not writable")


def _write_out(out: str | None, report: dict, command: str, note: str = "") -> None:
    """The report to --out; if that write fails after all, to a file in the temporary folder, named
    in the error, so a finished run is never lost."""
    import os
    import tempfile
    import time
    from pathlib import Path

    if not out:
        return
    text = json.dumps(report, indent=2)
    try:
        Path(out).write_text(text)
        print(f"wrote {out}{note}")
        return
    except OSError as exc:
        failure = exc.strerror or str(exc)
    fallback = Path(tempfile.gettempdir()) / f"dllm-{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    try:
        fallback.write_text(text)
    except OSError as exc:  # the report is still printed above; say where nothing could be written
        raise DllmError(f"could not write --out {out} ({failure}), nor {fallback} ({exc.strerror or exc})") from None
    raise DllmError(f"could not write --out {out} ({failure}); the report is in {fallback}")


def _number_list(text: str, flag: str) -> list:
    """``"0.7,0.9"`` -> ``[0.7, 0.9]``; anything but a comma-separated list of numbers names ``flag``."""
    try:
        values = [json.loads(v) for v in text.split(",") if v.strip()]
    except json.JSONDecodeError:
        values = None
    if not values or not all(type(v) in (int, float) for v in values):
        raise SettingsError(f"{flag} must be comma-separated numbers such as 0.7,0.9, not {text!r}")
    return values


DEFAULT_THRESHOLDS = "0.5,0.7,0.8,0.9"


def _sweep_axes(args: argparse.Namespace, base) -> dict[str, list]:
    # The default threshold axis only where the unmasking policy has a threshold (a plugin's may not).
    thresholds = args.thresholds
    if thresholds is None and "threshold" in base.unmask_spec.defaults:
        thresholds = DEFAULT_THRESHOLDS
    axes = {"threshold": _number_list(thresholds, "--thresholds")} if thresholds is not None else {}
    axes["block_size"] = _number_list(args.block_sizes, "--block-sizes")
    for extra in args.axis:
        knob, sep, values = extra.partition("=")
        if not sep or not knob:
            raise SettingsError(f"--axis must be KNOB=V1,V2 (for example floor=0.3,0.5), not {extra!r}")
        axes[knob] = _number_list(values, f"--axis {knob}")
    return axes


def _model_spec(args: argparse.Namespace):
    from .experiments.units import ModelSpec

    return ModelSpec(args.model, args.device, args.quantize, args.guider, args.threads)


def _results(args: argparse.Namespace, job, command: str):
    """Where each finished problem goes: --resume FILE (read, then appended to), --results FILE,
    or with --ray a new file named after the command and the time (a cluster run is long)."""
    import time

    from .experiments.units import Results

    path = args.resume or args.results or (args.ray and f"{command}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    results = Results(job, path or None, resume=bool(args.resume))
    if path:
        done = f"{len(results.records)} of {job.total} problems already done; " if args.resume else ""
        print(f"results: {path} ({done}each problem is appended as it finishes; after a stop, the same command "
              f"with --resume {path} in place of --results goes on from there)", file=sys.stderr)
    return results


def _runner(args: argparse.Namespace, job, settings):
    """The cluster's workers (--ray), or this process with the model loaded here."""
    if not args.ray and (args.workers or args.worker_cpus != 1):
        raise SettingsError("--workers and --worker-cpus size a Ray cluster's workers: give --ray too")
    if args.ray:
        from .experiments.cluster import Cluster, ClusterRunner

        runner = ClusterRunner(Cluster(args.ray, args.workers, args.worker_cpus))
        runner.prepare(job)
        return runner
    from .experiments.units import LocalRunner, Worker

    handle = _load(args)
    warn_past_trained_length(settings, handle)
    return LocalRunner(Worker(job, handle, guider_for(args, handle, settings)))


def _interrupted(results) -> SystemExit:
    where = (f"; the {len(results.records)} of {results.job.total} problems done are in {results.path}: the same "
             f"command with --resume {results.path} in place of --results goes on from there"
             ) if results.path and results.records else ""
    print(f"\ninterrupted{where}", file=sys.stderr)
    return SystemExit(130)


def _sweep(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from .experiments.sweep import format_sweep, run_sweep, sweep_job
    from .experiments.units import progress_bar

    base = settings_from_args(args)
    job = sweep_job(base, _sweep_axes(args, base), args.task, args.n, args.seed_data, _model_spec(args))
    _check_out(args.out)
    results = _results(args, job, "sweep")

    def point_done(p) -> None:
        if not args.quiet:
            tqdm.write(f"[{p.done}/{p.total}] {p.point}: accuracy {p.row['accuracy']:.1%}, "
                       f"{p.row['model_tok_s']:.1f} tok/s", file=sys.stderr)

    try:
        runner = _runner(args, job, base)
        with progress_bar(results, "sweep", disable=args.quiet) as on_unit:
            report = run_sweep(job, runner, results, on_point=point_done, on_unit=on_unit, chunk=args.chunk)
    except KeyboardInterrupt:
        raise _interrupted(results) from None
    print(format_sweep(report))
    _write_out(args.out, report, "sweep")


EXAMPLES = {
    "info": """examples:
  python -m dllm_local info tiny
  python -m dllm_local info GSAI-ML/LLaDA-8B-Instruct --quantize 4bit""",
    "generate": """examples:
  python -m dllm_local generate --prompt "Tom has 3 apples. He gets 4 more. How many apples does he have?"
  python -m dllm_local generate --prompt "Give two numbers whose sum is 9." --cache dual --unmask threshold --threshold 0.9
  python -m dllm_local generate --prompt "..." --trace full --json > trace.json""",
    "eval": """examples:
  python -m dllm_local eval --task arithmetic --n 50
  python -m dllm_local eval --task arithmetic --n 50 --cache dual --unmask threshold --threshold 0.9
  python -m dllm_local eval --model tiny-guider --autoregressive --task records
  python -m dllm_local eval --task arithmetic --n 200 --ray local --results eval.jsonl""",
    "bench": """examples:
  python -m dllm_local bench --n 20
  python -m dllm_local bench --set cache-x-unmask --n 10 --repeats 5 --out bench.json
  python -m dllm_local bench --jsonl my_set.jsonl --scorer contains --model llada-8b-instruct""",
    "lm-eval": """examples:
  pip install -r requirements-lmeval.txt    # once: the harness is optional
  python -m dllm_local lm-eval --tasks tiny_arithmetic --limit 20 --gen-length 64
  python -m dllm_local lm-eval --model llada-8b-instruct --tasks gsm8k --cache dual --threshold 0.9 --limit 100""",
    "sweep": """examples:
  python -m dllm_local sweep --n 30
  python -m dllm_local sweep --thresholds 0.7,0.9 --block-sizes 16,32 --axis floor=0.3,0.5 --cache adaptive --out sweep.json
  python -m dllm_local sweep --n 30 --ray local --results sweep.jsonl     # 2+ workers on this machine
  python -m dllm_local sweep --n 30 --ray local --resume sweep.jsonl      # go on after a stop""",
}


POLICIES_HELP = ("modules that register policies of your own, imported before the command runs (installed "
                 "packages' dllm_local.policies entry points load anyway)")


def _policy_modules(argv: list[str] | None) -> list[str]:
    """The --policies modules, read before the parser is built: their policies are choices and flags in it."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    early.add_argument("--policies", default="")
    try:
        return early.parse_known_args(argv)[0].policies.split(",")
    except argparse.ArgumentError:  # the parser proper says what is wrong
        return []


def build_parser() -> argparse.ArgumentParser:
    """Every command and its flags, from torch-free modules only: nothing here loads torch."""
    from .experiments.bench import STRATEGY_SETS
    from .experiments.problems import SCORERS
    from .devices import DEVICES
    from .experiments.sweep import sweepable
    from .tiny.tasks import TASKS

    ap = argparse.ArgumentParser(prog="python -m dllm_local", description="dllm-local engine",
                                 epilog="python -m dllm_local COMMAND --help shows each command's options and examples")
    sub = ap.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str, run, model_flag: bool = True, progress: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary, epilog=EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if model_flag:
            p.add_argument("--model", default="tiny", help="hub id, local folder, or a short name (default: tiny)")
        p.add_argument("--device", default="auto")
        p.add_argument("--quantize", choices=["none", "8bit", "4bit"], default=None)
        p.add_argument("--threads", type=_at_least_one, default=None,
                       help="torch threads on the CPU (default: 1 for a model under 50M parameters, such as the tiny "
                            "model, where one thread is fastest; every core for larger ones)")
        p.add_argument("--policies", default="", metavar="MODULE[,MODULE]", help=POLICIES_HELP)
        if progress:
            p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.set_defaults(run=run)
        return p

    info = command("info", "load a model and print what was loaded", _info, model_flag=False)
    info.add_argument("model", nargs="?", default="tiny", help="hub id, local folder, or a short name (default: tiny)")

    gen = command("generate", "decode one prompt and print the answer and stats", _generate)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--json", action="store_true", help="print the full result (trace included) as JSON")
    add_settings_args(gen)

    ev = command("eval", "score a model on one of the tiny model's tasks", _eval, progress=True)
    ev.add_argument("--task", default="arithmetic", choices=TASKS)
    ev.add_argument("--n", type=_at_least_one, default=200)
    ev.add_argument("--seed-data", type=int, default=1000, help="problem set seed (training uses others)")
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--autoregressive", action="store_true", help="--model is a causal LM (the guider): decode it greedily")
    ev.add_argument("--batch-size", type=_at_least_one, default=1, help=BATCH_HELP)
    add_cluster_args(ev)
    add_settings_args(ev)

    be = command("bench", "strategies side by side on an evaluation set: one table", _bench, progress=True)
    be.add_argument("--set", default="headline", choices=list(STRATEGY_SETS), help="strategy set")
    be.add_argument("--task", default="arithmetic", choices=TASKS)
    be.add_argument("--jsonl", default=None, help="a file of {prompt, answer} lines instead of a tiny task")
    be.add_argument("--scorer", default="exact_number", choices=list(SCORERS), help="for --jsonl")
    be.add_argument("--n", type=_at_least_one, default=20)
    be.add_argument("--seed-data", type=int, default=1000)
    be.add_argument("--repeats", type=_repeats, default=3,
                    help="timed passes per row after one warm-up answer; the table shows the median (default: 3); "
                         "with --concurrency, runs per level")
    be.add_argument("--out", default=None, help="also write the report as JSON here")
    be.add_argument("--batch-size", type=_at_least_one, default=1, help=BATCH_HELP)
    be.add_argument("--concurrency", type=_levels, default=None, metavar="1,2,4,...",
                    help="instead of the strategy table: throughput and latency at each number of concurrent requests, "
                         "the diffusion model (these settings) against the autoregressive guider, and the crossover")
    be.add_argument("--gpu", default="H100", choices=list(DEVICES),
                    help="the GPU of the cost model's prediction next to --concurrency (default: H100)")
    add_settings_args(be)
    be.set_defaults(gen_length=256, block_size=32)

    sw = command("sweep", "grid over threshold x block size (and more): accuracy vs tokens/s, Pareto frontier", _sweep,
                 progress=True)
    sw.add_argument("--thresholds", default=None,
                    help=f"(default: {DEFAULT_THRESHOLDS} when the unmasking policy has a threshold, else none)")
    sw.add_argument("--block-sizes", default="8,16,32")
    sw.add_argument("--axis", action="append", default=[], metavar="KNOB=V1,V2",
                    help=f"another knob to vary: {', '.join(sweepable())}")
    sw.add_argument("--task", default="arithmetic", choices=TASKS)
    sw.add_argument("--n", type=_at_least_one, default=50)
    sw.add_argument("--seed-data", type=int, default=1000)
    sw.add_argument("--out", default=None)
    add_cluster_args(sw)
    add_settings_args(sw)
    sw.set_defaults(cache="dual", unmask="threshold", gen_length=64)

    le = command("lm-eval", "lm-evaluation-harness tasks (gsm8k, ...) decoded with these settings", _lm_eval,
                 progress=True)
    le.add_argument("--tasks", required=True, help="comma-separated harness tasks or YAML paths; bundled and offline: "
                    "tiny_arithmetic")
    le.add_argument("--limit", type=_at_least_one, default=None, help="the first N documents of each task")
    le.add_argument("--num-fewshot", type=int, default=None, help="override the tasks' few-shot count")
    le.add_argument("--include-path", default=None, help="a folder of your own task YAML files")
    le.add_argument("--out", default=None, help="also write the report as JSON here")
    add_settings_args(le)
    le.set_defaults(gen_length=256, block_size=32)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        registry.load_plugins(_policy_modules(argv))
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
