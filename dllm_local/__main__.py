"""Command line: ``python -m dllm_local {info,...}``."""
from __future__ import annotations

import argparse
import json
import sys

from .errors import DllmError


def _info(args: argparse.Namespace) -> None:
    from .loader import load

    handle = load(args.model, device=args.device, quantization=args.quantize)
    print(json.dumps(handle.summary(), indent=2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dllm_local", description="dllm-local engine")
    sub = ap.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="load a model and print what was loaded")
    info.add_argument("model", nargs="?", default="tiny")
    info.add_argument("--device", default="auto")
    info.add_argument("--quantize", choices=["none", "8bit", "4bit"], default=None)
    info.set_defaults(run=_info)
    args = ap.parse_args(argv)
    try:
        args.run(args)
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
