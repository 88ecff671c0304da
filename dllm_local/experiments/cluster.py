"""Sweeps and evaluations on a Ray cluster: one actor per GPU (or per ``worker_cpus`` CPUs on a
cluster without GPUs), each loading the model once and decoding units (``units.py``). An actor
that is killed or crashes is restarted by Ray, and the unit it held goes to a worker that is up:
the results keep each problem once, so nothing is lost or counted twice.

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
from ..offline import children_offline
from .ray_address import reach_head
from .units import Job, OnUnit, Results, Unit, Worker, report_unit

INSTALL = "pip install -r requirements-cluster.txt"
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


def connect(cluster: Cluster) -> list[dict]:
    """Join (or, for ``local``, start) the cluster; each live node's resources. The project's
    package goes with the job, so the nodes need only its requirements installed."""
    ray = import_ray()
    if not ray.is_initialized():
        package = str(Path(__file__).resolve().parents[1])
        options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
                   "runtime_env": {"py_modules": [package]}}
        if cluster.address == "local":
            with children_offline():
                ray.init(num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1", **options)
        else:
            if cluster.address != "auto":
                reach_head(cluster.address)
            try:
                ray.init(address=cluster.address, **options)
            except ConnectionError:
                if cluster.address != "auto":
                    raise DllmError(f"could not join the Ray cluster at {cluster.address}: is Ray's head "
                                    "there (`ray status` on it)?") from None
                raise DllmError("no Ray cluster runs on this machine: start one with `ray start --head` (and join "
                                "the other nodes with `ray start --address=HEAD:6379`), or use --ray local for a "
                                "Ray instance of this run's own") from None
            except Exception as exc:  # noqa: BLE001 - authentication, a version mismatch: Ray's words, no traceback
                raise DllmError(f"could not join the Ray cluster at {cluster.address}: {type(exc).__name__}: "
                                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''} (a cluster with "
                                "token authentication needs its token here too, and every node the same Ray "
                                "and Python versions)") from None
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def worker_plan(job: Job, cluster: Cluster, nodes: list[dict]) -> tuple[Job, int, dict]:
    """The job as the workers load it (device and threads of their slot, model paths absolute),
    how many workers the nodes hold (a worker lives on one node), and each one's Ray resources."""
    from ..models.loading.loader import ALIASES

    gpus = sum(int(node.get("GPU", 0)) for node in nodes)
    cpus = sum(int(node.get("CPU", 0)) for node in nodes)
    spec = job.model

    def where(name: str) -> str:
        # Aliases and local folders as absolute paths: the workers' code is a copy elsewhere.
        name = ALIASES.get(name, name)
        return str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name

    model_path = where(spec.name)
    wants_gpu = spec.device.startswith("cuda") or (spec.device == "auto" and gpus > 0)
    if wants_gpu and not gpus:
        raise DllmError(f"--device {spec.device} needs a GPU per worker, and the cluster has none ({cpus} CPUs): "
                        "start GPU nodes with `ray start --address=HEAD:6379 --num-gpus=N`, or pass --device cpu")
    if not wants_gpu and model_path != where("tiny") and spec.device != "cpu":
        raise DllmError(f"the cluster has no GPU ({cpus} CPUs), and {spec.name} is a large model: join GPU nodes "
                        "(`ray start --address=HEAD:6379 --num-gpus=N`), or pass --device cpu to decode it on "
                        "CPUs anyway (slow)")
    if wants_gpu:
        slots, options = gpus, {"num_gpus": 1, "num_cpus": 1}
        device, threads = "cuda", spec.threads
    else:
        slots = sum(int(node.get("CPU", 0)) // cluster.worker_cpus for node in nodes)
        options = {"num_cpus": cluster.worker_cpus}
        device, threads = "cpu", spec.threads or cluster.worker_cpus
    if slots < 1:
        raise DllmError(f"no node of the cluster has --worker-cpus {cluster.worker_cpus} CPUs (it has {cpus} in all)")
    model = replace(spec, name=model_path, guider=where(spec.guider or "tiny-guider"), device=device, threads=threads)
    return replace(job, model=model), min(slots, cluster.workers or slots), options


def _cannot_load(info: dict, model: str) -> str:
    return (f"node {info['node']} ({info['host']}) cannot load the model {model}: {info['error']}. Every node loads "
            "the model from its own disk: put the weights at the same path on each node (or the same hub cache, "
            "HF_HOME), then run again")


class _NodeWorker:
    """A Ray actor: one model on one node. A model that cannot load here is reported with the
    node's name (by ``ready``, or by ``run`` after a restart), never raised: a restart would fail
    the same way."""

    def __init__(self, job: Job, name: str) -> None:
        import ray

        self.model, self.name = job.model.name, name
        self.info = {"node": ray.util.get_node_ip_address(), "host": socket.gethostname(), "error": None}
        self.worker = None
        try:
            self.worker = Worker.load(job, name)
        except DllmError as exc:
            self.info["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raised, the driver names the node
            self.info["error"] = f"{type(exc).__name__}: {exc}"

    def ready(self) -> dict:
        return self.info

    def run(self, unit: Unit) -> dict:
        if self.worker is None:
            return {"error": _cannot_load(self.info, self.model)}
        try:
            return {"records": self.worker.run(unit)}
        except DllmError as exc:  # the settings' own error: the same on every worker, so not retried
            return {"error": str(exc)}


class ClusterRunner:
    """Units spread over the cluster's workers, one unit in flight per worker, each handed out as
    soon as a worker has loaded its model or finished its last unit."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.actors: list = []  # the workers, "w0", "w1"... in order
        self.retried = 0  # units run again after their worker was lost
        # What the cluster costs (bench/cluster_sweep.py): seconds until every worker had its model,
        # and per unit, the seconds from handing it out to its answer against the worker's decoding time.
        self.ready_s = 0.0
        self.unit_seconds: list[tuple[float, float]] = []
        self._plan: tuple[Job, int, dict] | None = None
        self._running: dict = {}

    @property
    def busy(self) -> list[int]:
        """The workers (indices into ``actors``) with a unit in flight."""
        return sorted({self.actors.index(actor) for actor, _, _ in self._running.values()})

    def prepare(self, job: Job) -> None:
        """Join the cluster and size the workers: a wrong address, a missing Ray or a cluster
        without the GPUs the model needs is told here, before any work."""
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
        self.actors = [remote.remote(job, f"w{k}") for k in range(min(count, len(units)))]
        try:
            self._spread(ray, job, units, results, on_unit, cancel)
        finally:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors = []

    def _spread(self, ray, job: Job, units: list[Unit], results: Results, on_unit: OnUnit,
                cancel: threading.Event | None) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        start = time.perf_counter()
        queue, idle = deque(units), deque()  # idle: handed out from the right; a restarting worker waits left
        loading = {actor.ready.remote(): actor for actor in self.actors}
        running = self._running = {}  # the call's reference -> (worker, unit, when it was handed out)
        gone: list[str] = []  # why workers died for good
        lost: dict[Unit, int] = {}  # how often each unit's worker was lost under it
        decoded: dict[str, int] = {}
        while queue or running:
            if cancel is not None and cancel.is_set():
                return
            while idle and queue:
                actor, unit = idle.pop(), queue.popleft()
                running[actor.run.remote(unit)] = (actor, unit, time.perf_counter())
            if not (loading or running or idle):
                raise DllmError(f"every worker is gone ({'; '.join(dict.fromkeys(gone))}); the problems done are in "
                                "the results file: resume it once the cluster is healthy")
            finished, _ = ray.wait([*loading, *running], num_returns=1, timeout=WAIT_S)
            for ref in finished:
                if ref in loading:
                    actor = loading.pop(ref)
                    try:
                        info = ray.get(ref)
                    except ActorUnavailableError:  # restarting while it loaded: ask again
                        loading[actor.ready.remote()] = actor
                        continue
                    except RayActorError as exc:  # its process died for good while loading (memory, a crash)
                        gone.append(f"one died while it loaded the model: {str(exc).strip().splitlines()[0]}")
                        continue
                    if info["error"]:
                        raise DllmError(_cannot_load(info, job.model.name))
                    idle.append(actor)
                    self.ready_s = time.perf_counter() - start
                    continue
                actor, unit, handed_out = running.pop(ref)
                try:
                    answer = ray.get(ref)
                except RayActorError as exc:
                    lost[unit] = lost.get(unit, 0) + 1
                    if lost[unit] > self.cluster.max_restarts:
                        raise DllmError(f"point {job.points[unit.point]}, problems {unit.problems[0]} to "
                                        f"{unit.problems[-1]}, ended {lost[unit]} workers; the problems done are in "
                                        "the results file") from None
                    queue.appendleft(unit)  # to a worker that is up; a restarting one takes units when back
                    self.retried += 1
                    if isinstance(exc, ActorUnavailableError):  # it is restarting (a died one is gone for good)
                        idle.appendleft(actor)
                    else:
                        gone.append("each died more often than it may restart")
                    continue
                except RayTaskError as exc:
                    raise DllmError(f"a worker failed on point {job.points[unit.point]}: "
                                    f"{type(exc.cause).__name__}: {exc.cause}") from None
                if "error" in answer:
                    raise DllmError(answer["error"])
                idle.append(actor)
                self.unit_seconds.append((time.perf_counter() - handed_out, sum(r["wall_s"] for r in answer["records"])))
                for record in answer["records"]:
                    decoded[record["worker"]] = decoded.get(record["worker"], 0) + 1
                elapsed = max(1e-9, time.perf_counter() - start)
                report_unit(results, answer["records"], on_unit, {w: k / elapsed for w, k in sorted(decoded.items())})
