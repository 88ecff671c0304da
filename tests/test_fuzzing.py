"""Property-based tests (Hypothesis) at each boundary: whatever JSON a file, an upload or an API
call brings, the schema answers with a clear error (the project's own, naming the field) or a
correct result, never another exception. Derandomized and bounded, so CI sees the same examples
on every run."""
from __future__ import annotations

import copy
import json

import gradio as gr
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dllm_local
from dllm_local import Settings
from dllm_local.errors import DllmError
from dllm_local.analysis.reports import add_points
from dllm_local.experiments.sweep import sweep_job
from dllm_local.experiments.units import RESULTS_FORMAT, Results
from dllm_local.prompts import encode_prompt
from dllm_local.trace import parse_trace
from ui.parts.inputs import Choice, ColorBy, Fraction, KVView, PageState, StepIndex, Which, checked
from ui.parts.presets import read_preset
from ui.run.tab import show_cost
from ui.tune.tab import show_concurrency

BOUNDED = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                           max_size=4), max_leaves=12)
KNOBS = ["gen_length", "block_size", "steps", "temperature", "seed", "cache", "cache_params", "unmask",
         "unmask_params", "trace", "exact_drift", "early_stop"]


def _plausible_settings() -> st.SearchStrategy:
    """Dicts of real knob names with values near and far from their ranges."""
    values = {
        "gen_length": st.integers(-5, 5000) | SCALARS, "block_size": st.integers(-5, 600) | SCALARS,
        "cache": st.sampled_from(["none", "dual", "prefix", "adaptive", "drift_refresh", "nope"]) | SCALARS,
        "unmask": st.sampled_from(["fixed", "threshold", "revise", "factor", "self_verify"]) | SCALARS,
        "cache_params": st.dictionaries(st.sampled_from(["refresh_every", "floor", "budget", "gamma", "x"]), SCALARS,
                                        max_size=3) | JSON,
        "unmask_params": st.dictionaries(st.sampled_from(["threshold", "factor", "max_revisions", "rho", "x"]),
                                         SCALARS, max_size=3) | JSON,
    }
    return st.fixed_dictionaries({}, optional={k: values.get(k, SCALARS) for k in KNOBS})


@BOUNDED
@given(data=_plausible_settings() | st.dictionaries(st.text(max_size=10), JSON, max_size=4) | JSON)
def test_settings_from_any_json_load_or_name_the_knob(data):
    try:
        s = Settings.from_dict(data)
    except DllmError as exc:
        assert str(exc)
        return
    assert Settings.from_dict(s.to_dict()) == s  # what loads, saves and loads the same


@pytest.fixture(scope="module")
def real_trace(tiny) -> dict:
    result = dllm_local.generate(tiny, "Give two numbers whose sum is 9.",
                                 Settings(gen_length=16, block_size=8, cache="dual", trace="full"))
    return json.loads(result.trace.to_json())


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):
            yield from _paths(value, (*prefix, i))


@BOUNDED
@given(data=st.data())
def test_a_trace_with_any_field_replaced_is_read_or_refused_by_name(real_trace, data):
    trace = copy.deepcopy(real_trace)
    paths = [p for p in _paths(trace) if p]
    path = data.draw(st.sampled_from(paths))
    node = trace
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(JSON)
    try:
        parse_trace(trace)
    except DllmError as exc:
        assert str(exc).startswith("not a valid trace: ")


@BOUNDED
@given(data=st.fixed_dictionaries({"name": SCALARS, "description": SCALARS, "settings": JSON},
                                  optional={"prompt": SCALARS, "view": JSON}) | JSON)
def test_a_preset_file_of_any_json_loads_or_is_skipped_with_a_message(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("preset") / "p.json"
    path.write_text(json.dumps(data))
    try:
        preset = read_preset(path)
    except ValueError as exc:
        assert str(exc)
        return
    Settings.from_dict(preset["settings"])
    assert isinstance(preset["name"], str) and preset["name"]


ROW = st.fixed_dictionaries({"point": JSON, "accuracy": SCALARS, "model_tok_s": SCALARS, "nfe": SCALARS},
                            optional={"label": SCALARS, "n": SCALARS, "settings": JSON, "tau_content": SCALARS})


@BOUNDED
@given(report=st.fixed_dictionaries({"rows": st.lists(ROW, max_size=3)}, optional={"problems": SCALARS}) | JSON)
def test_an_added_report_of_any_json_joins_the_chart_or_names_the_field(report):
    try:
        merged = add_points({}, report, "r.json")
    except DllmError as exc:
        assert str(exc).startswith("r.json")
        return
    assert all(0 <= row["accuracy"] <= 1 for row in merged["rows"])
    assert any(row["pareto"] for row in merged["rows"])


@BOUNDED
@given(prompt=st.text(max_size=60) | st.lists(st.fixed_dictionaries({"role": SCALARS, "content": SCALARS}),
                                                 max_size=3) | JSON)
def test_a_prompt_of_any_text_or_messages_encodes_or_is_refused(tiny, prompt):
    try:
        ids = encode_prompt(tiny, prompt)
    except DllmError as exc:
        assert str(exc)
        return
    assert tiny.mask_id not in ids  # typed special-token text never becomes a mask


@pytest.fixture(scope="module")
def job():
    return sweep_job(Settings(gen_length=16, block_size=8, cache="dual", unmask="threshold"), {"threshold": [0.9]},
                     "arithmetic", 2)


@BOUNDED
@given(lines=st.lists(JSON.map(json.dumps) | st.text(max_size=30), max_size=4))
def test_a_results_file_of_any_lines_resumes_or_is_refused(job, tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("results") / "r.jsonl"
    header = json.dumps({"format": RESULTS_FORMAT, "job": job.identity()})
    path.write_text("\n".join([header, *lines]) + "\n")
    try:
        results = Results(job, path, resume=True)
    except DllmError as exc:
        assert str(exc)
        return
    assert all(0 <= point < 1 and 0 <= problem < 2 for point, problem in results.records)


@BOUNDED
@given(trace=JSON, model=SCALARS | st.sampled_from(["LLaDA-8B-Instruct", "Dream-v0-Instruct-7B"]),
       device=SCALARS | st.sampled_from(["H100", "A100"]), g=SCALARS, tau=SCALARS)
def test_page_endpoints_answer_any_json_or_refuse_it_naming_the_input(trace, model, device, g, tau):
    """The page's endpoints as an API client may call them (``ui/parts/inputs.py``): the cost model and
    the concurrency view, and a handler of every value type the page's endpoints take."""
    @checked
    def view(state: PageState, step: StepIndex, color_by: ColorBy, layer: Choice, which: Which, kv_view: KVView,
             what_if: Fraction) -> tuple:
        return step, what_if

    names = ("trace", "model", "device", "state", "step", "color_by", "layer", "which", "kv_view", "what_if")
    for call in (lambda: show_cost(trace, model, device), lambda: show_concurrency(device, model, g, tau),
                 lambda: view(trace, g, model, device, model, device, tau)):
        try:
            answer = call()
        except gr.Error as exc:
            assert exc.message.startswith(names), exc.message
            continue
        assert answer is not None
