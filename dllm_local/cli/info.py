"""``info``: load a model and print what was loaded."""
from __future__ import annotations

import argparse
import json

from .common import MODEL_HELP, load_model

NAME = "info"
SUMMARY = "load a model and print what was loaded"
PROGRESS = False
EXAMPLES = """examples:
  python -m dllm_local info tiny
  python -m dllm_local info GSAI-ML/LLaDA-8B-Instruct --quantize 4bit"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="tiny", help=MODEL_HELP)


def run(args: argparse.Namespace) -> None:
    print(json.dumps(load_model(args).summary(), indent=2))
