"""Compare's repeat spread on the tiny model, next to the one-run figure the Run tab shows.

    python bench/compare_spread.py [--repeats 5]

For a few pairs of settings (no cache vs DualCache, DualCache vs the adaptive cache at the
adaptive preset's settings, PrefixCache vs DualCache), each side runs as the Compare tab runs it:
in the engine process, once untimed (the "one run" column: what a Run-tab click shows), then in
``--repeats`` interleaved timed repeats (a, b, a, b, ...). The table gives each side's one-run
speed next to its median and min–max, and the verdict of ``ui.parts.timing.speedup`` (the page's own
function): the ratio of the medians, claimed only when the exact Mann–Whitney rank test puts the
two sides' times apart (p < 0.05). A benchmark, not a test: the figures are this machine's at this
moment, so the machine's load is printed with them.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dllm_local.arguments import Count  # noqa: E402
from dllm_local.serving.session import Session  # noqa: E402
from dllm_local.settings import Settings  # noqa: E402
from ui.parts.presets import load_presets  # noqa: E402
from ui.compare.comparison import compare  # noqa: E402
from ui.parts.replay import numbers  # noqa: E402
from ui.parts.timing import MAX_REPEATS, MIN_REPEATS, REPEATS, speedup, spread_text  # noqa: E402

DUAL, PREFIX, ADAPTIVE = "DualCache, blocks of several steps", "Fast-dLLM PrefixCache", "Adaptive I/O-aware cache"


def pairs(presets: dict) -> list[tuple[str, dict, dict, str]]:
    """(what, settings A, settings B, prompt): A's preset prompt, as Compare takes it."""
    dual, prefix, adaptive = (presets[name] for name in (DUAL, PREFIX, ADAPTIVE))

    def cache(preset: dict, name: str) -> dict:
        return dict(preset["settings"], cache=name, cache_params={})

    return [
        ("no cache vs dual (dual preset)", cache(dual, "none"), dual["settings"], dual["prompt"]),
        ("dual vs adaptive (adaptive preset)", cache(adaptive, "dual"), adaptive["settings"], adaptive["prompt"]),
        ("prefix vs dual (their presets)", prefix["settings"], dual["settings"], prefix["prompt"]),
    ]


def timed(session: Session, prompt: str, settings: dict) -> dict:
    return deque(session.run(prompt, Settings.from_dict(settings)), maxlen=1)[0]["trace"]


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=Count(MIN_REPEATS, MAX_REPEATS, what="a number of repeats"), default=REPEATS,
                    help="timed repeats of each side (Compare's control)")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    presets, _ = load_presets()
    session = Session("tiny")  # the page's engine process, with its thread count
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), os.getloadavg()
    try:
        timed(session, presets[DUAL]["prompt"], presets[DUAL]["settings"])  # the engine's first run: start-up costs
        rows = []
        for what, a, b, prompt in pairs(presets):
            one = {"a": timed(session, prompt, a), "b": timed(session, prompt, b)}  # also the warm-up
            runs: dict[str, list[dict]] = {"a": [], "b": []}
            for _ in range(args.repeats):
                for side, settings in (("a", a), ("b", b)):
                    runs[side].append(timed(session, prompt, settings))
            rows.append((what, one, compare(runs["a"][-1], runs["b"][-1], runs["a"], runs["b"])))
    finally:
        session.close()
    load_after = os.getloadavg()
    print(f"{started}, {platform.machine()} with {os.cpu_count()} CPU cores; load average (1, 5, 15 min) "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after")
    print(f"tiny model in the page's engine process; each side once untimed (its one run), then {args.repeats} "
          "interleaved timed repeats; speed = answer tokens / s of model time, as the Run tab's headline\n")
    head = f"{'pair':<36} {'side':<4} {'NFE':>4} {'one run tok/s':>13}  {'median tok/s (min–max)':<32} {'wall: median (min–max)':<36}"
    print(head)
    print("-" * len(head))
    for what, one, result in rows:
        for side in "ab":
            timing = result[f"timing_{side}"]
            same = "" if result[f"same_tokens_{side}"] else "  ⚠ tokens differed between repeats"
            print(f"{what if side == 'a' else '':<36} {side.upper():<4} {result[f'nfe_{side}']:>4} "
                  f"{numbers(one[side])['content_tokens_per_s']:>13.1f}  "
                  f"{spread_text(timing['content_tokens_per_s'], '.1f'):<32} "
                  f"{spread_text(timing['wall_s'], '.3f', ' s'):<36}{same}")
        one_run = speedup([one["a"]["stats"]["wall_s"]], [one["b"]["stats"]["wall_s"]])
        print(f"{'':<36} speedup of B, wall: one run {one_run['ratio']:.2f}×; over the repeats: "
              f"{result['speed_wall']['text']}")
        print(f"{'':<36} speedup of B, model time: {result['speed_model']['text']}\n")


if __name__ == "__main__":
    main()
