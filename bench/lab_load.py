"""A class on one page: N simulated students run the tiny model at once over 127.0.0.1.

    python bench/lab_load.py --students 8            # one level
    python bench/lab_load.py --students 1,8,30       # the table of several

Starts ``python app.py`` on a free port (the tiny model, the default preset, the engine's batch
of ``--slots`` runs), then N threads, each a student with a gradio_client of its own, click Run
together on a prompt of the tiny tasks (each student a different one). Per level: the first
streamed step's latency and the completion time, p50 and p95 over the students, answers per
second (N over the wall time from the first click to the last answer), and how many students got
exactly the answer a solo run of the same prompt and settings gives (``dllm_local.generate`` in
this process). The machine is named. Then the cost model's projection of the same workload (its
solo runs' mean G and tokens per forward) to LLaDA-8B on one GPU: where the GPU saturates, and
the answers per second its roofline allows at each level.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dllm_local.arguments import COUNT_LIST, SLOT_COUNT  # noqa: E402
import dllm_local  # noqa: E402
from dllm_local import Settings  # noqa: E402
from dllm_local.devices import DEVICES, machine_name  # noqa: E402
from dllm_local.analysis.costmodel import TARGET_MODELS, concurrency_crossovers, concurrency_curve  # noqa: E402
from dllm_local.limits import SLOTS  # noqa: E402
from dllm_local.tiny.tasks import TASKS, make_problems  # noqa: E402
from ui.parts.presets import load_presets  # noqa: E402

DEFAULT_PRESET = "Fast-dLLM DualCache (paper default)"  # what Run decodes with when only a prompt is given
ANSWER = re.compile(r"\*\*Answer:\*\* (.*?)(?: — [✓✗] \*\*|$)", re.S)


def serve(port: int, slots: int) -> subprocess.Popen:
    page = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--slots", str(slots)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    while "serving on" not in (line := page.stdout.readline()):
        if not line:
            raise SystemExit("the page did not start")
    threading.Thread(target=lambda: page.stdout.read(), daemon=True).start()  # keep its pipe drained
    return page


def student(url: str, prompt: str, start: threading.Barrier, out: dict) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    start.wait()
    clicked = time.perf_counter()
    first = None
    final = None
    for outputs in client.submit(prompt, api_name="/run"):
        first = first or time.perf_counter() - clicked
        final = outputs
    out.update(first_s=first, done_s=time.perf_counter() - clicked, end=time.perf_counter(),
               answer=next((m.group(1).strip() for o in final if isinstance(o, str) for m in [ANSWER.search(o)] if m),
                           None))


def level(url: str, prompts: list[str], solo: list[str]) -> dict:
    n = len(prompts)
    start = threading.Barrier(n + 1)
    results = [{} for _ in range(n)]
    threads = [threading.Thread(target=student, args=(url, p, start, r)) for p, r in zip(prompts, results)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in results) - began
    firsts, dones = sorted(r["first_s"] for r in results), sorted(r["done_s"] for r in results)
    return {"students": n, "first_p50": statistics.median(firsts), "first_p95": _p95(firsts),
            "done_p50": statistics.median(dones), "done_p95": _p95(dones), "answers_s": n / wall,
            "identical": sum(r["answer"] == s for r, s in zip(results, solo))}


def _p95(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(0.95 * (len(sorted_values) - 1)))]


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=COUNT_LIST, default="1,8,30", help="students at once, one level each (comma-separated)")
    ap.add_argument("--slots", type=SLOT_COUNT, default=SLOTS, help=f"runs the engine decodes at once (default {SLOTS})")
    ap.add_argument("--device", default="H200", choices=sorted(DEVICES), help="the GPU of the projection")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    levels = args.students
    prompts = [make_problems(TASKS[i % len(TASKS)], 1, 2000 + i)[0].prompt for i in range(max(levels))]
    settings = Settings.from_dict(load_presets()[0][DEFAULT_PRESET]["settings"])
    handle = dllm_local.load("tiny")
    results = [dllm_local.generate(handle, p, settings) for p in prompts]
    solo = [r.text.strip() for r in results]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = serve(port, args.slots)
    try:
        rows = [level(f"http://127.0.0.1:{port}/", prompts[:n], solo[:n]) for n in levels]
    finally:
        page.terminate()
        page.wait(timeout=60)
    print(f"machine: {machine_name()}; the page on 127.0.0.1 with the tiny model, preset {DEFAULT_PRESET!r}, "
          f"{args.slots} slots")
    print(f"{'students':>8} | {'first step p50 / p95 s':>22} | {'done p50 / p95 s':>17} | {'answers/s':>9} | identical to solo")
    for r in rows:
        print(f"{r['students']:>8} | {r['first_p50']:>10.2f} / {r['first_p95']:<9.2f} | {r['done_p50']:>7.2f} / "
              f"{r['done_p95']:<7.2f} | {r['answers_s']:>9.2f} | {r['identical']}/{r['students']}")
    project(results, levels, args.slots, DEVICES[args.device])


def project(results: list, levels: list[int], slots: int, device) -> None:
    """The same workload on LLaDA-8B and one GPU, by the cost model's roofline (a floor: the
    first CUDA run measured steps 3-13x above it, docs/performance.md)."""
    stats = [r.trace.stats for r in results]
    g = statistics.mean(s.mean_g for s in stats)
    tau = statistics.mean(s.content_tokens_per_forward for s in stats)
    answer = statistics.mean(s.content_tokens for s in stats)
    model = TARGET_MODELS["LLaDA-8B-Instruct"]
    turns = concurrency_crossovers(model, device, g, tau)
    curve = concurrency_curve(model, device, g, tau, [min(n, slots) for n in levels])
    at = ", ".join(f"{n} students {row['diffusion_tokens_per_s'] / answer:.0f} answers/s"
                   for n, row in zip(levels, curve))
    print(f"projected to LLaDA-8B on one {device.name} (this workload: G {g:.1f}, {tau:.2f} tokens per forward, "
          f"{answer:.0f} tokens an answer; the roofline floor): the GPU saturates at "
          f"{turns['diffusion_saturates']:.0f} requests decoding at once; {at}")


if __name__ == "__main__":
    main()
