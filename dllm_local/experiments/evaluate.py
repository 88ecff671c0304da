"""Score a model on the task suite: accuracy, NFE, tokens per forward and time per answer."""
from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from ..models.loader import GuiderHandle, ModelHandle
from ..sampler import generate
from ..settings import Settings
from ..tiny.tasks import make_problems
from ..tiny.tasks import score


def evaluate(handle: ModelHandle, task: str, n: int, seed: int, settings: Settings,
             guider: GuiderHandle | None = None, progress: bool = False) -> dict:
    problems = make_problems(task, n, seed)
    rows = []
    start = time.perf_counter()
    for i, ex in enumerate(tqdm(problems, desc=f"{task}", disable=not progress, mininterval=2)):
        r = generate(handle, ex.prompt, settings.for_problem(i), guider)
        rows.append((ex, r, score(ex, r.text)))
    wall = time.perf_counter() - start
    by_kind: dict[str, list[bool]] = {}
    for ex, _, ok in rows:
        by_kind.setdefault(ex.kind, []).append(ok)
    stats = [r.stats for _, r, _ in rows]
    return {
        "task": task, "n": n, "seed": seed, "settings": settings.to_dict(),
        "score": sum(ok for *_, ok in rows) / n,
        "by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_kind.items())},
        "nfe": statistics.mean(s.nfe for s in stats),
        "tokens_per_forward": statistics.mean(s.tokens_per_forward for s in stats),
        "content_tokens_per_forward": statistics.mean(s.content_tokens_per_forward for s in stats),
        "mean_g": statistics.mean(s.mean_g for s in stats),
        "model_s_per_answer": statistics.mean(s.model_s for s in stats),
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


def evaluate_guider(guider: GuiderHandle, task: str, n: int, seed: int, max_new_tokens: int = 64) -> dict:
    """The autoregressive guider alone, greedy: how good a judge it can be."""
    import torch

    tok, model = guider.tokenizer, guider.model
    stop = [tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")]
    correct, start = 0, time.perf_counter()
    examples = []
    for ex in make_problems(task, n, seed):
        text = tok.apply_chat_template([{"role": "user", "content": ex.prompt}], add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=model.device)
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop,
                                 pad_token_id=tok.eos_token_id)
        answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        ok = score(ex, answer)
        correct += ok
        if len(examples) < 5:
            examples.append({"prompt": ex.prompt, "output": answer, "correct": ok})
    return {"task": task, "n": n, "seed": seed, "model": guider.name, "score": correct / n,
            "wall_s_per_answer": (time.perf_counter() - start) / n, "examples": examples}
