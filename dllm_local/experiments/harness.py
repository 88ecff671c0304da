"""lm-evaluation-harness with this project's decoding: the harness's generation tasks (GSM8K and
the like) scored under any cache and unmasking settings, with NFE, tau and tokens/s of the same run.

    python -m dllm_local lm-eval --model llada-8b-instruct --tasks gsm8k --cache dual --threshold 0.9 --limit 100

The harness is an optional dependency (``pip install -r requirements-lmeval.txt``). Each request's
context is the user message (through the model's chat template, as everywhere in this project);
problem i decodes with seed + i, as ``eval`` and ``bench`` do; the answer is cut at the task's
``until`` strings. The generation length is ours (``--gen-length``), not the task's
``max_gen_toks``: a diffusion model decodes a fixed-length region.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import yaml
from tqdm import tqdm

from ..errors import DllmError, listed
from ..models.loading.loader import GuiderHandle, ModelHandle
from ..decoding.sampler import generate
from ..settings import Settings
from ..devices import machine_name

try:
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
except ImportError as exc:  # pragma: no cover - the message is the point
    raise DllmError("lm-evaluation-harness is not installed: pip install -r requirements-lmeval.txt") from exc

# Tasks shipped with the project, runnable offline: YAML beside its local data file.
BUNDLED_TASKS = Path(__file__).resolve().parent / "harness_tasks"
NOT_SCORES = ("alias", "name", "sample_len", "samples")


class DiffusionLM(LM):
    """The harness's model interface over one loaded model and one ``Settings``."""

    def __init__(self, handle: ModelHandle, settings: Settings, guider: GuiderHandle | None = None,
                 progress: bool = True) -> None:
        super().__init__()
        self.handle, self.settings, self.guider, self.progress = handle, settings, guider, progress
        self.answers: list = []  # (stats, wall seconds) of every answer, for the run's speed

    def generate_until(self, requests) -> list[str]:
        out = []
        for req in tqdm(requests, desc="lm-eval", unit="answer", disable=not self.progress, mininterval=2):
            context, gen_kwargs = req.args
            start = time.perf_counter()
            result = generate(self.handle, context, self.settings.for_problem(req.doc_id), self.guider)
            self.answers.append((result.stats, time.perf_counter() - start))
            out.append(cut_at(result.text, gen_kwargs.get("until") or []))
        return out

    def loglikelihood(self, requests):
        raise DllmError("this task scores log-likelihoods (multiple choice); a masked diffusion model has no exact "
                        "likelihood of a continuation here, so only generation tasks (such as gsm8k) are supported")

    def loglikelihood_rolling(self, requests):
        return self.loglikelihood(requests)


def cut_at(text: str, until: list[str] | str) -> str:
    """``text`` up to the first of the ``until`` strings, as the harness's own models cut."""
    for stop in [until] if isinstance(until, str) else until:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def bundled_tasks() -> list[str]:
    return sorted(p.stem for p in BUNDLED_TASKS.glob("*.yaml"))


def task_spec(name: str) -> str | dict:
    """A bundled task as a config with its data file's absolute path (the harness resolves data
    paths against the working directory); any other name or YAML path goes to the harness as is."""
    path = BUNDLED_TASKS / f"{name}.yaml"
    if not path.is_file():
        return name
    config = yaml.safe_load(path.read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {split: str(BUNDLED_TASKS / f) for split, f in files.items()}
    return config


def _scores(results: dict) -> dict[str, float]:
    return {k: v for k, v in results.items()
            if k not in NOT_SCORES and "_stderr" not in k and isinstance(v, (int, float))}


def run_harness(handle: ModelHandle, settings: Settings, tasks: list[str], limit: int | None = None,
                guider: GuiderHandle | None = None, num_fewshot: int | None = None, include_path: str | None = None,
                progress: bool = True) -> dict:
    """Run the harness; the report has each task's scores and the run's NFE, tau and tokens/s, and
    rows in the sweep report's shape, so the Tune tab can show it as a point beside a sweep."""
    lm = DiffusionLM(handle, settings, guider, progress)
    if not progress:
        import datasets

        datasets.disable_progress_bars()
    specs = [task_spec(t) for t in tasks]
    manager = TaskManager(include_path=include_path, include_defaults=any(isinstance(s, str) for s in specs))
    unknown = [s for s in specs if isinstance(s, str) and s not in manager.all_tasks and not Path(s).is_file()]
    if unknown:
        raise DllmError(f"{listed(unknown, 'unknown harness task')}; bundled: {', '.join(bundled_tasks())}; or "
                        "any task lm_eval lists (`lm-eval ls tasks`), or a task YAML file's path")
    try:
        out = simple_evaluate(model=lm, tasks=specs, limit=limit, num_fewshot=num_fewshot, task_manager=manager,
                              bootstrap_iters=0, log_samples=False)
    except (ConnectionError, OSError) as exc:
        raise DllmError(f"could not load a task's data set ({exc}); the harness downloads it the first time, "
                        "which needs the network") from exc
    stats = [s for s, _ in lm.answers]
    if not stats:
        raise DllmError(f"the tasks {', '.join(tasks)} asked for no generations")
    model_s = sum(s.model_s for s in stats)
    speed = {
        "answers": len(stats),
        "nfe": statistics.mean(s.nfe for s in stats),
        "tau": statistics.mean(s.tokens_per_forward for s in stats),
        "tau_content": statistics.mean(s.content_tokens_per_forward for s in stats),
        "model_tok_s": sum(s.content_tokens for s in stats) / model_s if model_s else 0.0,
        "model_s": model_s / len(stats),
        "wall_s": sum(w for _, w in lm.answers) / len(stats),
    }
    scores = {task: _scores(res) for task, res in out["results"].items()}
    samples = {task: n.get("effective", n.get("original")) for task, n in out.get("n-samples", {}).items()}
    point = {"threshold": settings.unmask_params.get("threshold"), "block_size": settings.block_size}
    rows = []
    for task, task_scores in scores.items():
        metric, accuracy = next(iter(task_scores.items()), ("no score", 0.0))
        rows.append({"point": point, "label": f"{task} {metric} (lm-eval)", "accuracy": accuracy,
                     "n": samples.get(task) or 0, "settings": settings.to_dict(), "pareto": False, **speed})
    return {"kind": "lm-eval", "machine": machine_name(), "model": handle.summary()["name"], "limit": limit,
            "settings": settings.to_dict(), "scores": scores, "samples": samples,
            "axes": {"threshold": [point["threshold"]], "block_size": [settings.block_size]}, "rows": rows, **speed}


def format_harness(report: dict) -> str:
    lines = [f"machine: {report['machine']} | model: {report['model']} | {report['answers']} answers"]
    for task, scores in report["scores"].items():
        n = report["samples"].get(task)
        lines += [f"{task}{f' (n={n})' if n else ''}: " + ", ".join(f"{k} {v:.1%}" for k, v in scores.items())]
    lines.append(f"NFE {report['nfe']:.1f} | tokens/forward {report['tau']:.2f} (content {report['tau_content']:.2f}) | "
                 f"{report['model_tok_s']:.1f} content tok/s from model time | {report['wall_s']:.3f} s per answer")
    return "\n".join(lines)
