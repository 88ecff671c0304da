"""A registered policy reaches the page, the CLI and the sweep with no other change."""
from __future__ import annotations

import argparse

import gradio as gr
import pytest
from described_session import DescribedSession

from dllm_local.policies import registry
from dllm_local.policies.registry import Param, PolicySpec
from dllm_local.settings import Settings
from ui.run.controls import controls_from_settings, policy_choices, settings_from_controls, visible_knobs
from ui.parts.presets import load_presets

class ToyUnmask:
    """Stands for a policy's behaviour: nothing here runs it."""

    def __init__(self, spec: PolicySpec, params: dict) -> None:
        self.spec, self.params = spec, params


TOY = PolicySpec("unmask", "toy", "Toy policy (test)", "Commits nothing; registered by a test.", ToyUnmask,
                 (Param("sharpness", float, 0.25, "Toy sharpness", "how sharp the toy is", low=0, high=1,
                        slider=(0.0, 1.0, 0.05)),))


@pytest.fixture()
def toy():
    registry.register(TOY)
    try:
        yield TOY
    finally:
        registry.unregister("unmask", "toy")


def _component(page: gr.Blocks, elem_id: str):
    return next(block for block in page.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def test_a_registered_policy_shows_up_in_the_page_controls(toy):
    from ui.page import build

    presets, _ = load_presets()
    page = build(DescribedSession(), presets, [])
    assert ("Toy policy (test)", "toy") in [tuple(c) for c in _component(page, "unmask").choices]
    knob = _component(page, "sharpness")
    assert isinstance(knob, gr.Slider) and knob.label == "Toy sharpness" and knob.info == "how sharp the toy is"
    assert (knob.minimum, knob.maximum, knob.step, knob.value) == (0.0, 1.0, 0.05, 0.25)
    assert not knob.visible  # the default preset's unmasking policy has no such knob

    assert ("Toy policy (test)", "toy") in policy_choices(registry.all_specs(), "unmask")
    assert visible_knobs("dual", "toy")["unmask.sharpness"] and not visible_knobs("dual", "toy")["unmask.threshold"]
    values = controls_from_settings({"cache": "dual", "unmask": "toy", "unmask_params": {"sharpness": 0.5}})
    assert values["unmask.sharpness"] == 0.5
    settings, _ = settings_from_controls(values)
    assert Settings.from_dict(settings).unmask_params == {"sharpness": 0.5}
    # a preset without it: the spec's default
    assert controls_from_settings({"unmask": "toy"})["unmask.sharpness"] == 0.25


def test_a_registered_policy_is_a_cli_choice(toy):
    from dllm_local.cli.settings_flags import add_settings_args, settings_from_args

    ap = argparse.ArgumentParser()
    add_settings_args(ap)
    args = ap.parse_args(["--unmask", "toy", "--unmask-param", "sharpness=0.75"])
    settings = settings_from_args(args)
    assert (settings.unmask, settings.unmask_params) == ("toy", {"sharpness": 0.75})


def test_a_registered_policy_is_a_sweep_axis(toy):
    from dllm_local.experiments.sweep import apply, sweepable

    base = Settings(unmask="toy")
    assert "sharpness" in sweepable(base)
    assert apply(base, {"sharpness": 0.6, "block_size": 16}).unmask_params == {"sharpness": 0.6}
