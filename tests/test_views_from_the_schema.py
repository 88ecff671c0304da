"""Every shape the trace schema admits is a shape every view renders (issue 45).

Valid traces are generated from the schema (``dllm_local.trace``: the field types of ``Trace``,
``StepRecord``, ``Stats``, the policies' declared step fields, ``CanvasStep``), as whole traces
of each kind of model and as variations of a real trace (``tests/data/trace_small.json``): nulls
wherever the schema allows them, empty lists, extreme finite numbers, odd text, zero and huge
counts. Each one is checked to parse (``parse_trace``), then imported as the page imports a file
and driven through every view the page draws from a trace, at the first, a middle and the last
step, with each KV view, layer, K or V and colouring: each returns its figure, HTML or value, or
raises the project's own error, never another exception. Derandomized and bounded, so CI sees
the same examples on every run."""
from __future__ import annotations

import json
import re
import signal
import typing
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from described_session import DescribedSession
from dllm_local.canvas.trace import Count  # the trace's counts (64 bits)
from dllm_local.errors import DllmError, TraceError
from dllm_local.limits import MAX_GEN_LENGTH
from dllm_local.policies import registry
from dllm_local.settings import Settings  # declares the trace's settings check, as the page's import does
from dllm_local.trace import KV_VIEWS, StepRecord, Stats, parse_trace
from dllm_local.values import Flag, Number
from ui.lessons import verdicts as lessons
from ui.block.lessons import stored_verdict
from ui.run.branching import Branching, branch_title, candidate_choices
from ui.compare.comparison import compare, compare_html
from ui.run.controls import controls_from_settings
from ui.parts.exports import ExportFolder
from ui.run.presenter import FONT_SCALES, THEMES, Presenter
from ui.parts.presets import load_presets
from ui.parts.replay import MEAN_LAYERS, numbers, what_if
from ui.figures import cache_panel, confidence_heatmap, experts_html, kv_heatmap
from ui.run.settings import RunSettings
from ui.run.views import RunReplay, show_cost
from ui.run.slides_zip import slides_zip
from ui.parts.tables import numbers_html
from ui.run.trace_files import TraceFiles

ROOT = Path(__file__).resolve().parents[1]
SKELETON = json.loads((ROOT / "tests" / "data" / "trace_small.json").read_text())
EXAMPLES = 60
BOUNDED = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large, HealthCheck.large_base_example])
SECONDS_PER_TRACE = 30  # a view that never returns is a failure too, not a hung suite

# ---------------------------------------------------------------- values of each field type

ODD_TEXT = ["", "مرحبا بالعالم", "שָׁלוֹם", "e\u0301\u0302\u0303", "👩\u200d👩\u200d👧\u200d👦🎉", "<script>alert(1)</script>",
            "x" * 300, "\u202eevil\u202c", "&amp; \"quoted\" 'single' %{x} {0}", "<|endoftext|>", "<|eot_id|>",
            "</s>", "<|mdm_mask|>", " ", "\n\t\r", "\x00\x07\x1b\x7f", "]]><!--", "\\u0000"]
TEXT = st.sampled_from(ODD_TEXT) | st.text(max_size=12)
EXTREMES = [1e308, -1e308, 5e-324, -5e-324, 0.0, -0.0, 1.0, 0.5, 0.999999, 1.7976931348623157e308, 1, 0, -1]
NUMBER = st.sampled_from(EXTREMES) | st.floats(0, 1) | st.floats(allow_nan=False, allow_infinity=False)
COUNT = st.sampled_from([0, 1, 2, 3, 10**6, 2**31, 2**63 - 1]) | st.integers(0, 40)  # the trace's counts: 64 bits
ANY_COUNT = COUNT | st.just(10**400)  # a policy's counts (values.Count) have no bound
TOKEN = st.sampled_from([0, 1, 2, 5, 19, 387, 2**63 - 1]) | st.integers(0, 800)  # the skeleton's vocab holds most of 0-800
FLAG = st.booleans()
SCALAR = (st.none() | FLAG | st.integers(-2**70, 2**70) | st.sampled_from([10**400, -10**400]) | NUMBER
          | TEXT)  # trace.Scalar: a value a policy or a model adds, kept as it is
BY_TYPE = {id(Count): COUNT, id(Number): NUMBER, id(Flag): FLAG}  # the schema's plain field types


def plain_fields(schema: type) -> dict[str, st.SearchStrategy]:
    """A strategy per field of a schema class whose type is a plain Count, Number or Flag."""
    hints = typing.get_type_hints(schema, include_extras=True)
    return {name: BY_TYPE[id(kind)] for name, kind in hints.items() if id(kind) in BY_TYPE}


@dataclass(frozen=True)
class Shape:
    """What a trace's positions range over: the prompt's length and the answer's."""
    P: int
    n: int

    def answer(self) -> st.SearchStrategy:
        return st.integers(self.P, self.P + self.n - 1)

    def sequence(self) -> st.SearchStrategy:
        return st.integers(0, self.P + self.n - 1)

    def span(self) -> st.SearchStrategy:
        """[start, end] of the K/V a store forward wrote (``StepRecord.stored``)."""
        return st.lists(self.sequence(), min_size=2, max_size=2).map(sorted)


def entries(at: st.SearchStrategy, *rest: st.SearchStrategy, most: int = 4) -> st.SearchStrategy:
    """[position, token, number...] lists (commits, take-backs, rejections, edits)."""
    return st.lists(st.tuples(at, TOKEN, *rest).map(list), max_size=most)


def filled(value: st.SearchStrategy, most: int) -> st.SearchStrategy:
    """A list of up to ``most`` items, all one value (long lists at no cost), or a few drawn apart."""
    return (st.builds(lambda v, k: [v] * k, value, st.integers(0, most))
            | st.lists(value, max_size=min(most, 6)))


def cosines(shape: Shape) -> st.SearchStrategy:
    """trace.Cosines: a list per position (null where nothing was cached) or one number, or null."""
    return filled(NUMBER | st.none(), shape.P + shape.n) | NUMBER | st.none()


LAYER = st.sampled_from(["0", "1", "2", "31"]) | TEXT
COSINE_NAMES = st.sampled_from(["k", "v", "k_mean", "k_min", "v_mean", "v_min"]) | TEXT


def kv_cosines(shape: Shape) -> st.SearchStrategy:
    return st.dictionaries(LAYER, st.dictionaries(COSINE_NAMES, cosines(shape), max_size=4), max_size=3)


def exact(shape: Shape) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={"max_prob_error": NUMBER, "argmax_agree": FLAG | st.none(),
                                               "true_drift": kv_cosines(shape), "cache_vs_exact": kv_cosines(shape)})


def policy_fields(shape: Shape) -> dict[str, st.SearchStrategy]:
    """The step fields the registered policies declare (``PolicySpec.trace_fields``), by name."""
    rejected = entries(shape.answer(), NUMBER)
    return {"device": TEXT | st.none(), "reuse_wins": FLAG | st.none(), "evicted": ANY_COUNT, "quota": ANY_COUNT,
            "guider_accepted": st.integers(0, MAX_GEN_LENGTH), "verified": ANY_COUNT, "rejected": ANY_COUNT,
            "min_conflict_score": NUMBER, "rejected_at": rejected, "revoked": ANY_COUNT, "edited": ANY_COUNT,
            "drift": NUMBER | st.none(), "refresh_next": FLAG, "window": st.lists(shape.answer(), max_size=8),
            "tracked": st.lists(shape.sequence(), max_size=8), "length": ANY_COUNT | shape.sequence(),
            "verify_candidates": ANY_COUNT, "verify_accepted": ANY_COUNT, "accepted_at": rejected}


DECLARED = {name for table in (registry.CACHE, registry.UNMASK) for spec in table.values() for name in spec.trace_fields}


def policy(shape: Shape) -> st.SearchStrategy:
    declared = st.fixed_dictionaries({}, optional=policy_fields(shape))
    extra = st.dictionaries(TEXT.filter(lambda name: name not in DECLARED), SCALAR, max_size=2)
    return st.builds(lambda a, b: {**b, **a}, declared, extra)


# ---------------------------------------------------------------- step records

STEP_NUMBERS = plain_fields(StepRecord)  # step, block, g, reads, forwards, model_ms, full_refresh, ...


@st.composite
def masked_step(draw, shape: Shape) -> dict:
    record = {name: draw(kind) for name, kind in STEP_NUMBERS.items()}
    record["block"] = draw(st.integers(0, 4) | COUNT)
    positions = draw(st.just(list(range(shape.P, shape.P + shape.n))) | st.lists(shape.answer(), max_size=6))
    record.update(
        committed=draw(entries(shape.answer(), NUMBER)), masked_positions=positions,
        masked_confidence=draw(st.sampled_from([None, 0.0, 1.0]).map(lambda c: [c] * len(positions))
                               | st.lists(NUMBER | st.none(), min_size=len(positions), max_size=len(positions))),
        recomputed=draw(st.none() | st.just(list(range(shape.P + shape.n))) | st.lists(shape.sequence(), max_size=6)),
        kv=draw(st.none() | kv_cosines(shape)), exact=draw(st.none() | exact(shape)), policy=draw(policy(shape)),
        revoked=draw(entries(shape.answer(), NUMBER, NUMBER, most=2)),
        top_candidates=draw(st.lists(st.tuples(shape.answer(), st.lists(st.tuples(TOKEN, NUMBER).map(list),
                                                                        max_size=3)).map(list), max_size=3)))
    optional = {"stored": st.none() | shape.span(),
                "experts": st.none() | st.dictionaries(LAYER, st.lists(COUNT, max_size=4), max_size=2),
                "edited": st.none() | entries(shape.answer(), NUMBER, TOKEN, most=2),
                "canvas": st.none() | canvas_record(shape, 0)}
    record.update(draw(st.fixed_dictionaries({}, optional=optional)))
    return record


@st.composite
def canvas_record(draw, shape: Shape, canvas: int, start: int | None = None, width: int | None = None) -> dict:
    """A CanvasStep: its draft from ``start`` (anywhere a Count may be, by default), its accepted
    and changed positions in it, one entropy per draft token, one sampled token per accepted one."""
    start = draw(st.sampled_from([0, shape.P, 2**63 - 8]) | shape.sequence()) if start is None else start
    width = draw(st.integers(1, 4)) if width is None else width
    inside = st.integers(start, start + width - 1)
    accepted = draw(st.lists(inside, max_size=width, unique=True))
    return {"canvas": canvas, "start": start, "draft": draw(st.lists(TOKEN, min_size=width, max_size=width)),
            "accepted": accepted, "sampled": draw(st.lists(TOKEN, min_size=len(accepted), max_size=len(accepted))),
            "changed": draw(st.lists(inside, max_size=width, unique=True)),
            "entropy": draw(st.lists(NUMBER, min_size=width, max_size=width)),
            "entropy_bound": draw(NUMBER), "temperature": draw(NUMBER), "mean_entropy": draw(NUMBER),
            "stable": draw(FLAG), "confident": draw(FLAG), "finished": draw(FLAG),
            **draw(st.fixed_dictionaries({}, optional={
                "experts": st.dictionaries(st.sampled_from(["0", "1", "7"]) | TEXT, st.lists(COUNT, max_size=3), max_size=2),
                "encoder": st.none() | st.fixed_dictionaries({"positions": COUNT, "cached": COUNT, "ms": NUMBER})}))}


@st.composite
def canvas_steps(draw, shape: Shape) -> list[dict]:
    """A canvas model's steps: canvases of one length over the answer, each refined by a few steps
    (at times one canvas somewhere else, or a step with no canvas record: the schema allows both)."""
    length = draw(st.sampled_from([1, shape.n]) | st.integers(1, max(1, shape.n)))
    records = []
    for canvas in range(draw(st.integers(0, min(3, max(1, shape.n // length))))):
        start = shape.P + canvas * length
        width = max(1, min(length, shape.P + shape.n - start))
        for step_in_canvas in range(draw(st.integers(1, 3))):
            record = {name: draw(kind) for name, kind in STEP_NUMBERS.items()}
            record.update(block=canvas, step_in_block=step_in_canvas, committed=[], policy={},
                          kv=draw(st.none() | kv_cosines(shape)),
                          canvas=draw(canvas_record(shape, canvas, start, width) | canvas_record(shape, canvas)))
            records.append(record)
    if records and draw(st.integers(0, 4)) == 0:
        records.insert(draw(st.integers(0, len(records))), draw(masked_step(shape)))
    return records


# ---------------------------------------------------------------- settings, model and the rest

def param_value(param: registry.Param) -> st.SearchStrategy:
    """A value a policy parameter takes: in its bounds or choices, or null where optional; numbers
    at times as the text a saved file may hold ("0.9")."""
    if param.choices:
        kind = st.sampled_from(param.choices)
    elif param.type is bool:
        kind = FLAG
    elif param.type in (int, float):
        low = param.low + (param.type is int or 1e-9) * param.low_open
        high = param.high - (param.type is int or 1e-9) * param.high_open
        kind = (st.integers(int(low), int(high)) if param.type is int else st.floats(low, high))
        kind = st.sampled_from([low, high]).map(param.type) | kind
        kind = kind | kind.map(str)
    else:
        kind = TEXT
    return kind | st.none() if param.optional else kind


@st.composite
def known_settings(draw, canvas: bool) -> dict:
    """Settings of the registered policies, as ``Settings`` loads them (a trace keeps them as written)."""
    cache = draw(st.sampled_from(sorted(registry.CACHE)))
    unmask = draw(st.sampled_from(sorted(registry.UNMASK)))
    gen_length = draw(st.sampled_from([1, 16, 32, 64, MAX_GEN_LENGTH]))
    block = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64) if gen_length % d == 0] or [1]))
    out = {"gen_length": gen_length, "block_size": draw(st.sampled_from([block, str(block), float(block), f"{block}.0"])),
           "temperature": draw(st.sampled_from([0.0, 0, "0", 0.7, "0.7", 1e308, " 1e308 "])), "cache": cache,
           "unmask": unmask, "seed": draw(st.sampled_from([0, 2**63 - 1, "7"])),
           "trace": draw(st.sampled_from(["full", "summary", "off"])),
           "exact_drift": draw(st.sampled_from([True, False, "true", " FALSE "]))}
    for kind, name in (("cache", cache), ("unmask", unmask)):
        params = registry.get(kind, name).params
        out[f"{kind}_params"] = draw(st.none() | st.fixed_dictionaries(
            {}, optional={p.name: param_value(p) for p in params}))
    if canvas:
        out["canvas_params"] = draw(st.fixed_dictionaries({}, optional={
            "max_denoising_steps": st.integers(1, 8) | st.just("3"), "canvas_length": st.integers(1, 64),
            "confidence_threshold": st.floats(1e-6, 5) | st.just("0.5"), "stability_threshold": st.integers(0, 4),
            "entropy_bound": st.floats(1e-6, 1e308)}))
    for tries in range(3):  # a pair or a knob the settings refuse: fewer knobs, then the real trace's settings
        try:
            Settings.from_dict(out)
            return out
        except DllmError:
            out = {k: v for k, v in out.items() if k in ("cache", "unmask", "gen_length")} if tries == 0 else \
                dict(SKELETON["settings"])
    return out


# A plugin's policies this build lacks: the schema keeps such settings unread (any values).
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=6)
PLUGIN_SETTINGS = st.builds(lambda knobs, cache, unmask: {**knobs, "cache": cache, "unmask": unmask},
                            st.dictionaries(st.sampled_from(["gen_length", "block_size", "temperature", "cache_params",
                                                             "unmask_params", "canvas_params", "seed", "exact_drift"])
                                            | TEXT, JSON, max_size=5),
                            st.sampled_from(["plugin_cache", "none", "dual"]), st.sampled_from(["plugin_unmask", "edit",
                                                                                                "flash_verify"]))
PLUGIN_SETTINGS = PLUGIN_SETTINGS.filter(lambda s: not (s["cache"] in registry.CACHE and s["unmask"] in registry.UNMASK))


def model(kind: object) -> st.SearchStrategy:
    extra = st.dictionaries(TEXT.filter(lambda k: k not in ("name", "stop_ids", "quantized_modules", "canvas_defaults",
                                                            "kind")),
                            SCALAR, max_size=2)
    named = st.fixed_dictionaries({}, optional={
        "name": st.just("tiny") | TEXT, "stop_ids": st.lists(TOKEN, max_size=3), "quantized_modules": st.lists(TEXT, max_size=2),
        "canvas_defaults": st.dictionaries(TEXT, SCALAR, max_size=2), "experts": st.sampled_from([8, 64]) | SCALAR,
        "active_experts": st.sampled_from([2, 8]) | SCALAR, "canvas_length": SCALAR, "block_size": SCALAR,
        # What the cost panel's measured steps read: the device, the GPU by name, the model's size.
        "device": st.sampled_from(["cpu", "cuda:0"]) | SCALAR,
        "gpu_name": st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla T4"]) | SCALAR,
        "weight_read_mb": st.sampled_from([10.7, 0.0]) | SCALAR,
        "arithmetic_parameters": st.sampled_from([2_804_160, -1]) | SCALAR})
    return st.builds(lambda e, m: {**e, **m, **({"kind": kind} if kind is not None else {})}, extra, named)


STATS = st.fixed_dictionaries({}, optional=plain_fields(Stats))


def vocab() -> st.SearchStrategy:
    odd = st.dictionaries(TOKEN.map(str), TEXT, max_size=6)
    return st.builds(lambda base, changed: {**base, **changed}, st.sampled_from([SKELETON["vocab"], {}]), odd)


@st.composite
def whole_traces(draw) -> dict:
    """A trace of any kind of model, every field drawn from its type."""
    kind = draw(st.sampled_from(["masked", "block", "canvas", None]) | SCALAR)
    prompt = draw(st.sampled_from([SKELETON["prompt_ids"], []]) | st.lists(TOKEN, max_size=5))
    shape = Shape(len(prompt), draw(st.sampled_from([1, 2, 3, 8, 16, 32, 32, 64, 200, MAX_GEN_LENGTH])))
    steps = (draw(canvas_steps(shape)) if kind == "canvas" else
             draw(st.lists(masked_step(shape), max_size=4 if shape.n < 1000 else 2)))
    if kind == "block" or draw(st.integers(0, 3)) == 0:  # a block-diffusion run: where its blocks start, its stores
        for record in steps:
            record["stored"] = draw(st.none() | shape.span())
        steps = [{**r, "canvas": None} for r in steps] if kind == "block" else steps
    trace = {"settings": draw(known_settings(kind == "canvas") | PLUGIN_SETTINGS), "model": draw(model(kind)),
             "prompt_ids": prompt, "gen_length": shape.n, "mask_id": draw(TOKEN), "steps": steps,
             "final_ids": draw(st.just([]) | filled(TOKEN, shape.n).filter(lambda ids: len(ids) == shape.n)
                               | st.builds(lambda t: [t] * shape.n, TOKEN)),
             "vocab": draw(vocab()), "stats": draw(STATS), "text": draw(TEXT), "schema_version": 1}
    trace.update(draw(st.fixed_dictionaries({}, optional={
        "branch": st.none() | st.fixed_dictionaries({"after_step": st.integers(0, 5) | COUNT, "position": shape.answer()},
                                                    optional={"token": TOKEN | st.none(), "replaced": TOKEN | st.none()}),
        "blocks_from": st.none() | shape.sequence()})))
    return trace


@st.composite
def real_trace_variations(draw) -> dict:
    """The real trace with some of its fields replaced by other valid values of their types."""
    trace = json.loads(json.dumps(SKELETON))
    shape = Shape(len(trace["prompt_ids"]), trace["gen_length"])
    step_fields = {**STEP_NUMBERS, "masked_confidence": None, "kv": st.none() | kv_cosines(shape),
                   "exact": st.none() | exact(shape), "policy": policy(shape), "recomputed": st.none(),
                   "committed": entries(shape.answer(), NUMBER), "revoked": entries(shape.answer(), NUMBER, NUMBER),
                   "top_candidates": st.just([]), "stored": shape.span(), "canvas": canvas_record(shape, 0),
                   "edited": entries(shape.answer(), NUMBER, TOKEN)}
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from(["step", "step", "step", "settings", "model", "vocab", "stats", "final_ids",
                                      "text", "branch", "blocks_from", "steps"]))
        if where == "step" and trace["steps"]:
            record = draw(st.sampled_from(trace["steps"]))
            name = draw(st.sampled_from(sorted(step_fields)))
            if name == "masked_confidence":  # nulls in place of the confidences, as the schema allows
                record[name] = draw(st.sampled_from([None, 1e308, -0.0, 5e-324]).map(
                    lambda c: [c] * len(record["masked_positions"])))
            else:
                record[name] = draw(step_fields[name])
        elif where == "settings":
            trace["settings"] = draw(known_settings(False) | PLUGIN_SETTINGS)
        elif where == "model":
            trace["model"] = draw(model(draw(st.sampled_from(["masked", "block", None]))))
        elif where == "vocab":
            trace["vocab"] = draw(vocab())
        elif where == "stats":
            trace["stats"] = {**trace["stats"], **draw(STATS)}
        elif where == "final_ids":
            trace["final_ids"] = draw(st.just([]) | st.builds(lambda t: [t] * shape.n, TOKEN))
        elif where == "text":
            trace["text"] = draw(TEXT)
        elif where == "branch":
            trace["branch"] = {"after_step": draw(st.integers(0, 10)), "position": draw(shape.answer()),
                               "token": draw(TOKEN | st.none()), "replaced": draw(TOKEN | st.none())}
        elif where == "blocks_from":
            trace["blocks_from"] = draw(shape.sequence())
        else:
            trace["steps"] = trace["steps"][:draw(st.integers(0, len(trace["steps"])))]
    return trace


TRACES = whole_traces() | real_trace_variations()


# ---------------------------------------------------------------- the page's callbacks

VIEWS = ("grid", "numbers", "confidence", "kv", "cache", "grid_verdicts", "kv_verdicts", "cache_verdicts")


class Page(RunReplay, TraceFiles, Branching, Presenter, RunSettings):
    """The Run tab's callbacks with plain names for its components (``RunTab`` without Gradio's
    blocks): what they give the page, from the same code."""

    def __init__(self, exports: ExportFolder) -> None:
        for name in ("grid", "trace", "scrub", "status", "export_btn", "prompt", "preset", "preset_info", "layer",
                     "which", "kv_view", "preset_applied"):
            setattr(self, name, name)
        self.view_boxes = {name: name for name in VIEWS}
        self.specs, self.session, self.exports = registry.all_specs(), DescribedSession(), exports
        self.presets = load_presets()[0]
        self.controls = {name: f"control {name}" for name in controls_from_settings({}, self.specs)}

    def viewed(self, *args, **kwargs) -> None:  # LiveRun's: no run is going here
        pass


@pytest.fixture(scope="module")
def page() -> Page:
    exports = ExportFolder(keep=2)
    yield Page(exports)
    exports.cleanup()


def _layers(trace: dict) -> list[str]:
    """The KV panel's layer choices to draw: the mean, a layer the trace names, and one it does not."""
    named = [name for s in trace["steps"] for by_layer in (s.get("kv"), *(s.get("exact") or {}).values())
             if isinstance(by_layer, dict) for name in by_layer]
    return list(dict.fromkeys([MEAN_LAYERS, *named[:1], "999"]))


def _served(fig) -> None:
    """A figure as the page sends it (Gradio's plot is plotly's JSON)."""
    fig.to_json()


def shown(view, *args):
    """What ``view`` gives for ``args``; the project's own error (a message on the page) is an answer too."""
    try:
        return view(*args)
    except (DllmError, gr.Error) as exc:
        assert str(exc)
        return None


def render_everything(page: Page, data: dict, folder: Path, choices: dict) -> None:
    """Import ``data`` as the page imports a file, then every view of it as the page draws them."""
    path = folder / "trace.json"
    path.write_text(json.dumps(data))
    args = (choices["color_by"], choices["layer"], choices["which"], choices["kv_view"], choices["what_if"],
            choices["font_scale"], choices["theme"])
    events = list(page.import_trace(str(path), *args))
    assert "could not import" not in events[-1].get("status", ""), events[-1]["status"]
    trace = events[-1]["trace"]
    for name in ("confidence", "kv", "cache"):
        _served(events[-1][name])
    steps, length = len(trace["steps"]), trace["gen_length"]
    for step in sorted({0, steps // 2, max(0, steps - 1), 10**9}):  # the slider past the end: the last step
        if step < 10**9:
            shown(page.redraw, None, trace, step, *args)
        shown(page.redraw_grid, None, trace, step, choices["color_by"], 1.0)
        for position in sorted({0, length // 2, length - 1, length}):
            shown(page.show_position, trace, step, min(position, MAX_GEN_LENGTH - 1))
            if steps and position < length:
                shown(candidate_choices, trace, min(step, steps - 1), position)
        shown(page.show_branch, trace, step, choices["color_by"])
        shown(page.move_step, "next", trace, step)
        svg = shown(page.slides_grid, trace, step, choices["color_by"])
        assert svg is not None or not steps  # only an empty run has no grid to export
        if svg is not None:
            shown(slides_zip, "{}", svg, folder)  # the zip checks the SVG is a well-formed document
    shown(branch_title, trace)
    for threshold in (5e-324, 0.5, 1.0):
        shown(what_if, trace, threshold)
    at = max(0, steps - 1)
    for view in KV_VIEWS:
        for i, layer in enumerate(_layers(trace)):
            which = "kv"[i % 2]
            shown(kv_heatmap, trace, layer, which, at if steps else None, view)
            if steps:
                shown(lessons.kv_reuse_verdict, trace, at, layer, which)
                shown(stored_verdict, trace, at, layer, which)
    for upto in (None, 0):
        shown(confidence_heatmap, trace, upto)
        shown(cache_panel, trace, upto)
        shown(lambda t, u: numbers_html(numbers(t, u)), trace, upto)
    shown(experts_html, trace, None)
    shown(lambda t: compare_html(compare(t, t)), trace)
    for target, device in (("LLaDA-8B-Instruct", "H100"), ("DiffusionGemma-26B-A4B", "A100"),
                           ("SDAR-30B-A3B-Chat", "L4")):
        shown(show_cost, trace, target, device)


class TookTooLong(Exception):
    pass


def _too_long(signum, frame):
    raise TookTooLong(f"the views took over {SECONDS_PER_TRACE} s for one trace")


CHOICES = st.fixed_dictionaries({
    "color_by": st.sampled_from(["step", "confidence"]), "layer": st.sampled_from([MEAN_LAYERS, "0", "1", "999"]),
    "which": st.sampled_from(["k", "v"]), "kv_view": st.sampled_from(KV_VIEWS),
    "what_if": st.sampled_from([0.0, 5e-324, 0.5, 1.0]), "font_scale": st.sampled_from(list(FONT_SCALES)),
    "theme": st.sampled_from(THEMES)})


def test_every_declared_policy_field_is_generated():
    assert DECLARED == set(policy_fields(Shape(1, 1)))


def _real_trace(**changes) -> dict:
    """The real trace with each step's fields ``changes`` (a function of the step record) applied."""
    trace = json.loads(json.dumps(SKELETON))
    for record in trace["steps"]:
        record.update({name: change(record) for name, change in changes.items()})
    return trace


# The hostile-input probe's failures (issue 45): the confidences null where the schema allows it,
# with a what-if threshold; K/V records of one number per layer (a summary's shape) in the drift
# and in the exact diagnostic, on the KV view and its verdicts.
NULL_CONFIDENCES = _real_trace(masked_confidence=lambda r: [None] * len(r["masked_positions"]))
ONE_NUMBER = {"0": {"k": 1.0, "v": 1.0}, "1": {"k_mean": 0.99, "k_min": 0.9, "v_mean": 0.99, "v_min": 0.9}}
ONE_NUMBER_KV = _real_trace(kv=lambda r: ONE_NUMBER, exact=lambda r: {**r["exact"], "true_drift": ONE_NUMBER,
                                                                     "cache_vs_exact": ONE_NUMBER})
PROBED = {"color_by": "confidence", "layer": MEAN_LAYERS, "which": "k", "kv_view": "cache_error", "what_if": 0.5,
          "font_scale": "1×", "theme": "light"}


# A finite float64 past float32's range is drawn as the top colour of the plots' float32 grids.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@BOUNDED
@example(data=NULL_CONFIDENCES, choices=PROBED)
@example(data=ONE_NUMBER_KV, choices=PROBED)
@given(data=TRACES, choices=CHOICES)
def test_every_view_renders_every_trace_the_schema_accepts(page, tmp_path_factory, data, choices):
    parse_trace(json.loads(json.dumps(data)))  # generated valid: the schema accepts it as it is
    folder = tmp_path_factory.mktemp("views")
    previous = signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(SECONDS_PER_TRACE)
    try:
        render_everything(page, data, folder, choices)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _canvas_step(**changes) -> dict:
    canvas = {"canvas": 0, "start": 27, "draft": [5, 6], "accepted": [27], "sampled": [5], "changed": [28],
              "entropy": [0.1, 0.2], "entropy_bound": 1.0, "temperature": 0.5, "mean_entropy": 0.15, "stable": False,
              "confident": False, "finished": False}
    return {**SKELETON["steps"][0], "canvas": {**canvas, **changes}}


@pytest.mark.parametrize("step, message", [
    ({**SKELETON["steps"][0], "stored": [30]}, "steps[0].stored must be [start, end] with start <= end"),
    ({**SKELETON["steps"][0], "stored": [40, 30]}, "steps[0].stored must be [start, end] with start <= end"),
    ({**SKELETON["steps"][0], "g": 2**64}, "steps[0].g must be less than or equal to 9223372036854775807"),
    ({**SKELETON["steps"][0], "canvas": {}}, "steps[0].canvas.canvas is missing"),
    (_canvas_step(draft=[]), "steps[0].canvas must hold a draft of at least one token"),
    (_canvas_step(entropy=[0.1]), "one entropy per draft token"),
    (_canvas_step(sampled=[]), "one sampled token per accepted position"),
    (_canvas_step(accepted=[29], sampled=[1]), "accepted and changed positions in the canvas (27..28)"),
])
def test_a_shape_no_view_can_draw_is_refused_naming_the_field_and_its_rule(step, message):
    """What the views cannot draw and no run writes: a stored span that is not [start, end], a count
    past 64 bits, a canvas record without its fields or whose lists do not line up with its draft."""
    trace = {**SKELETON, "steps": [step]}
    with pytest.raises(TraceError, match=re.escape(message)):
        parse_trace(trace)


def test_text_with_a_lone_surrogate_is_refused_before_any_view_sees_it():
    with pytest.raises(TraceError, match="valid Unicode"):
        parse_trace({**SKELETON, "vocab": {"\ud800": "x"}})
