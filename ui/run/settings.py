"""The Run tab's settings coming in: a preset chosen, a policy picked (its knobs shown), a length
past the model's training, a prompt typed, and settings handed over by another tab (a Tune row)."""
from __future__ import annotations

from typing import Any, Literal

import gradio as gr

from dllm_local.settings import Length, length_notice
from dllm_local.values import Text

from ..grid import tokens
from .controls import changed_controls, controls_from_settings, fit_to_model, settings_from_controls, shown_for, spec_named
from ..parts.inputs import Choice, checked
from ..parts.presets import presets_for
from .views import KV_VIEW_DEFAULTS, layer_choices
from .status_line import off_task_line


class RunSettings:
    """The Run tab's callbacks on its controls. Mixed into ``RunTab``, whose ``presets``,
    ``specs``, ``session``, ``controls``, ``policy_info`` and other components it reads."""

    def control_values(self, settings: dict) -> dict:
        """The controls set to ``settings`` (a preset's, a trace's), by component, with a cache policy
        the loaded model's kind refuses given way to what it starts at (``controls.fit_to_model``)."""
        values = self.fitted_controls(settings)
        return {box: values[name] for name, box in self.controls.items()}

    def fitted_controls(self, settings: dict) -> dict:
        """The control values of ``settings`` by control name, fitted to the loaded model."""
        return fit_to_model(controls_from_settings(settings, self.specs), self.specs, self.session.info(), settings)

    @checked
    def show_policy(self, kind: Literal["cache", "unmask"], name: Choice) -> dict:
        """What the policy ``name`` of ``kind`` does, and only its controls."""
        shown = shown_for(self.specs, kind, name)
        return {self.policy_info[kind]: spec_named(self.specs, kind, name)["description"],
                **{self.controls[control]: gr.update(visible=v) for control, v in shown.items()}}

    @checked
    def length_notice(self, gen_length: Length) -> str:
        notice = length_notice(gen_length, self.session.info().get("trained_length"))
        return f"⚠ {notice}" if notice else ""

    def preset_matching(self, settings: dict, prompt: str | None = None) -> str | None:
        """The preset whose controls (and prompt, where ``prompt`` is given and the preset has
        one) equal ``settings``: what the preset box may name once they are loaded; else None."""
        def chosen(s: dict) -> dict:  # fitted to the loaded model: a block preset leaves it its block
            return settings_from_controls(self.fitted_controls(s), self.specs)[0]

        loaded, offered = chosen(settings), presets_for(self.presets, self.session.info())
        return next((name for name, p in self.presets.items() if name in offered and chosen(p["settings"]) == loaded
                     and (prompt is None or p.get("prompt", prompt) == prompt)), None)

    def settings_loaded(self, settings: dict) -> dict:
        """The controls set to ``settings`` from elsewhere (a Tune row), and the preset box naming
        the preset they equal, or none: a name the controls no longer match would be stale."""
        name = self.preset_matching(settings)
        return {**self.control_values(settings), self.preset: name, self.preset_applied: name or ""}

    def preset_changes(self, preset: str | None, **controls: Any) -> str:
        """What the preset box says under it: the controls that no longer match the preset it names
        (fitted to the loaded model, as picking it would set them); nothing while all of them do."""
        if preset not in self.presets:
            return ""
        changed = changed_controls(controls, self.fitted_controls(self.presets[preset]["settings"]), self.specs)
        return f"Changed since the preset {preset}: {', '.join(changed)}." if changed else ""

    @checked
    def prompt_notice(self, prompt: Text, status: Text) -> str | dict:
        """The off-task word for a prompt being typed or chosen, before it runs; cleared once the
        prompt is one of the tiny model's tasks again."""
        line = off_task_line(prompt, self.session.info())
        if line:
            return line
        return "" if status == f"⚠ {tokens.OFF_TASK}" else gr.update()

    @checked
    def apply_preset(self, name: Choice | None, applied: Text | None = None) -> dict:
        """The preset's description, prompt and controls, and the KV view it opens on (its "view":
        layer, which, kv_view; the defaults where it names none). No preset (the box cleared after
        an import): no description, the controls as they are. A preset named by what set the
        controls itself (``applied``: a model switch giving back the preset a kind last had, an
        import, a Tune row): its description alone, the controls as that left them."""
        if name not in self.presets:
            return {self.preset_info: "", self.preset_applied: ""}
        p = self.presets[name]
        if name == applied:
            return {self.preset_info: p["description"]}
        view = self.preset_view(p)
        # The controls and the name of the preset they now show land in one update: Run reads both.
        return {self.preset_info: p["description"], **({self.prompt: p["prompt"]} if "prompt" in p else {}),
                **self.control_values(p["settings"]), self.layer: view["layer"], self.which: view["which"],
                self.kv_view: view["kv_view"], self.preset_applied: name}

    def preset_view(self, preset: dict) -> dict:
        """The KV view ``preset`` opens on: its "view" (layer, which, kv_view), the defaults where it
        names none, and the middle layer where the loaded model is smaller than the preset's."""
        layers = layer_choices(self.session.info().get("layers", 1))
        view = {"layer": layers["value"], **KV_VIEW_DEFAULTS, **preset.get("view", {})}
        if view["layer"] not in [value for _, value in layers["choices"]]:
            view["layer"] = layers["value"]
        return view

    def preset_not_landed(self, preset: str | None, applied: str | None) -> dict:
        """What Run must read instead of the controls when the preset box names ``preset`` but the
        controls still show ``applied`` (the preset whose reply last set them): a preset picked and
        Run clicked before its reply reached the browser, which sends Run the controls it showed at
        the click. Then the preset's "prompt" (where it has one), "controls" (by name) and "view";
        else nothing: the controls show the preset, or a knob moved since, and run as they stand."""
        if preset not in self.presets or preset == (applied or None):
            return {}
        p = self.presets[preset]
        return {**({"prompt": p["prompt"]} if "prompt" in p else {}), "controls": self.fitted_controls(p["settings"]),
                "view": self.preset_view(p)}
