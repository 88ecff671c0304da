"""Batch mode ``invariant``: each request's forwards are its own, the very calls it makes alone, so
its steps are bit for bit those it decodes alone, whoever shares its batch and whenever it joins;
the mode is set on the command line, refused when misspelt, carried in the trace and said on the page."""
from __future__ import annotations

import multiprocessing
import socket
import threading

import pytest

import app
from dllm_local import Settings, SettingsError, generate, stream
from dllm_local.decoding.batch import BatchRun, generate_all
from test_page import browser  # noqa: F401 - the real browser's fixture

JOINER = ("What is 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11?",
          Settings(cache="dual", unmask="threshold", temperature=0.7, gen_length=32, block_size=8, seed=5))
# Two sets of batch-mates, of other lengths, policies and answer lengths: the joiner meets different
# packed shapes, and takes a slot at a different step.
COMPANIONS = {
    "first": [("What is 12 + 7?", Settings(cache="dual", unmask="fixed", gen_length=8, block_size=8, seed=0)),
              ("Deal a poker hand and name it.", Settings(cache="none", unmask="fixed", gen_length=32, block_size=8))],
    "second": [("hi", Settings(cache="prefix", unmask="threshold", gen_length=16, block_size=8, seed=1)),
               ("What is 9 + 9?", Settings(cache="dual", unmask="fixed", gen_length=24, block_size=8, seed=2))],
}


def _joined_mid_batch(tiny, companions: list, mode: str) -> tuple[BatchRun, int, list, int]:
    """The joiner added while both slots are busy: its commits (with their confidences, as float32
    gives them) and the batch's forward count before its first step."""
    run = BatchRun(tiny, [p for p, _ in companions], [s for _, s in companions], slots=2, max_len=128,
                   batch_mode=mode)
    joined, commits, first = None, [], None
    for i, record in run:
        if joined is None:
            joined = run.add(*JOINER)
        elif i == joined:
            first = run.forwards if first is None else first
            commits.append(record.committed)
    return run, joined, commits, first


def test_a_request_joining_mid_batch_decodes_bit_for_bit_as_alone_whoever_its_batch_mates(tiny):
    alone = [record.committed for record in stream(tiny, *JOINER)]
    firsts = set()
    for name, companions in COMPANIONS.items():
        run, joined, commits, first = _joined_mid_batch(tiny, companions, "invariant")
        assert commits == alone, name  # positions, tokens and each confidence: the same logits, exactly
        assert first > 1, name  # it waited for a slot: it joined a batch already decoding
        firsts.add(first)
        stats = run.results[joined].stats
        assert (stats.batch_mode, stats.batch_size) == ("invariant", 1)  # its forwards were its own
        assert run.batch_mode == "invariant" and run.cache is None  # no shared cache: each request's own
        for k, (prompt, s) in enumerate(companions):  # the batch-mates too
            assert run.results[k].token_ids == generate(tiny, prompt, s).token_ids, (name, k)
    assert len(firsts) == 2  # the two batches took it in at different forwards
    packed, _, _, _ = _joined_mid_batch(tiny, COMPANIONS["first"], "packed")
    assert packed.results[-1].stats.batch_mode == "packed" and packed.results[-1].stats.batch_size == 2


def test_invariant_never_shares_budgets_and_gives_each_request_its_answer_alone(tiny):
    prompts = ["What is 12 + 7?", "hi", "Deal a poker hand and name it."]
    settings = [Settings(cache="adaptive", cache_params={"budget": 0.3}, gen_length=16, block_size=8, seed=k)
                for k in range(3)]
    alone = generate_all(tiny, prompts, settings)
    run = BatchRun(tiny, prompts, settings, slots=2, batch_mode="invariant")  # share_budget asked, by default
    for _ in run:
        pass
    assert run.pool is None and not run.share_budget
    assert [r.token_ids for r in run.results] == [r.token_ids for r in alone]
    assert run.forwards == run.row_forwards == sum(r.stats.nfe for r in run.results)  # one forward per request a step
    static = generate_all(tiny, prompts, settings, batch_size=2, continuous=False, batch_mode="invariant")
    assert [r.token_ids for r in static] == [r.token_ids for r in alone]


def test_the_batch_mode_parses_and_a_bad_one_is_refused_clearly(tiny, capsys):
    assert app.parse_args([]).batch_mode == "packed"
    assert app.parse_args(["--batch-mode", "invariant"]).batch_mode == "invariant"
    with pytest.raises(SystemExit):
        app.parse_args(["--batch-mode", "exact"])
    assert "argument --batch-mode: invalid choice: 'exact'" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="the batch mode must be 'packed' or 'invariant' \\(not 'exact'\\)"):
        BatchRun(tiny, ["hi"], Settings(gen_length=8, block_size=8), batch_mode="exact")
    from dllm_local.serving.session import Session

    with pytest.raises(SettingsError, match="the batch mode must be one of packed, invariant \\(not 'exact'\\)"):
        Session(batch_mode="exact")  # before any engine process starts


def test_the_engine_runs_its_batch_invariant_when_told_and_each_trace_says_so(tiny):
    from dllm_local.serving.engine import serve

    page, engine_end = multiprocessing.Pipe()
    spec = {"model": "tiny", "threads": 1, "slots": 2, "batch_mode": "invariant"}
    loop = threading.Thread(target=serve, args=(engine_end, threading.Event(), spec), daemon=True)
    loop.start()
    assert page.recv()[1] == "ready"
    runs = {"joiner": JOINER, "mate": COMPANIONS["first"][0]}
    for request_id, (prompt, settings) in runs.items():
        page.send((request_id, "run", {"prompt": prompt, "settings": settings.to_dict()}, {}))
    ends, ended = {}, set()
    while len(ended) < len(runs):
        request_id, kind, payload = page.recv()
        if kind == "end":
            ended.add(request_id)
        elif kind == "event" and "end" in payload:
            ends[request_id] = payload["end"]
    page.send((None, "close", {}, {}))
    loop.join(10)
    for request_id, (prompt, settings) in runs.items():
        assert ends[request_id]["stats"]["batch_mode"] == "invariant", request_id
        assert ends[request_id]["final_ids"] == generate(tiny, prompt, settings).trace.final_ids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_in_a_browser_the_page_says_its_batch_mode(browser):  # noqa: F811
    from described_session import DescribedSession
    from ui.page import LAUNCH_OPTIONS, build

    class Invariant(DescribedSession):
        batch_mode = "invariant"

    page = build(Invariant(), {}, [])
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **LAUNCH_OPTIONS)
    try:
        tab = browser.new_page()
        tab.goto(url)
        tab.wait_for_selector("#batch-mode")
        assert tab.inner_text("#batch-mode") == "Batching: invariant (each request's tokens as if alone; one forward " \
                                                "per request a step, slower)"
        tab.get_by_role("tab", name="Lab").click()  # no sign-in: this machine's user sees the Lab tab
        assert "Batching: invariant" in tab.inner_text("#lab-intro")
        tab.close()
    finally:
        page.close()
        page.exports.cleanup()


def test_bench_takes_the_batch_mode_and_its_table_names_it(tiny, capsys):
    from dllm_local.cli import build_parser
    from dllm_local.experiments.problems import task_problems
    from dllm_local.experiments.side_by_side import STRATEGY_SETS, format_table, run_bench

    assert build_parser().parse_args(["bench", "--batch-size", "2", "--batch-mode", "invariant"]).batch_mode == "invariant"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--batch-mode", "exact"])
    assert "argument --batch-mode: invalid choice: 'exact'" in capsys.readouterr().err
    problems, base = task_problems("arithmetic", 4, 1000), Settings(gen_length=16, block_size=8)
    strategies = STRATEGY_SETS["headline"]()[1:2]
    one = run_bench(tiny, problems, strategies, base, repeats=1, progress=False)
    invariant = run_bench(tiny, problems, strategies, base, repeats=1, progress=False, batch_size=2,
                          batch_mode="invariant")
    assert [r["accuracy"] for r in invariant["rows"]] == [r["accuracy"] for r in one["rows"]]
    assert "2 requests at a time, invariant" in format_table(invariant)


def test_an_invariant_batch_takes_a_compiled_run_a_packed_one_leaves_it_alone(tiny):
    from types import SimpleNamespace

    from dllm_local.serving.scheduler import Request, Scheduler

    compiled = Request("r", "run", {"settings": Settings(forward_mode="compiled")})
    engine = SimpleNamespace(handle=tiny)
    assert Scheduler(engine, None, batch_mode="invariant")._batchable(compiled)  # its forwards in its own mode
    assert not Scheduler(engine, None)._batchable(compiled)  # a packed batch runs in the mode auto picks
