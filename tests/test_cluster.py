"""Sweeps and evaluations on a real Ray instance on this machine (two CPU workers): the same
answers as in one process, problem for problem; a worker killed mid-sweep loses nothing and
counts nothing twice; a stopped sweep resumed from its results file ends as an unstopped one; and
set-up mistakes end in a message that names the fix."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import ray

from dllm_local.errors import DllmError
from dllm_local.experiments.cluster import Cluster, ClusterRunner, connect, worker_plan
from dllm_local.experiments.evaluate import eval_job, run_eval
from dllm_local.experiments.sweep import run_sweep, sweep_job
from dllm_local.experiments.units import Job, LocalRunner, ModelSpec, Results, Worker
from dllm_local.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
BASE = Settings(gen_length=32, block_size=16, cache="dual", unmask="threshold")
AXES = {"threshold": [0.5, 0.9]}
N = 8


@pytest.fixture(scope="module")
def cluster():
    nodes = connect(Cluster("local"))  # this process's own Ray instance, as --ray local starts it
    assert sum(node["CPU"] for node in nodes) >= 2
    yield Cluster("local", workers=2)
    ray.shutdown()


@pytest.fixture(scope="module")
def job() -> Job:
    return sweep_job(BASE, AXES, "arithmetic", N)


@pytest.fixture(scope="module")
def local(tiny, job):
    """The sweep in this process: what every cluster run must equal."""
    results = Results(job)
    report = run_sweep(job, LocalRunner(Worker(job, tiny, None)), results, chunk=2)
    return results, report


def answers(results: Results) -> dict:
    """What must not change with where a problem ran: its tokens, answer, score and forwards."""
    return {key: (r["token_ids"], r["output"], r["correct"], r["nfe"], r["tau_content"])
            for key, r in results.records.items()}


def figures(report: dict) -> list:
    return [(r["point"], r["accuracy"], r["nfe"], r["tau"], r["tau_content"], r["g"]) for r in report["rows"]]


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def once_all_loaded(runner: ClusterRunner, on_unit):
    """``on_unit``, after waiting (at the first unit) until every worker has its model: the tiny
    model's units are so short that one worker could decode them all while the other still loads."""
    waited = []

    def call(progress) -> None:
        if not waited:
            ray.get([actor.ready.remote() for actor in runner.actors])
            waited.append(True)
        on_unit(progress)
    return call


def test_a_cluster_sweep_equals_the_local_one_problem_for_problem(cluster, job, local, tmp_path):
    results = Results(job, tmp_path / "sweep.jsonl")
    runner = ClusterRunner(cluster)
    seen = []

    report = run_sweep(job, runner, results, on_unit=once_all_loaded(runner, seen.append), chunk=2)
    assert answers(results) == answers(local[0]) and len(results.records) == job.total
    assert figures(report) == figures(local[1])
    assert report["policies"] == local[1]["policies"]  # the same AUP
    assert {r["worker"] for r in results.records.values()} == {"w0", "w1"}  # both workers decoded
    assert set(seen[-1].throughput) == {"w0", "w1"} and seen[-1].done == job.total
    assert len(lines_of(tmp_path / "sweep.jsonl")) == job.total


def test_a_worker_killed_mid_sweep_loses_nothing_and_counts_nothing_twice(cluster, job, local, tmp_path):
    runner = ClusterRunner(cluster)
    killed = []

    def kill_a_busy_worker(progress) -> None:
        if not killed and runner.busy:  # a worker in the middle of a unit
            ray.kill(runner.actors[runner.busy[0]], no_restart=False)
            killed.append(runner.busy[0])

    results = Results(job, tmp_path / "killed.jsonl")
    run_sweep(job, runner, results, on_unit=once_all_loaded(runner, kill_a_busy_worker), chunk=1)
    assert killed and runner.retried >= 1  # its unit ran again
    assert answers(results) == answers(local[0])
    written = [(r["point"], r["problem"]) for r in lines_of(tmp_path / "killed.jsonl")]
    assert sorted(written) == sorted(local[0].records) and len(set(written)) == len(written)


def test_an_interrupted_sweep_resumed_from_its_file_equals_an_uninterrupted_one(cluster, job, local, tmp_path):
    path = tmp_path / "stopped.jsonl"

    def interrupt_after_two_units(progress) -> None:
        if progress.done >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(job, ClusterRunner(cluster), Results(job, path), on_unit=interrupt_after_two_units, chunk=2)
    kept = len(lines_of(path))
    assert 4 <= kept < job.total
    resumed = Results(job, path, resume=True)
    decoded = []
    report = run_sweep(job, ClusterRunner(cluster), resumed, on_unit=lambda p: decoded.extend(p.records), chunk=2)
    assert len(decoded) == job.total - kept  # only what the file did not hold
    assert answers(resumed) == answers(local[0]) and figures(report) == figures(local[1])
    assert len(lines_of(path)) == job.total


def test_a_cluster_eval_equals_the_local_one(cluster, tiny):
    settings = BASE.with_(unmask_params={"threshold": 0.7})
    job = eval_job("records", 5, 1000, settings)
    here = run_eval(job, LocalRunner(Worker(job, tiny, None)))
    there = run_eval(job, ClusterRunner(cluster))
    drop = ("model_s_per_answer", "wall_s_per_answer")
    assert {k: v for k, v in here.items() if k not in drop} == {k: v for k, v in there.items() if k not in drop}


def test_a_node_without_the_weights_is_named_with_the_fix(cluster, job):
    missing = Job(ModelSpec("/nowhere/llada", device="cpu"), job.task, 2, job.seed_data, job.points, job.settings)
    with pytest.raises(DllmError, match=r"node \S+ \(.+\) cannot load the model /nowhere/llada: .*does not exist.* "
                                        r"put the weights at the same path on each node"):
        run_sweep(missing, ClusterRunner(cluster))


def test_a_worker_restarted_where_the_weights_are_gone_answers_with_the_node_and_the_fix(cluster, job):
    """Ray runs a restarted worker's ``__init__`` again: if the model cannot load there any more,
    each unit it is handed is answered with the node's name and the fix (the driver ends the run
    with that message), never an AttributeError from a worker without a model."""
    from dllm_local.experiments.cluster import _NodeWorker
    from dllm_local.experiments.units import Unit

    missing = Job(ModelSpec("/nowhere/llada", device="cpu"), job.task, 2, job.seed_data, job.points, job.settings)
    worker = ray.remote(_NodeWorker).options(num_cpus=1).remote(missing, "w0")
    try:
        answer = ray.get(worker.run.remote(Unit(0, (0, 1))))
    finally:
        ray.kill(worker)
    assert re.fullmatch(r"node \S+ \(.+\) cannot load the model /nowhere/llada: .*does not exist.* put the weights "
                        r"at the same path on each node .*", answer["error"]), answer


@pytest.mark.parametrize("model, nodes, message", [
    (ModelSpec("tiny", device="cuda"), [{"CPU": 8}], "needs a GPU per worker, and the cluster has none"),
    (ModelSpec("llada-8b-instruct"), [{"CPU": 8}], "no GPU .* large model: join GPU nodes"),
    (ModelSpec("tiny"), [{"CPU": 1}, {"CPU": 1}], "no node of the cluster has --worker-cpus 2 CPUs"),
])
def test_a_cluster_without_what_the_model_needs_is_refused(job, model, nodes, message):
    with pytest.raises(DllmError, match=message):
        worker_plan(Job(model, job.task, 2, job.seed_data, job.points, job.settings), Cluster(worker_cpus=2), nodes)


def test_workers_take_a_gpu_each_where_there_are_gpus_and_fit_on_one_node(job):
    planned, count, options = worker_plan(job, Cluster(workers=3), [{"CPU": 64, "GPU": 8}])
    assert count == 3 and options["num_gpus"] == 1 and planned.model.device == "cuda"
    planned, count, options = worker_plan(job, Cluster(worker_cpus=4), [{"CPU": 6}] * 3)  # 18 CPUs, 3 slots
    assert count == 3 and options == {"num_cpus": 4} and planned.model.threads == 4
    assert Path(planned.model.name).is_absolute()  # "tiny" as the path every node reads it from
    assert Path(planned.model.guider).is_absolute()  # and so is the default guider's


# ---------------------------------------------------------------- the command line, in fresh processes

def cli(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dllm_local", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


SWEEP = ["sweep", "--n", "4", "--thresholds", "0.5,0.9", "--block-sizes", "16", "--gen-length", "32", "--chunk", "2"]


@pytest.mark.parametrize("address, message", [
    ("127.0.0.1:1", "cannot reach a Ray cluster at 127.0.0.1:1 .*`ray start --head`"),
    ("nowhere", "--ray takes local .* 'nowhere' is none of these"),
])
def test_a_wrong_address_is_a_message(address, message, tmp_path):
    done = cli(*SWEEP, "--ray", address, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert re.search(message, done.stderr), done.stderr
    assert not list(tmp_path.iterdir())  # no results file left behind


def test_without_ray_the_flag_says_what_to_install(tmp_path):
    blocker = tmp_path / "ray"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    done = cli(*SWEEP, "--ray", "local", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--ray needs Ray, which is not installed here: pip install -r requirements-cluster.txt" in done.stderr


def test_ctrl_c_then_resume_on_the_command_line_gives_the_uninterrupted_table(tmp_path):
    """`sweep --ray local`, stopped with Ctrl-C after some problems, then the same command with
    --resume: the table and every answer equal those of a sweep in one process without a stop."""
    args = [*SWEEP, "--n", "8", "--quiet"]
    whole = cli(*args, "--results", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr
    stopped = tmp_path / "stopped.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dllm_local", *args, "--ray", "local", "--results", str(stopped)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            # Ctrl-C reaches it however the suite was started (a shell's background job ignores SIGINT,
                            # and its children inherit that): Python turns SIGINT into KeyboardInterrupt only if not ignored.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    end = time.monotonic() + 240
    while not (stopped.exists() and len(stopped.read_text().splitlines()) >= 3):  # the header and two problems
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and f"--resume {stopped} in place of --results" in err, err
    kept = len(lines_of(stopped))
    resumed = cli(*args, "--ray", "local", "--resume", str(stopped))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{kept} of 16 problems already done" in resumed.stderr

    def table(out: str) -> list[str]:  # without tok/s, which is time, nor the front's marks, which follow it
        rows = [[cell for cell in line.split() if cell != "*"] for line in out.splitlines() if line.strip()[:1].isdigit()]
        return [" ".join(r[:3] + r[4:]) for r in rows]

    assert table(resumed.stdout) == table(whole.stdout) and "AUP" in resumed.stdout
    key = lambda r: (r["point"], r["problem"])  # noqa: E731
    assert ({key(r): r["token_ids"] for r in lines_of(stopped)} == {key(r): r["token_ids"] for r in lines_of(tmp_path / "whole.jsonl")})
    assert len(lines_of(stopped)) == 16


def test_a_resume_of_another_runs_file_names_what_differs(tmp_path):
    path = tmp_path / "r.jsonl"
    assert cli(*SWEEP, "--results", str(path)).returncode == 0
    done = cli(*SWEEP, "--n", "5", "--resume", str(path))
    assert done.returncode == 2 and "holds the results of another run: these differ from this command's: n." in done.stderr
    again = cli(*SWEEP, "--results", str(path))
    assert again.returncode == 2 and f"--resume {path}" in again.stderr


def test_the_page_runs_its_tune_sweeps_on_the_cluster_and_imports_no_ray():
    """`app.py --ray local`: the Tune tab's sweep, called on a real Gradio server, is decoded by
    the cluster's workers (the status names each one's pace: "w0 12.3/s"; in the engine itself
    the worker is "local") and reports AUP; the page process imported neither Ray nor torch."""
    code = textwrap.dedent("""
        import re, socket, sys
        import app
        from gradio_client import Client
        from ui.page import LAUNCH_OPTIONS

        page, session = app.create(app.parse_args(["--ray", "local"]))
        page.queue(default_concurrency_limit=1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        _, url, _ = page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                                **LAUNCH_OPTIONS)
        job = Client(url, verbose=False).submit("Fast-dLLM DualCache (paper default)", "arithmetic", 8,
                                                "unmask.threshold", "0.5,0.9", "32", 32, api_name="/sweep")
        final = job.result(timeout=300)[-1]
        statuses = [out[-1] for out in job.outputs()]
        print("final:", final)
        print("paced:", any(re.search(r"Problem \\d+/16 .* w\\d [\\d.]+/s", s) for s in statuses))
        print("imported:", "ray" in sys.modules, "torch" in sys.modules)
        page.close()
        session.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith(("final", "paced", "imp")))
    assert said["final"].startswith("Done: 2 points. AUP (") and ": dual + threshold " in said["final"], done.stdout
    assert said["paced"] == "True" and said["imported"] == "False False", done.stdout
