"""Where an evaluation's or a sweep's units run (this process or a Ray cluster), and the results
file that keeps every finished problem: their flags and what the commands build from them."""
from __future__ import annotations

import argparse
import sys

from ..arguments import COUNT
from ..errors import SettingsError
from .common import guider_for, load_model, warn_past_trained_length


def add_cluster_args(ap: argparse.ArgumentParser) -> None:
    from ..experiments.ray_address import ray_address
    from ..experiments.units import DEFAULT_CHUNK

    group = ap.add_argument_group("cluster and resuming", "docs/cluster.md: When one GPU is not enough")
    group.add_argument("--ray", nargs="?", const="auto", default=None, metavar="auto|local|ADDRESS", type=ray_address,
                       help="run on a Ray cluster: auto (the cluster this machine joined; the default of a bare --ray), "
                            "local (a Ray instance of this run's own), or the head's HOST:PORT; one worker per GPU, "
                            "or per --worker-cpus CPUs (needs pip install -r requirements-cluster.txt)")
    group.add_argument("--workers", type=COUNT, default=None,
                       help="with --ray: at most this many workers (default: one per GPU, or per CPU slot)")
    group.add_argument("--worker-cpus", type=COUNT, default=1,
                       help="with --ray on a cluster without GPUs: CPUs per worker (default: 1)")
    group.add_argument("--chunk", type=COUNT, default=DEFAULT_CHUNK,
                       help=f"problems per unit of work handed to a worker (default: {DEFAULT_CHUNK}; with --batch-size B, "
                            "at least 4 x B)")
    files = group.add_mutually_exclusive_group()
    files.add_argument("--results", default=None, metavar="FILE",
                       help="append each finished problem to this JSON-lines file (with --ray, default: a new "
                            "COMMAND-DATE-TIME.jsonl beside --out, or here without one)")
    files.add_argument("--resume", default=None, metavar="FILE",
                       help="go on with a stopped run: skip the problems FILE holds, append the rest to it")


def model_spec(args: argparse.Namespace):
    from ..experiments.units import ModelSpec

    return ModelSpec(args.model, args.device, args.quantize, args.guider, args.threads)


def results_file(args: argparse.Namespace, job, command: str, beside: str | None = None):
    """Where each finished problem goes: --resume FILE (read, then appended to), --results FILE,
    or with --ray a new file named after the command and the time (a cluster run is long), in the
    folder of ``beside`` (the report the user named), else in the current folder."""
    import time
    from pathlib import Path

    from ..experiments.units import Results

    default = Path(beside or ".").parent / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    path = args.resume or args.results or (args.ray and str(default))
    results = Results(job, path or None, resume=bool(args.resume))
    if path:
        done = f"{len(results.records)} of {job.total} problems already done; " if args.resume else ""
        print(f"results: {path} ({done}each problem is appended as it finishes; after a stop, the same command "
              f"with --resume {path} in place of --results goes on from there)", file=sys.stderr)
    return results


def say_results_file(results) -> None:
    """The end of a run names the file its problems went to, beside the report's own line."""
    if results.path is not None:
        print(f"each problem's record: {results.path}", file=sys.stderr)


def runner(args: argparse.Namespace, job, settings, batched: bool = False, masked_only: str = ""):
    """The cluster's workers (--ray), or this process with the model loaded here; ``masked_only``:
    the work, refused on a canvas model (the workers refuse a sweep themselves)."""
    if not args.ray and (args.workers or args.worker_cpus != 1):
        raise SettingsError("--workers and --worker-cpus size a Ray cluster's workers: give --ray too")
    if args.ray:
        from ..experiments.cluster import Cluster, ClusterRunner

        cluster = ClusterRunner(Cluster(args.ray, args.workers, args.worker_cpus))
        cluster.prepare(job)
        return cluster
    from ..experiments.units import LocalRunner, Worker

    handle = load_model(args, args.quiet, batched)
    if masked_only:
        handle.require_masked(masked_only)
    warn_past_trained_length(settings, handle)
    return LocalRunner(Worker(job, handle, guider_for(args, handle, settings)))


def interrupted(results) -> SystemExit:
    where = (f"; the {len(results.records)} of {results.job.total} problems done are in {results.path}: the same "
             f"command with --resume {results.path} in place of --results goes on from there"
             ) if results.path and results.records else ""
    print(f"\ninterrupted{where}", file=sys.stderr)
    return SystemExit(130)
