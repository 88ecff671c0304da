"""Score a model on the task suite: accuracy, NFE, tokens per forward and time per answer."""
from __future__ import annotations

import time

from ..models.loading.loader import GuiderHandle, ModelHandle
from ..settings import Settings
from ..tiny.tasks import make_problems, score
from .units import (DEFAULT_CHUNK, Job, LocalRunner, ModelSpec, Results, Runner, Worker, plan_units, progress_bar,
                    row_of)


def eval_job(task: str, n: int, seed: int, settings: Settings, model: ModelSpec = ModelSpec(),
             batch_size: int = 1) -> Job:
    return Job(model, task, n, seed, ({},), (settings.to_dict(),), batch_size, settings.to_dict())


def evaluate(handle: ModelHandle, task: str, n: int, seed: int, settings: Settings,
             guider: GuiderHandle | None = None, progress: bool = False, batch_size: int = 1) -> dict:
    """``batch_size`` problems are decoded together; each keeps its own seed, so the answers
    (and the score) are those of one at a time."""
    job = eval_job(task, n, seed, settings, batch_size=batch_size)
    return run_eval(job, LocalRunner(Worker(job, handle, guider)), progress=progress)


def run_eval(job: Job, runner: Runner, results: Results | None = None, progress: bool = False,
             chunk: int = DEFAULT_CHUNK) -> dict:
    """The job's one setting over its problems on ``runner``; a resumed ``results`` skips what it holds."""
    results = results or Results(job)
    with progress_bar(results, job.task, disable=not progress) as on_unit:
        runner.run(job, plan_units(job, results.records, chunk), results, on_unit, None)
    return eval_report(job, results)


def eval_report(job: Job, results: Results) -> dict:
    records = results.of_point(0)
    n = len(records)
    by_kind: dict[str, list[bool]] = {}
    for r in records:
        by_kind.setdefault(r["kind"], []).append(r["correct"])
    row = row_of(records)
    return {
        "task": job.task, "n": n, "seed": job.seed_data, "settings": job.settings[0], "batch_size": job.batch_size,
        "score": row["accuracy"],
        "by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_kind.items())},
        "nfe": row["nfe"], "tokens_per_forward": row["tau"], "content_tokens_per_forward": row["tau_content"],
        "mean_g": row["g"], "model_s_per_answer": row["model_s"],
        "clean_end": sum(r["clean_end"] for r in records) / n,
        "wall_s_per_answer": row["wall_s"],
        "examples": [{"prompt": r["prompt"], "output": r["output"], "correct": r["correct"]} for r in records[:5]],
    }


def format_report(rep: dict) -> str:
    s = rep["settings"]
    lines = [
        f"task {rep['task']} (n={rep['n']}, seed {rep['seed']}) | cache {s['cache']} | unmask {s['unmask']} "
        f"{s['unmask_params'] or ''} | gen {s['gen_length']} block {s['block_size']}",
        f"score {rep['score']:.1%}  " + "  ".join(f"{k} {v:.1%}" for k, v in rep["by_kind"].items()),
        f"NFE {rep['nfe']:.1f} | tokens/forward {rep['tokens_per_forward']:.2f} (content {rep['content_tokens_per_forward']:.2f}) "
        f"| G {rep['mean_g']:.1f} | {rep['model_s_per_answer'] * 1e3:.1f} ms model, {rep['wall_s_per_answer'] * 1e3:.1f} ms wall per answer"
        f" | ends cleanly {rep['clean_end']:.0%}",
    ]
    for e in rep["examples"][:3]:
        lines.append(f"  {'ok ' if e['correct'] else 'BAD'} {e['prompt'][:60]!r} -> {e['output'][:70]!r}")
    return "\n".join(lines)


def evaluate_guider(guider: GuiderHandle, task: str, n: int, seed: int, max_new_tokens: int = 64,
                    batch_size: int = 1) -> dict:
    """The autoregressive guider alone, greedy: how good a judge it can be."""
    problems = make_problems(task, n, seed)
    start = time.perf_counter()
    answers = []
    for first in range(0, n, batch_size):
        answers += ar_generate(guider, [ex.prompt for ex in problems[first : first + batch_size]], max_new_tokens)[0]
    wall = time.perf_counter() - start
    correct = [score(ex, answer) for ex, answer in zip(problems, answers)]
    return {"task": task, "n": n, "seed": seed, "model": guider.name, "score": sum(correct) / n, "batch_size": batch_size,
            "wall_s_per_answer": wall / n,
            "examples": [{"prompt": ex.prompt, "output": a, "correct": ok} for ex, a, ok in zip(problems[:5], answers, correct)]}


def ar_generate(guider: GuiderHandle, prompts: list[str], max_new_tokens: int) -> tuple[list[str], list[int], list[float]]:
    """Greedy answers of the autoregressive model to ``prompts``, decoded as one batch with its
    KV cache (prompts left-padded): each answer, its length in tokens up to its end-of-turn, and
    when it was done (seconds from the call: its end-of-turn token chosen). The batch runs until
    its longest answer ends; rows that are done wait, as in transformers' ``generate``."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        """Notes the time each new token is chosen (the processor runs just before)."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    start = time.perf_counter()

    tok, model = guider.tokenizer, guider.model
    stop = [tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")]
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, ids))
    pad = tok.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids], device=model.device)
    attention = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=model.device)
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=stop, pad_token_id=pad, logits_processor=LogitsProcessorList([clock]))
    done = time.perf_counter()
    texts, lengths, latencies = [], [], []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in stop), len(row))
        texts.append(tok.decode(row[:end], skip_special_tokens=True))
        lengths.append(end)
        # Token ``end`` (its end of turn, or the last) was chosen just after the clock's ``end``-th note.
        latencies.append((clock.times[end] if end < len(clock.times) else done) - start)
    return texts, lengths, latencies
