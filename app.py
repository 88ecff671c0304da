"""dllm-local playground: ``python app.py`` opens the page on http://127.0.0.1:7860."""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys

from dllm_local import offline  # before gradio, the hub or Ray is imported

offline.stay_offline()  # telemetry off, the hub offline: --allow-downloads alone turns the hub on

from dllm_local.arguments import COUNT, PORT, SLOT_COUNT, Count, Number  # noqa: E402


THREADS = Count(0, what="a whole number of threads", why="0: all cores but one")
MEMORY_SHARE = Number(0, 1, low_open=True, what="a share of the GPU's memory")


POLICIES_HELP = ("modules that register policies of your own, imported by the page and the engine (installed "
                 "packages' dllm_local.policies entry points load anyway)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from dllm_local.experiments.ray_address import ray_address
    from dllm_local.limits import BATCH_MODE, BATCH_MODES, SLOT_PROMPT_ROOM, SLOTS

    ap = argparse.ArgumentParser(description="dllm-local: watch diffusion-LLM decoding step by step")
    ap.add_argument("--model", default="tiny", help="hub id, local folder or short name (default: the embedded tiny model)")
    ap.add_argument("--quantize", choices=["none", "8bit", "4bit"], default="none", help="bitsandbytes quantization (CUDA; on the CPU too, slower)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    ap.add_argument("--gpu-memory-fraction", type=MEMORY_SHARE, default=None, metavar="F",
                    help="cap the engine at this share of the GPU's memory (for a GPU shared with other programs)")
    ap.add_argument("--guider", default="tiny-guider", help="autoregressive guider for guided decoding")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=PORT, default=7860)
    ap.add_argument("--share", action="store_true", help="opt in to a public Gradio share link (needs --users)")
    ap.add_argument("--users", default=None, metavar="FILE",
                    help="sign-in: the users file (python -m ui.signin add FILE NAME); needed to serve beyond "
                         "127.0.0.1 or with --share")
    lab = ap.add_argument_group("a class on one page (docs/page.md, Running a lab)")
    lab.add_argument("--slots", type=SLOT_COUNT, default=SLOTS,
                     help=f"runs decoding at once in the engine's batch (default {SLOTS}); the others wait in line. "
                          "With a lecturer in --users, one slot more, the lecturer's runs' only")
    lab.add_argument("--batch-mode", choices=BATCH_MODES, default=BATCH_MODE,
                     help="packed (default): one forward for the batch's runs, fastest; on a GPU in bf16 a run's "
                          "tokens may depend on who shares the batch. invariant: each run's own forward, its tokens "
                          "those it gets alone, one forward per run a step (docs/performance.md)")
    lab.add_argument("--max-gen-length", type=COUNT, default=None, metavar="N",
                     help=f"the longest answer a student may ask for; each slot then holds N + {SLOT_PROMPT_ROOM} "
                          "positions (default: the model's maximum)")
    lab.add_argument("--max-users", type=COUNT, default=None, metavar="N",
                     help="users with requests going at once (default: no limit)")
    lab.add_argument("--runs-per-user", type=COUNT, default=None, metavar="N",
                     help="a user's requests going or waiting at once (default: no limit)")
    lab.add_argument("--requests-per-minute", type=COUNT, default=None, metavar="N",
                     help="a user's requests started in any minute (default: no limit)")
    ap.add_argument("--preset", default="Fast-dLLM DualCache (paper default)")
    ap.add_argument("--present", action="store_true",
                    help="open in presenter view: prompt, Run, the step controls, the grid and one panel on one "
                         "1280x720 screen (a box on the page switches it too)")
    ap.add_argument("--threads", type=THREADS, default=0,
                    help="torch threads of the engine process for a model on the CPU "
                         "(default: all cores but one, left to the page and browser)")
    ap.add_argument("--models-dir", default=None, metavar="DIR",
                    help="local model folders in DIR may be loaded from the page's model box (default: none; "
                         "the page loads only its listed models)")
    ap.add_argument("--policies", default="", metavar="MODULE[,MODULE]", help=POLICIES_HELP)
    ap.add_argument("--ray", nargs="?", const="auto", default=None, metavar="auto|local|ADDRESS", type=ray_address,
                    help="run the Tune tab's sweeps on a Ray cluster: auto (the cluster this machine joined; a bare "
                         "--ray), local (a Ray instance of the page's own) or the head's HOST:PORT; "
                         "needs pip install -r requirements-cluster.txt (docs/cluster.md)")
    ap.add_argument("--allow-downloads", action="store_true",
                    help="let the page's model box load (and download) any Hugging Face hub id")
    return ap.parse_args(argv)


def address_problem(host: str, port: int) -> str | None:
    """Why the page cannot serve on ``host:port``, or None. Checked before anything starts:
    Gradio reports a taken port with a traceback after the page is built."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            # As the server will: a port left in TIME_WAIT by a run just closed is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"port {port} is already in use (is the page already running?); choose another with --port"
        return f"cannot serve on {host}:{port} ({exc.strerror or exc}); check --host and --port"
    return None


def create(args: argparse.Namespace, roles: dict[str, str] | None = None):
    """The page and its session; ``roles``: the users file's role by user name (None: no sign-in)."""
    from dllm_local.limits import SLOT_PROMPT_ROOM
    from dllm_local.policies import registry
    from dllm_local.serving.session import Session

    registry.load_plugins(getattr(args, "policies", "").split(","))  # the Session hands them on to the engine
    # The engine process loads the model while this one imports the page.
    session = Session(args.model, device=args.device, quantization=args.quantize, guider=args.guider,
                      threads=args.threads, lazy=True, memory_fraction=getattr(args, "gpu_memory_fraction", None),
                      ray=getattr(args, "ray", None), slots=args.slots, batch_mode=args.batch_mode,
                      max_length=args.max_gen_length and args.max_gen_length + SLOT_PROMPT_ROOM,
                      # a lecturer's runs never wait behind the class: a slot of their own
                      lecture_slots=int("lecturer" in (roles or {}).values()))
    from ui.lab.classroom import Lab, Limits
    from ui.model.access import ModelAccess
    from ui.page import build
    from ui.parts.presets import load_presets

    presets, problems = load_presets()
    models = ModelAccess(getattr(args, "models_dir", None), getattr(args, "allow_downloads", False))
    lab = Lab(Limits(args.max_users, args.runs_per_user, args.requests_per_minute, args.max_gen_length), roles)
    return build(session, presets, problems, args.preset, models=models,
                 present=getattr(args, "present", False), lab=lab), session


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.allow_downloads:
        offline.allow_downloads()
    from ui.login import SignIn
    from ui.signin import read_users, sign_in_problem

    problem = sign_in_problem(args.host, args.share, args.users) or address_problem(args.host, args.port)
    if not problem and args.models_dir and not os.path.isdir(args.models_dir):
        problem = f"--models-dir {args.models_dir} is not a folder; give an existing folder of model folders"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from dllm_local.errors import DllmError

    try:
        sign_in = SignIn(read_users(args.users)) if args.users else None
        page, session = create(args, {name: user.role for name, user in sign_in.users.items()} if sign_in else None)
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ui.page import launch_options

    page.queue(default_concurrency_limit=1)
    # A plain `kill` ends the page like Ctrl-C: the engine closed, the export folder deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        page.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=True,
                    **launch_options(sign_in))
        print(f"dllm-local: serving on http://{args.host}:{args.port}", flush=True)
        page.block_thread()
    except KeyboardInterrupt:  # Ctrl-C: end quietly; the export folder goes below
        pass
    finally:
        session.close()
        page.exports.cleanup()  # also registered with atexit, for any other way out
    return 0


if __name__ == "__main__":
    sys.exit(main())
