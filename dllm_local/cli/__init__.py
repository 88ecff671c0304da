"""The command line, ``python -m dllm_local {info,generate,eval,bench,sweep,lm-eval}``: the
top-level parser and ``main``; each command's flags and body are a module of this package.

The parser is built from torch-free modules (the registry, the settings' knobs, the task and
strategy names), so ``--help`` and a bad argument answer at once; the engine (torch, the model
code) is imported when a command runs.
"""
from __future__ import annotations

import argparse
import sys

from ..arguments import COUNT
from ..errors import DllmError
from ..offline import allow_downloads
from ..policies import registry
from . import bench, evaluate, generate, info, lm_eval, sweep
from .common import MODEL_HELP

COMMANDS = (info, generate, evaluate, bench, sweep, lm_eval)  # in the order --help lists them
EXAMPLES = {command.NAME: command.EXAMPLES for command in COMMANDS}
POLICIES_HELP = ("modules that register policies of your own, imported before the command runs (installed "
                 "packages' dllm_local.policies entry points load anyway)")


def _early_flags(argv: list[str] | None) -> argparse.Namespace:
    """What is read before the parser is built: the --policies modules (their policies are
    choices and flags in it) and --allow-downloads (before anything imports the hub)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    early.add_argument("--policies", default="")
    early.add_argument("--allow-downloads", action="store_true")
    try:
        return early.parse_known_args(argv)[0]
    except argparse.ArgumentError:  # the parser proper says what is wrong
        return argparse.Namespace(policies="", allow_downloads=False)


DOWNLOADS_HELP = ("let a hub id that is not on this machine be downloaded (without it nothing here reaches the "
                  "network: the hub is offline, telemetry off)")


def build_parser() -> argparse.ArgumentParser:
    """Every command and its flags, from torch-free modules only: nothing here loads torch."""
    ap = argparse.ArgumentParser(prog="python -m dllm_local", description="dllm-local engine",
                                 epilog="python -m dllm_local COMMAND --help shows each command's options and examples")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.SUMMARY, description=command.SUMMARY, epilog=command.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if command is not info:  # info takes the model as its argument
            p.add_argument("--model", default="tiny", help=MODEL_HELP)
        p.add_argument("--device", default="auto")
        p.add_argument("--quantize", choices=["none", "8bit", "4bit"], default=None)
        p.add_argument("--threads", type=COUNT, default=None,
                       help="torch threads on the CPU (default: 1 for a model under 50M parameters, such as the tiny "
                            "model, where one thread is fastest; every core for larger ones)")
        p.add_argument("--policies", default="", metavar="MODULE[,MODULE]", help=POLICIES_HELP)
        p.add_argument("--allow-downloads", action="store_true", help=DOWNLOADS_HELP)
        if command.PROGRESS:
            p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.set_defaults(run=command.run)
        command.add_arguments(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    early = _early_flags(argv)
    if early.allow_downloads:
        allow_downloads()
    try:
        registry.load_plugins(early.policies.split(","))
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
