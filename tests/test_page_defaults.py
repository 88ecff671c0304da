"""The page's half of one home for defaults: the controls the page builds open on each setting's
default, span its bounds and say its label and help, all as ``settings.knob`` gives them, and
untouched they make the default settings; the Tune tab opens on ``limits``' sweep grid. (The
command line's half is tests/test_one_home_for_defaults.py.)"""
from __future__ import annotations

import gradio as gr
import pytest
from described_session import DescribedSession

from dllm_local.limits import SWEEP_BLOCK_SIZES, SWEEP_GEN_LENGTH, SWEEP_THRESHOLDS
from dllm_local.policies import registry
from dllm_local.settings import Settings, knob
from ui.run.controls import SETTING_CONTROLS, settings_from_controls
from ui.page import build
from ui.tune.tab import parse_numbers

LENGTHS = ("gen_length", "block_size", "steps")


@pytest.fixture(scope="module")
def page() -> gr.Blocks:
    return build(DescribedSession(), {}, [])  # no preset: every control opens on its own default


def _run_inputs(page: gr.Blocks) -> dict[str, gr.components.Component]:
    """The components the Run button's endpoint reads, by its parameter name (a control's name)."""
    run = next(fn for fn in page.fns.values() if fn.api_name == "run")
    return dict(zip(run.input_parameter_names, run.inputs))


def _control(page: gr.Blocks, name: str) -> gr.components.Component:
    """The Run tab's control of the setting ``name``, as the page built it."""
    return _run_inputs(page)[name]


def _by_id(page: gr.Blocks, elem_id: str) -> gr.components.Component:
    return next(block for block in page.blocks.values() if getattr(block, "elem_id", None) == elem_id)


@pytest.mark.parametrize("name", SETTING_CONTROLS)
def test_each_control_says_its_knobs_label_and_help(page, name):
    box = _control(page, name)
    assert (box.label, box.info) == (knob(name).label, knob(name).help)


@pytest.mark.parametrize("name", [*LENGTHS, "temperature", "seed"])
def test_each_number_control_spans_its_knobs_range(page, name):
    box, spec = _control(page, name), knob(name)
    assert box.minimum == spec.low
    if spec.top is not None:  # a slider ends where its knob says the useful range does, within the bounds
        assert box.maximum == spec.top and spec.low < spec.top <= (spec.high or float("inf"))
    else:
        assert box.maximum == spec.high


@pytest.mark.parametrize("name", LENGTHS)
def test_a_length_slider_reaches_every_length_in_its_bounds(page, name):
    # A step from the low end: 1 reaches every whole length, so a trace's length always fits.
    box = _control(page, name)
    assert box.step == 1 and (box.maximum - box.minimum) % box.step == 0


@pytest.mark.parametrize("name", SETTING_CONTROLS)
def test_each_control_opens_on_its_knobs_default(page, name):
    value = _control(page, name).value
    if name == "steps":  # none (one token per step) is shown as that many steps: the length
        assert knob("steps").default is None and value == knob("gen_length").default
    else:
        assert value == knob(name).default


def test_the_policy_menus_offer_the_knobs_choices(page):
    """Every unmasking policy; every cache policy the loaded model's kind takes (the tiny model
    is bidirectional: the block cache is a block-diffusion model's)."""
    from dllm_local.policies import registry

    assert {value for _, value in _control(page, "unmask").choices} == set(knob("unmask").choices)
    masked = set(registry.for_model("masked", registry.CACHE))
    assert {value for _, value in _control(page, "cache").choices} == masked == set(knob("cache").choices) - {"block"}


def test_untouched_controls_make_the_default_settings(page):
    values = {name: box.value for name, box in _run_inputs(page).items() if name in page.control_names}
    chosen, notice = settings_from_controls(values)
    made, default = Settings.from_dict(chosen), Settings()
    assert notice == ""
    for name in SETTING_CONTROLS:
        if name != "steps":
            assert getattr(made, name) == getattr(default, name), name
    # The fixed schedule's length as the slider shows it: one token per step, as none means.
    assert made.steps == made.gen_length
    for kind in ("cache", "unmask"):
        assert getattr(made, f"{kind}_params") == registry.get(kind, getattr(made, kind)).defaults


def test_the_tune_tab_opens_on_the_sweep_grid_of_limits(page):
    assert tuple(parse_numbers(_by_id(page, "tune-values").value, float, "Values", "")) == SWEEP_THRESHOLDS
    assert tuple(parse_numbers(_by_id(page, "tune-blocks").value, int, "Block sizes", "")) == SWEEP_BLOCK_SIZES
    gen = _by_id(page, "tune-gen")
    assert gen.value == SWEEP_GEN_LENGTH
    assert (gen.minimum, gen.maximum, gen.label) == (knob("gen_length").low, knob("gen_length").high,
                                                     knob("gen_length").label)
