"""``generate``: decode one prompt and print the answer and its stats (or the whole trace)."""
from __future__ import annotations

import argparse
import sys

from ..errors import SettingsError
from .common import guider_for, load_model, warn_past_trained_length
from .settings_flags import add_settings_args, model_defaults, settings_from_args

NAME = "generate"
SUMMARY = "decode one prompt and print the answer and stats"
PROGRESS = False
EXAMPLES = """examples:
  python -m dllm_local generate --prompt "Tom has 3 apples. He gets 4 more. How many apples does he have?"
  python -m dllm_local generate --prompt "Give two numbers whose sum is 9." --cache dual --unmask threshold --threshold 0.9
  python -m dllm_local generate --prompt "..." --trace full --json > trace.json
  python -m dllm_local generate --model tiny-diffusiongemma --prompt "..." --gen-length 100 --entropy-bound 0.5
  python -m dllm_local generate --model FOLDER_OF_SDAR --prompt "..." --unmask threshold --threshold 0.85"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True)
    p.add_argument("--json", action="store_true", help="print the full result (trace included) as JSON")
    add_settings_args(p)


def run(args: argparse.Namespace) -> None:
    from ..decoding.sampler import generate

    if not args.prompt.strip():
        raise SettingsError("--prompt is empty: give the question or message to answer")
    handle = load_model(args)
    model_defaults(args, handle.decoding())
    settings = settings_from_args(args)
    warn_past_trained_length(settings, handle)
    result = generate(handle, args.prompt, settings, guider_for(args, handle, settings))
    if args.json:
        print(result.trace.to_json())
        return
    st = result.stats
    print(result.text)
    print(
        f"\nNFE {st.nfe}{f' (+ {st.store_forwards} K/V store forwards)' if st.store_forwards else ''} | tokens/forward {st.tokens_per_forward:.2f} (content {st.content_tokens_per_forward:.2f}) | "
        f"G {st.mean_g:.1f} | cache hits {st.cache_hit_rate:.0%} | {st.content_tokens_per_s:.1f} content tok/s "
        f"({st.tokens_per_s:.1f} all) from model time {st.model_s:.3f}s | wall {st.wall_s:.3f}s",
        file=sys.stderr,
    )
