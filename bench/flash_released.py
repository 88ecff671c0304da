"""Flash-dLLM as released beside Fast-dLLM, the write-up's pair and LLaDA on the tiny model, in one interleaved run.

    python bench/flash_released.py [--n 200] [--task arithmetic] [--gen-length 64] [--block-size 16] [--threads 1]

The pairs, each at its defaults unless named:

- ``flash`` + ``flash_verify``: Flash-dLLM as its authors released it (tau 0.9, gamma 0.8, track 4,
  masks 4, spans padded to 128);
- ``flash`` + ``threshold`` 0.9: the released cache without the verify forward;
- ``dual`` + ``threshold`` 0.9: Fast-dLLM, the row every ratio is taken against;
- the same with ``early_stop``: ends the answer at its first end of text, as ``flash`` always does
  (``dual`` otherwise decodes the end-of-text padding to ``gen_length``, a forward or so a block);
- ``adaptive`` + ``self_verify``: the write-up's Flash-Cache and Flash-Verify;
- ``none`` + ``fixed``, one token per step: LLaDA, the quality reference.

Held-out problems (problem seed 1000, problem i decoded with seed i, as ``eval`` and
bench/aup_table.py). Times are interleaved: problem by problem, every pair decodes it once, the
order rotated from one problem to the next, so whatever else the machine does hits every pair
alike. Each pair decodes problem 0 once untimed first. AUP is the project's (d3LLM's definition,
``dllm_local.analysis.frontier.policy_curves``, content tokens per forward against accuracy,
y_max the best accuracy of the rows); one point per pair, so a pair's AUP is its content tau
times its accuracy (d3LLM's weight applies from a curve's second point on).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH  # noqa: E402

from dllm_local.experiments.side_by_side import BASELINE, FAST_DLLM, Strategy  # noqa: E402
from dllm_local.devices import machine_name  # noqa: E402
from dllm_local.analysis.frontier import policy_curves, policy_of  # noqa: E402
from dllm_local.settings import Settings  # noqa: E402
from dllm_local.tiny.tasks import TASKS  # noqa: E402

RELEASED = {"cache": "flash", "unmask": "flash_verify", "unmask_params": {}}
PAIRS = {  # key: (what the row is, its settings)
    "released": ("Flash-dLLM as released", Strategy(RELEASED)),
    "flash_threshold": ("released cache, no verify", Strategy({**FAST_DLLM, "cache": "flash"})),
    "fast_dllm": ("Fast-dLLM", Strategy(FAST_DLLM)),
    # flash ends an answer at its first end of text; dual does with early_stop (off by default)
    "fast_dllm_early_stop": ("Fast-dLLM, ends at end of text", Strategy({**FAST_DLLM, "early_stop": True},
                                                                       note="early stop")),
    "write_up": ("the write-up's pair", Strategy({"cache": "adaptive", "unmask": "self_verify", "unmask_params": {}})),
    "llada": ("LLaDA, quality reference", Strategy(BASELINE)),
}
REFERENCE = "fast_dllm"  # the ratios' denominator
VERIFYING = ("released", "write_up")  # the pairs whose steps may add a verify forward


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=COUNT, default=200, help="problems (200: 7 to 10 minutes on 2 CPU cores)")
    ap.add_argument("--task", default="arithmetic", choices=TASKS)
    ap.add_argument("--gen-length", type=LENGTH, default=64)
    ap.add_argument("--block-size", type=LENGTH, default=16, help="16: the released generator's default")
    ap.add_argument("--threads", type=COUNT, default=None,
                    help="torch threads (default: the CLI's, one for the tiny model)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def decode(handle, prompt: str, settings: Settings) -> tuple:
    """One answer through ``dllm_local.stream`` (what ``generate`` runs), with its step records:
    the verify counts are in each step's ``policy`` report, which a trace-off run does not keep."""
    import dllm_local

    run = dllm_local.stream(handle, prompt, settings)
    t = time.perf_counter()
    records = list(run)
    wall = time.perf_counter() - t
    result = run.result
    run.release()
    return result, records, wall


def answer_record(problem, result, records: list, wall: float) -> dict:
    s = result.stats
    verify = [r for r in records if r.forwards > 1]
    return {
        "correct": bool(problem.is_correct(result.text)), "nfe": s.nfe, "steps": len(records),
        "tau": s.tokens_per_forward, "tau_content": s.content_tokens_per_forward, "g": s.mean_g,
        "model_s": s.model_s, "wall_s": wall,
        "verify_forwards": sum(r.forwards - 1 for r in records),
        # flash_verify reports verify_candidates / verify_accepted; self_verify verified / rejected
        "drafts": sum(r.policy.get("verify_candidates", r.policy.get("verified", 0)) for r in verify),
        "accepted": sum(r.policy.get("verify_accepted", 0) for r in verify),
        "rejected": sum(r.policy.get("rejected", 0) for r in verify),
    }


def measure(args: argparse.Namespace, progress: bool = True) -> dict:
    """Every pair on every problem, interleaved; per pair its answers' records."""
    from tqdm import tqdm

    import dllm_local
    from dllm_local.experiments.problems import task_problems
    from dllm_local.models.loading.placement import apply_threads

    handle = dllm_local.load(args.model, device="cpu")
    apply_threads(args.threads, handle)
    problems = task_problems(args.task, args.n, 1000)
    base = Settings(gen_length=args.gen_length, block_size=args.block_size, trace="off")
    settings = {key: strategy.settings(base) for key, (_, strategy) in PAIRS.items()}
    keys = list(PAIRS)
    for key in keys:  # first-call costs (allocations, kernel choice) stay out of the timings
        decode(handle, problems[0].prompt, settings[key])
    answers: dict[str, list[dict]] = {key: [] for key in keys}
    start = time.perf_counter()
    with tqdm(total=len(problems) * len(keys), unit="answer", disable=not progress, mininterval=2) as bar:
        for i, problem in enumerate(problems):
            for k in range(len(keys)):
                key = keys[(i + k) % len(keys)]  # each problem starts with the next pair
                result, records, wall = decode(handle, problem.prompt, settings[key].for_problem(i))
                answers[key].append(answer_record(problem, result, records, wall))
                bar.update()
    return {"machine": machine_name(), "seconds": time.perf_counter() - start, "settings": settings,
            "answers": answers, "base": base}


def summarise(measured: dict) -> list[dict]:
    rows = []
    for key, (role, strategy) in PAIRS.items():
        a = measured["answers"][key]
        mean = lambda field: statistics.mean(x[field] for x in a)  # noqa: E731
        verify = sum(x["verify_forwards"] for x in a)
        rows.append({
            "key": key, "pair": strategy.name(measured["base"]), "role": role, "label": strategy.note or None,
            "settings": measured["settings"][key].to_dict(), "n": len(a),
            "accuracy": mean("correct"), "nfe": mean("nfe"), "steps": mean("steps"), "tau": mean("tau"),
            "tau_content": mean("tau_content"), "g": mean("g"), "model_ms": mean("model_s") * 1e3,
            "wall_ms": mean("wall_s") * 1e3,
            "verify_forwards": verify / len(a),
            "drafts_per_verify": sum(x["drafts"] for x in a) / verify if verify else 0.0,
            "accepted_per_verify": sum(x["accepted"] for x in a) / verify if verify else 0.0,
            "rejected_per_verify": sum(x["rejected"] for x in a) / verify if verify else 0.0,
            # the model time over each half of the problems: what the ratio would be from either half
            "model_ms_halves": [statistics.mean(x["model_s"] for x in half) * 1e3 if half else 0.0
                                for half in (a[: len(a) // 2], a[len(a) // 2:])],
        })
    curves = policy_curves(rows)
    ref = next(r for r in rows if r["key"] == REFERENCE)
    for row in rows:
        row["aup"] = curves[policy_of(row)]["aup"]
        row["nfe_ratio"] = row["nfe"] / ref["nfe"] if ref["nfe"] else 0.0
        row["ms_ratio"] = row["model_ms"] / ref["model_ms"] if ref["model_ms"] else 0.0
        row["ms_ratio_halves"] = [m / r if r else 0.0 for m, r in zip(row["model_ms_halves"], ref["model_ms_halves"])]
    return rows


def format_report(args: argparse.Namespace, measured: dict, rows: list[dict], command: str) -> str:
    ref = next(r for r in rows if r["key"] == REFERENCE)
    lines = [f"$ {command}",
             f"machine: {measured['machine']} | model {args.model}, task {args.task}, n {args.n} (problem seed 1000), "
             f"gen {args.gen_length}, block {args.block_size}, temperature 0 | {measured['seconds']:.0f} s, "
             "the pairs interleaved problem by problem", "",
             "| pair | what | accuracy | forwards / answer | tokens / forward | content tokens / forward | AUP "
             f"| model ms / answer | forwards ÷ {ref['pair']} | model ms ÷ {ref['pair']} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pair']} | {r['role']} | {r['accuracy']:.1%} | {r['nfe']:.2f} | {r['tau']:.2f} | "
                     f"{r['tau_content']:.2f} | {r['aup']:.0f} | {r['model_ms']:.1f} | {r['nfe_ratio']:.2f} | "
                     f"{r['ms_ratio']:.2f} |")
    lines += ["", "Verify forwards (counted in forwards / answer above):", "",
              "| pair | steps / answer | verify forwards / answer | drafts checked / verify forward "
              "| accepted / verify forward | rejected / verify forward |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        if r["key"] in VERIFYING:
            lines.append(f"| {r['pair']} | {r['steps']:.2f} | {r['verify_forwards']:.2f} | {r['drafts_per_verify']:.2f} "
                         f"| {r['accepted_per_verify']:.2f} | {r['rejected_per_verify']:.2f} |")
    best = max(r["accuracy"] for r in rows)
    lines += ["",
              "tokens / forward: every committed token, end-of-text padding included; content: up to the first end "
              "of text (AUP's parallelism). AUP: d3LLM's, one point per pair (content tau x accuracy in %), y_max "
              f"{best:.1%}. model ms: device-synchronised forwards, verify forwards included. "
              "flash_verify accepts drafts (adds commits); self_verify rejects them (sends them back to mask).",
              "model ms ratio from each half of the problems (a noise check): "
              + ", ".join(f"{r['pair']} {r['ms_ratio_halves'][0]:.2f} / {r['ms_ratio_halves'][1]:.2f}" for r in rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = "python bench/flash_released.py " + " ".join(shlex.quote(a) for a in given)
    measured = measure(args, progress=not args.quiet)
    rows = summarise(measured)
    print(format_report(args, measured, rows, command.strip()), flush=True)
    out = {"machine": measured["machine"], "seconds": measured["seconds"], "command": command.strip(),
           "args": vars(args), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
