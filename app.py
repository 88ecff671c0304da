"""dllm-local playground: ``python app.py`` opens the page on http://127.0.0.1:7860."""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="dllm-local: watch diffusion-LLM decoding step by step")
    ap.add_argument("--model", default="tiny", help="hub id, local folder or short name (default: the embedded tiny model)")
    ap.add_argument("--quantize", choices=["none", "8bit", "4bit"], default="none", help="bitsandbytes quantization (CUDA only)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    ap.add_argument("--guider", default="tiny-guider", help="autoregressive guider for guided decoding")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true", help="opt in to a public Gradio share link")
    ap.add_argument("--preset", default="Fast-dLLM DualCache (paper default)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for a model on the CPU (default: all cores but one, left to the page and browser)")
    return ap.parse_args(argv)


def share_the_cpu(threads: int = 0) -> int:
    """Make the engine a good neighbour of the page in the same process and of a browser on the
    same machine: on the CPU, torch gets all cores but one (an OpenMP team that loses a core to
    the browser slows every step several-fold), and the engine thread gets the GIL back within
    0.5 ms of each torch op instead of waiting out the page's 5 ms default slices."""
    import torch

    sys.setswitchinterval(0.0005)
    threads = threads or max(1, (os.cpu_count() or 1) - 1)
    torch.set_num_threads(threads)
    return threads


def create(args: argparse.Namespace):
    from dllm_local.session import Session, load_presets
    from ui.page import CSS, build

    session = Session(args.model, device=args.device, quantization=None if args.quantize == "none" else args.quantize,
                      guider=args.guider)
    presets, problems = load_presets()
    return build(session, presets, problems, args.preset), session


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    share_the_cpu(args.threads)
    from dllm_local.errors import DllmError
    from ui.page import CSS

    try:
        page, _ = create(args)
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    page.queue(default_concurrency_limit=1)
    print(f"dllm-local: serving on http://{args.host}:{args.port}", flush=True)
    page.launch(server_name=args.host, server_port=args.port, share=args.share, css=CSS, footer_links=[])
    return 0


if __name__ == "__main__":
    sys.exit(main())
