"""Score a model on the task suite: accuracy, NFE, tokens per forward and time per answer."""
from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from ..models.loader import GuiderHandle, ModelHandle
from ..batch import generate_all
from ..settings import Settings
from ..tiny.tasks import make_problems, score


def evaluate(handle: ModelHandle, task: str, n: int, seed: int, settings: Settings,
             guider: GuiderHandle | None = None, progress: bool = False, batch_size: int = 1) -> dict:
    """``batch_size`` problems are decoded together; each keeps its own seed, so the answers
    (and the score) are those of one at a time."""
    problems = make_problems(task, n, seed)
    start = time.perf_counter()
    with tqdm(total=n, desc=f"{task}", disable=not progress, mininterval=2) as bar:
        results = generate_all(handle, [ex.prompt for ex in problems], [settings.for_problem(i) for i in range(n)],
                               guider, batch_size, bar.update)
    rows = [(ex, r, score(ex, r.text)) for ex, r in zip(problems, results)]
    wall = time.perf_counter() - start
    by_kind: dict[str, list[bool]] = {}
    for ex, _, ok in rows:
        by_kind.setdefault(ex.kind, []).append(ok)
    stats = [r.stats for _, r, _ in rows]
    return {
        "task": task, "n": n, "seed": seed, "settings": settings.to_dict(), "batch_size": batch_size,
        "score": sum(ok for *_, ok in rows) / n,
        "by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_kind.items())},
        "nfe": statistics.mean(s.nfe for s in stats),
        "tokens_per_forward": statistics.mean(s.tokens_per_forward for s in stats),
        "content_tokens_per_forward": statistics.mean(s.content_tokens_per_forward for s in stats),
        "mean_g": statistics.mean(s.mean_g for s in stats),
        # In a batch each forward's time is split over its requests by the positions they computed.
        "model_s_per_answer": statistics.mean(s.model_share_s for s in stats),
        # An answer ends cleanly when everything after its content is EOS/EOT padding.
        "clean_end": sum(_ends_cleanly(handle, r) for _, r, _ in rows) / n,
        "wall_s_per_answer": wall / n,
        "examples": [{"prompt": ex.prompt, "output": r.text, "correct": ok} for ex, r, ok in rows[:5]],
    }


def _ends_cleanly(handle: ModelHandle, result) -> bool:
    cut = result.stats.content_tokens
    return cut > 0 and all(t in handle.stop_ids for t in result.token_ids[cut:])


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
