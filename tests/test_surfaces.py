"""Boundaries, round 3 (issue 61), the remaining surfaces: slots bounded where they are given, a
knob the model's kind does not have refused for every kind, no boolean taken for a number at any
page input (through a real server's API too), and the slides' zip linear in its request with its
SVGs checked after decoding, whatever their encoding."""
from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import fields
from pathlib import Path

import gradio as gr
import pytest
from hypothesis import given, settings, strategies as st

import app
from dllm_local import kinds
from dllm_local.cli import main as cli_main
from dllm_local.decoding.batch import SLOTS
from dllm_local.errors import SettingsError
from dllm_local.kinds.spec import COMMON_KNOBS
from dllm_local.limits import MAX_SLOTS
from dllm_local.settings import Settings
from ui.parts.inputs import number_box, number_slider
from ui.run.slides_zip import MAX_SLIDES_IMAGES, slides_zip

ROOT = Path(__file__).resolve().parents[1]
GRID = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


def _exit(argv: list[str], parse, capsys) -> tuple[int, str]:
    try:
        code = parse(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- slots

def test_slots_past_the_engines_ceiling_are_refused_at_start_with_the_reason(capsys):
    assert SLOTS.validate_python(MAX_SLOTS) == MAX_SLOTS  # the engine's batch takes the bound itself
    assert app.parse_args(["--slots", str(MAX_SLOTS)]).slots == MAX_SLOTS
    for argv, parse in ((["--slots", "100000"], app.parse_args), (["eval", "--batch-size", "100000"], cli_main),
                        (["bench", "--batch-size", str(MAX_SLOTS + 1)], cli_main)):
        code, err = _exit(argv, parse, capsys)
        assert code == 2 and "Traceback" not in err
        assert f"argument {argv[-2]}: must be a number of slots in 1..{MAX_SLOTS} (the engine's batch holds at " \
               f"most {MAX_SLOTS}, each slot a row of its preallocated KV cache)" in err


# ---------------------------------------------------------------- knobs by kind

def test_every_settings_field_is_a_common_knob_or_a_knob_of_some_kind():
    declared = set(COMMON_KNOBS).union(*(kind.knobs for kind in kinds.all_kinds()))
    assert {f.name for f in fields(Settings)} == declared


@pytest.mark.parametrize("kind", kinds.all_kinds(), ids=lambda kind: kind.name)
def test_each_kind_refuses_every_knob_it_does_not_have_naming_the_knob_and_the_kind(kind):
    own = {*COMMON_KNOBS, *kind.knobs}
    for field in fields(Settings):
        value = {"some_knob": 3} if field.name.endswith("_params") else 3
        if field.name in own:
            kind.check_knobs({field.name: value}, "m")
            continue
        with pytest.raises(SettingsError) as refused:
            kind.check_knobs({field.name: value}, "m")
        named = f"some_knob 3 ({field.name})" if isinstance(value, dict) else f"{field.name} 3"
        assert str(refused.value).startswith(f"{named}: m is a {kind.label} model, which has no such knob")


def test_a_canvas_knob_on_the_tiny_model_is_refused_on_the_command_line(capsys):
    code, err = _exit(["generate", "--model", "tiny", "--prompt", "hi", "--canvas-length", "16"], cli_main, capsys)
    assert code == 2 and "Traceback" not in err
    assert "error: canvas_length 16 (canvas_params): tiny is a masked-diffusion model, which has no such knob" in err


# ---------------------------------------------------------------- numbers at the page's inputs

NOT_NUMBERS = st.one_of(st.booleans(), st.text(max_size=8), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                        st.sampled_from([float("nan"), float("inf"), -float("inf")]))


@settings(max_examples=40, deadline=None)
@given(payload=NOT_NUMBERS, slider=st.booleans())
def test_a_number_input_refuses_anything_but_a_finite_number_before_gradio_rounds_it(payload, slider):
    component = number_slider(0, 10, 0, step=1, label="Step") if slider else number_box(None, label="Step", precision=0)
    with pytest.raises(gr.Error, match="Step: must be a finite number, not "):
        component.preprocess(payload)


def test_every_number_input_of_the_page_is_one_of_the_checked_components():
    built = [str(p.relative_to(ROOT)) for p in (ROOT / "ui").rglob("*.py") if p.name != "inputs.py"
             and re.search(r"\bgr\.(Number|Slider)\(", p.read_text())]
    assert built == []  # number_box and number_slider (ui/parts/inputs.py) instead


@settings(max_examples=20, deadline=None)
@given(value=st.integers(0, 10) | st.floats(0, 10))
def test_a_number_input_takes_a_finite_number_as_gradio_does(value):
    assert number_slider(0, 10, 0, step=1).preprocess(value) == gr.Slider(0, 10, 0, step=1).preprocess(value)
    assert number_box(None, precision=0).preprocess(value) == gr.Number(None, precision=0).preprocess(value)


# True at every numeric input of every endpoint of a real server: tests/test_compare_repeats.py
# (whose module holds a server already).


# ---------------------------------------------------------------- the slides' zip

def _url(media: str, data: bytes) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def test_a_null_or_missing_grid_svg_is_a_message(tmp_path):
    for grid in (None, "", 3):
        with pytest.raises(ValueError, match="there is no grid to export"):
            slides_zip("{}", grid, tmp_path / "out")
    with pytest.raises(ValueError, match="not a JSON text"):
        slides_zip(3, GRID, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_thirty_thousand_tiny_pngs_are_refused_by_their_count_at_once(tmp_path):
    images = json.dumps({f"p{i}.png": _url("image/png", PNG) for i in range(30_000)})
    started = time.process_time()
    with pytest.raises(ValueError, match=f"30000 images: the slides hold at most {MAX_SLIDES_IMAGES}"):
        slides_zip(images, GRID, tmp_path / "out")
    assert time.process_time() - started < 1.0  # 9 s of CPU before: every image decoded, the total re-summed
    allowed = {f"p{i}.png": _url("image/png", PNG) for i in range(MAX_SLIDES_IMAGES)}
    assert slides_zip(json.dumps(allowed), GRID, tmp_path / "out").exists()


DOCTYPE = '<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg xmlns="http://www.w3.org/2000/svg">&a;</svg>'
PLAIN = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'


def _encoded(text: str, encoding: str, declared: bool) -> bytes:
    head = f'<?xml version="1.0" encoding="{encoding.rstrip("-sig")}"?>' if declared else ""
    return (head + text).encode(encoding)


@settings(max_examples=25, deadline=None)
@given(encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1"]),
       declared=st.booleans(), doctype=st.booleans())
def test_an_svg_with_a_doctype_is_refused_whatever_its_encoding(tmp_path_factory, encoding, declared, doctype):
    data = _encoded(DOCTYPE if doctype else PLAIN, encoding, declared)
    images = json.dumps({"plot.svg": _url("image/svg+xml", data)})
    folder = tmp_path_factory.mktemp("zip")
    if doctype:
        with pytest.raises(ValueError, match="plot.svg: an SVG with a DOCTYPE|plot.svg: not a well-formed SVG"):
            slides_zip(images, GRID, folder / "out")
        assert not (folder / "out").exists()
        return
    try:  # a plain SVG: into the zip as sent, or refused as one the parser cannot read (UTF-32)
        slides_zip(images, GRID, folder / "out")
    except ValueError as refused:
        assert "not a well-formed SVG" in str(refused)
