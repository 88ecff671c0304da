"""Sweeps and evaluations on a Ray cluster: one actor per GPU (or per ``worker_cpus`` CPUs on a
cluster without GPUs), each loading the model once and decoding units (``units.py``). An actor
that is killed or crashes is restarted by Ray, and the unit it held runs again on whichever
worker is free: the results keep each problem once, so nothing is lost or counted twice.

Ray is optional (``pip install -r requirements-cluster.txt``). The driver (this process) loads no
model: a cluster's head node need not have a GPU, nor the weights.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import DllmError
from .units import Job, OnUnit, Results, Unit, Worker, report_unit

INSTALL = "pip install -r requirements-cluster.txt"
ADDRESS_HELP = ("--ray takes local (a Ray instance of this run's own), auto (the cluster this machine has joined) "
                "or the head node's address, HOST:PORT or ray://HOST:PORT")
SMALL_MODELS = ("tiny", "tiny-guider")  # decoded on CPUs at any size of cluster
WAIT_S = 0.5  # how often the driver looks at Stop while units run


def import_ray():
    try:
        import ray
    except ImportError:
        raise DllmError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class Cluster:
    """Where and how wide: ``address`` as ``--ray`` takes it; ``workers`` (default: as many as the
    cluster has GPUs, or CPU slots of ``worker_cpus``); restarts allowed per worker."""
    address: str = "local"
    workers: int | None = None
    worker_cpus: int = 1
    max_restarts: int = 3


def _reachable(address: str) -> None:
    """A HOST:PORT address answers before Ray is asked to join it (Ray itself retries for a minute)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DllmError(f"{ADDRESS_HELP}; {address!r} is none of these")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise DllmError(f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}): start one with "
                        "`ray start --head` on the head node and give the address it prints, and check that its "
                        "port is open from this machine") from None


def connect(cluster: Cluster) -> dict:
    """Join (or, for ``local``, start) the cluster; its resources. The project's code goes with
    the job, so every node imports the same dllm_local as this process."""
    ray = import_ray()
    if ray.is_initialized():
        return ray.cluster_resources()
    package = str(Path(__file__).resolve().parents[1])
    options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
               "runtime_env": {"py_modules": [package]}}
    if cluster.address == "local":
        ray.init(num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1", **options)
    elif cluster.address == "auto":
        try:
            ray.init(address="auto", **options)
        except ConnectionError:
            raise DllmError("no Ray cluster runs on this machine: start one with `ray start --head` (and join "
                            "the other nodes with `ray start --address=HEAD:6379`), or use --ray local for a Ray "
                            "instance of this run's own") from None
    else:
        _reachable(cluster.address)
        try:
            ray.init(address=cluster.address, **options)
        except (ConnectionError, RuntimeError) as exc:
            raise DllmError(f"could not join the Ray cluster at {cluster.address}: {exc}") from None
    return ray.cluster_resources()


def worker_plan(job: Job, cluster: Cluster, resources: dict) -> tuple[Job, int, dict]:
    """The job as the workers load it (device and threads of their slot, the model's path
    absolute), how many workers, and each one's Ray resources."""
    from ..models.loader import ALIASES

    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    spec = job.model
    wants_gpu = spec.device.startswith("cuda") or (spec.device == "auto" and gpus > 0)
    if wants_gpu and not gpus:
        raise DllmError(f"--device {spec.device} needs a GPU per worker, and the cluster has none ({cpus} CPUs): "
                        "start GPU nodes with `ray start --address=HEAD:6379 --num-gpus=N`, or pass --device cpu")
    if not wants_gpu and spec.name not in SMALL_MODELS and spec.device != "cpu":
        raise DllmError(f"the cluster has no GPU ({cpus} CPUs), and {spec.name} is a large model: join GPU nodes "
                        "(`ray start --address=HEAD:6379 --num-gpus=N`), or pass --device cpu to decode it on "
                        "CPUs anyway (slow)")
    if wants_gpu:
        slots, options = gpus, {"num_gpus": 1, "num_cpus": 1}
        device, threads = "cuda", spec.threads
    else:
        slots, options = cpus // cluster.worker_cpus, {"num_cpus": cluster.worker_cpus}
        device, threads = "cpu", spec.threads or cluster.worker_cpus
    if slots < 1:
        raise DllmError(f"the cluster has {cpus} CPUs, fewer than --worker-cpus {cluster.worker_cpus}")

    def where(name: str | None) -> str | None:
        # Aliases and local folders as absolute paths: the workers' code is a copy elsewhere.
        if name is None:
            return None
        name = ALIASES.get(name, name)
        return str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name

    model = replace(spec, name=where(spec.name), guider=where(spec.guider), device=device, threads=threads)
    return replace(job, model=model), min(slots, cluster.workers or slots), options


class _NodeWorker:
    """A Ray actor: one model on one node. A model that cannot load here is reported by
    ``ready`` with the node's name, never raised: a restart would fail the same way."""

    def __init__(self, job: Job, name: str) -> None:
        import ray

        self.node, self.host, self.name = ray.util.get_node_ip_address(), socket.gethostname(), name
        self.worker, self.error = None, None
        try:
            self.worker = Worker.load(job, name)
        except DllmError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raised, the driver names the node
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> dict:
        return {"node": self.node, "host": self.host, "error": self.error}

    def run(self, unit: Unit) -> dict:
        try:
            return {"records": self.worker.run(unit)}
        except DllmError as exc:  # the settings' own error: the same on every worker, so not retried
            return {"error": str(exc)}


class ClusterRunner:
    """Units spread over the cluster's workers, one unit in flight per worker."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.actors: list = []  # the live workers, "w0", "w1"... in order
        self.retried = 0  # units run again after their worker was lost
        # What the cluster costs (bench/cluster_sweep.py): seconds until every worker had its model,
        # and per unit, the seconds from handing it out to its answer against the worker's decoding time.
        self.ready_s = 0.0
        self.unit_seconds: list[tuple[float, float]] = []
        self._plan: tuple[Job, int, dict] | None = None

    def prepare(self, job: Job) -> None:
        """Join the cluster and size the workers: a wrong address, a missing Ray or a cluster
        without the GPUs the model needs is told here, before any results file is written."""
        self._plan = worker_plan(job, self.cluster, connect(self.cluster))

    def run(self, job: Job, units: list[Unit], results: Results, on_unit: OnUnit,
            cancel: threading.Event | None) -> None:
        if not units:
            return
        ray = import_ray()
        if self._plan is None:
            self.prepare(job)
        job, count, options = self._plan
        remote = ray.remote(_NodeWorker).options(max_restarts=self.cluster.max_restarts, max_task_retries=0,
                                                 **options)
        start = time.perf_counter()
        self.actors = [remote.remote(job, f"w{k}") for k in range(min(count, len(units)))]
        try:
            self._check_ready(ray, job)
            self.ready_s = time.perf_counter() - start
            self._spread(ray, units, results, on_unit, cancel)
        finally:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors = []

    def _check_ready(self, ray, job: Job) -> None:
        from ray.exceptions import RayActorError

        try:
            ready = ray.get([a.ready.remote() for a in self.actors])
        except RayActorError as exc:  # the process itself died while loading (out of memory, a crash)
            raise DllmError(f"a worker's process died while it loaded the model {job.model.name}: "
                            f"{str(exc).strip().splitlines()[0]}") from None
        for info in ready:
            if info["error"]:
                raise DllmError(
                    f"node {info['node']} ({info['host']}) cannot load the model {job.model.name}: {info['error']}. "
                    "Every node loads the model from its own disk: put the weights at the same path on each node "
                    "(or the same hub cache, HF_HOME), then run again")

    def _spread(self, ray, units: list[Unit], results: Results, on_unit: OnUnit,
                cancel: threading.Event | None) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError

        queue, idle = deque(units), list(self.actors)
        running: dict = {}  # the call's reference -> (actor, unit, when it was handed out)
        failures = {id(a): 0 for a in self.actors}
        start, decoded = time.perf_counter(), {}
        while queue or running:
            if cancel is not None and cancel.is_set():
                return
            while idle and queue:
                actor, unit = idle.pop(), queue.popleft()
                running[actor.run.remote(unit)] = (actor, unit, time.perf_counter())
            finished, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
            for ref in finished:
                actor, unit, handed_out = running.pop(ref)
                try:
                    answer = ray.get(ref)
                except (RayActorError, ActorUnavailableError):
                    queue.appendleft(unit)  # the unit runs again; a restarted worker takes units again
                    self.retried += 1
                    failures[id(actor)] += 1
                    if failures[id(actor)] <= self.cluster.max_restarts:
                        idle.append(actor)
                    elif not idle and not running:
                        raise DllmError("every worker died more often than it may restart; the problems done are "
                                        "kept in the results file: resume it once the cluster is healthy") from None
                    continue
                if "error" in answer:
                    raise DllmError(answer["error"])
                idle.append(actor)
                self.unit_seconds.append((time.perf_counter() - handed_out, sum(r["wall_s"] for r in answer["records"])))
                for record in answer["records"]:
                    decoded[record["worker"]] = decoded.get(record["worker"], 0) + 1
                elapsed = max(1e-9, time.perf_counter() - start)
                report_unit(results, answer["records"], on_unit, {w: k / elapsed for w, k in sorted(decoded.items())})
