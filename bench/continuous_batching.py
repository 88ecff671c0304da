"""Static against continuous batching on a mixed-length workload, side by side in one run.

    python bench/continuous_batching.py [--n 48] [--batch-sizes 8,16] [--rounds 2]

The tiny model's tasks, each problem with its own answer length drawn from 32, 64, 128 and 256
(DualCache, threshold 0.9, block 32, each problem its own seed). Static batching fills a batch
and lets it shrink as its requests finish (the next batch waits for the longest); continuous
batching gives a finished request's slot to the next prompt at once, its first forward packed
with the others' steps. Rounds alternate the two. Prints answers per second (the median round),
whether both gave every problem the same tokens, and the forwards each schedule ran: on a CPU a
forward costs about what its positions cost, so the two compute the same work; on a GPU decoding
a batch, a forward of 16 rows costs about what one row costs (the weights' read), and answers per
second follow the forwards saved (the last column).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, SLOT_LIST  # noqa: E402
import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.decoding.batch import BatchRun, batches  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.models.loading.placement import apply_threads  # noqa: E402
from dllm_local.tiny.tasks import TASKS, make_problems  # noqa: E402

LENGTHS = (32, 64, 128, 256)


def workload(n: int, seed: int = 0, lengths: tuple[int, ...] = LENGTHS, block: int = 32,
             **more) -> tuple[list[str], list[Settings]]:
    """``n`` prompts of the tiny tasks in turn, each with an answer length of ``lengths`` (``more``:
    other settings, such as a forward mode)."""
    draw = random.Random(seed)
    problems = [make_problems(TASKS[i % len(TASKS)], 1, 1000 + i)[0] for i in range(n)]
    settings = [Settings(gen_length=draw.choice(lengths), block_size=block, cache="dual", unmask="threshold", seed=i,
                         **more) for i in range(n)]
    return [p.prompt for p in problems], settings


def compare(handle, prompts: list[str], settings: list[Settings], batch: int, rounds: int = 1) -> dict:
    """Static against continuous batches of ``batch``, ``rounds`` alternated: answers per second
    (the median round), problems with the same tokens, forwards each ran."""
    times: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, list[list[int]]] = {}
    forwards: dict[bool, int] = {}
    for _ in range(rounds):
        for continuous in (False, True):
            start = time.perf_counter()
            tokens[continuous], forwards[continuous] = decode(handle, prompts, settings, batch, continuous)
            times[continuous].append(time.perf_counter() - start)
    static, cont = (len(prompts) / statistics.median(times[c]) for c in (False, True))
    return {"batch": batch, "static_answers_s": static, "continuous_answers_s": cont, "ratio": cont / static,
            "same": sum(a == b for a, b in zip(tokens[False], tokens[True])), "n": len(prompts),
            "forwards_static": forwards[False], "forwards_continuous": forwards[True],
            "forward_ratio": forwards[False] / forwards[True]}


def print_rows(rows: list[dict]) -> None:
    print(f"{'batch':>5} | {'static answers/s':>16} | {'continuous answers/s':>20} | {'ratio':>5} | same answers "
          f"| forwards static, continuous | forward-bound ratio")
    for r in rows:
        print(f"{r['batch']:>5} | {r['static_answers_s']:>16.2f} | {r['continuous_answers_s']:>20.2f} | "
              f"{r['ratio']:>5.2f} | {r['same']:>5}/{r['n']} | {r['forwards_static']:>12}, "
              f"{r['forwards_continuous']:<13} | {r['forward_ratio']:.2f}")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=COUNT, default=48, help="problems in the workload")
    ap.add_argument("--batch-sizes", type=SLOT_LIST, default="8,16")
    ap.add_argument("--rounds", type=COUNT, default=2, help="timed rounds of each schedule, alternated")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    handle = dllm_local.load("tiny")
    apply_threads(None, handle, batched=True)
    prompts, settings = workload(args.n)
    list(BatchRun(handle, prompts[:4], settings[:4], share_budget=False))  # first-call costs out of the timings
    mix = ", ".join(f"{sum(s.gen_length == length for s in settings)} x {length}" for length in LENGTHS)
    print(f"machine: {machine_name()}; tiny model; {args.n} problems, answer lengths {mix}")
    print_rows([compare(handle, prompts, settings, batch, args.rounds) for batch in args.batch_sizes])


def decode(handle, prompts: list[str], settings: list[Settings], batch: int, continuous: bool,
           batch_mode: str = "packed") -> tuple[list[list[int]], int]:
    """Every problem's tokens and the forwards it took: one continuous batch of ``batch`` slots,
    or static batches of ``batch`` problems one after another (``generate_all``'s two schedules),
    in ``batch_mode``."""
    tokens, forwards = [], 0
    for chunk in batches(len(prompts), batch, continuous):
        run = BatchRun(handle, [prompts[i] for i in chunk], [settings[i] for i in chunk], share_budget=False,
                       slots=min(batch, len(chunk)), batch_mode=batch_mode)
        for _ in run:
            pass
        tokens += [r.token_ids for r in run.results]
        forwards += run.forwards
    return tokens, forwards


if __name__ == "__main__":
    main()
