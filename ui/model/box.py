"""The Run tab's model box: the model the engine runs and its quantization, loaded on request
(through the queue), or offered for download when it is not on this machine."""
from __future__ import annotations

from typing import Any

import gradio as gr

from .. import figures as run_figures
from dllm_local.canvas.settings import CANVAS_KNOBS

from ..canvas.controls import CANVAS_CONTROLS, canvas_key, cost_target, knob_placeholder
from ..block.parts import is_block_model
from ..canvas.parts import is_canvas_model
from ..parts.presets import preset_named, presets_for
from ..run.controls import kept_aside, kind_values, masked_only, preset_key, preset_label
from .downloads import DownloadBox
from ..engine.handler import engine_handler
from ..engine.queue import ENGINE, client_of, error_text
from ..parts.inputs import Choice, PageState, Quantization, checked
from .access import DownloadNeeded
from ..run.views import layer_choices


def model_line(info: dict) -> str:
    """The header's line on the loaded model: name, family, kind (a canvas model's canvas length;
    a block model's trained block; a mixture of experts' experts), size, device, dtype,
    quantization, memory."""
    kind = [f"canvas diffusion, canvas length {info['canvas_length']}" if is_canvas_model(info) else
            f"block diffusion, block {info['block_size']}" if is_block_model(info) else "masked diffusion"]
    if "experts" in info:  # the engine names experts only for a mixture of experts
        kind.append(f"{info['experts']} experts, {info['active_experts']} active per token")
    return (f"**Model:** {info['name']} · {info['family']} · {' · '.join(kind)} · "
            f"{info['parameters'] / 1e6:.1f}M parameters · {info['device']} · {info['dtype']} · "
            f"quantization {info['quantization']} · {info['memory_mb']} MB")


def switch_note(info: dict, updates: dict, controls: dict) -> str:
    """What a model switch set in the controls, said beside "Loaded ...": a block model's block
    cache and block in place of the user's, or the user's back; "" where it set nothing."""
    values = {name: (updates.get(controls[name]) or {}).get("value") for name in ("cache", "block_size")}
    if values["cache"] is None:
        return ""
    if is_block_model(info):
        return (f"A block model decodes with its block cache, block {values['block_size']}: the controls show them "
                "(your cache and block size come back when a masked model is loaded).")
    return f"Cache {values['cache']}, block size {values['block_size']}: as before the block model."


class ModelBox:
    """The Run tab's model box. Mixed into ``RunTab``, whose ``session``, ``models``, ``engine``,
    ``status``, ``model_line`` and ``layer`` it reads."""

    def _model_box(self, start: dict) -> None:
        """The box, laid out where it is called (inside a Blocks); ``start``: the control values the
        page starts at (its preset's), the masked-model cache and block size a block model displaces."""
        options = self.session.quantization_options()
        quant_ok = {name: ok for name, ok, _ in options}
        quant_reason = next((r for name, _, r in options if name != "none" and r), "")
        with gr.Accordion("Model", open=False, elem_id="model-box"):
            self.model_pick = gr.Dropdown([n for n, _, _ in self.session.model_options()],
                                          value=self.session.info()["name"], label="Model", allow_custom_value=True,
                                          elem_id="model-pick")
            self.quant = gr.Radio(["none", "8bit", "4bit"], value="none", label="Quantization",
                                  info=quant_reason and f"8-bit and 4-bit: {quant_reason}",
                                  interactive=quant_ok.get("4bit", False))
            self.load_btn = gr.Button("Load model", elem_id="load-model-btn")
            self.downloads = DownloadBox(self.models, self.status, self.engine.lab)
        self.built_for = self.session.info()  # the model the controls were laid out for
        # The user's masked-model cache and block size while a block model's own stand in the
        # controls: a masked model loaded again gets them back (``controls.kept_aside``).
        self.kept = gr.State({name: start[name] for name in ("cache", "block_size")})

    def _masked_boxes(self) -> list[gr.Component]:
        """What means nothing for a canvas model: the masked models' controls, the what-if
        threshold (no confidences to replay) and the branches (a canvas is redrawn every step)."""
        return [self.what_if, self.force_btn, self.remask_btn, self.branch_token,
                *(self.controls[name] for name in masked_only(self.specs))]

    def kind_boxes(self) -> list[gr.Component]:
        """What a model's kind changes (``kind_shown``)."""
        return [self.canvas_reason, self.grid_caption, self.cost_target, self.preset, self.preset_applied,
                *self.captions.values(),
                *self._masked_boxes(), *(self.controls[name] for name in CANVAS_CONTROLS)]

    def kind_shown(self, info: dict, previous: dict, kept: dict | None = None, preset: str | None = None) -> dict:
        """The controls for the kind of model ``info`` describes, loaded after ``previous``: for a
        canvas model its own knobs, and the masked boxes disabled, with the reason; for a masked
        model the other way round; the cache choices of its kind, and a block model's block cache
        and trained block (``controls.kind_values``). The figures' captions for that kind; the
        grid's caption is a masked model's (a canvas grid says its own in its legend). The preset
        menu offers the presets for its kind, naming ``preset`` (the box's) where it is one of them
        (``presets.preset_named``)."""
        canvas = is_canvas_model(info)
        captions = run_figures.captions_for(info)
        values = kind_values(self.specs, info, previous, kept)
        named = preset_named(self.presets, info, preset, (kept or {}).get(preset_key(info)))
        return {self.canvas_reason: gr.update(visible=canvas), self.grid_caption: gr.update(visible=not canvas),
                self.cost_target: cost_target(info),
                # Named, not applied: the controls stay as the switch leaves them (``apply_preset``).
                self.preset: gr.update(label=preset_label(info), choices=presets_for(self.presets, info), value=named),
                self.preset_applied: named or "",
                **{box: captions[name] for name, box in self.captions.items()},
                **{box: gr.update(interactive=not canvas) for box in self._masked_boxes()},
                **{self.controls[name]: gr.update(interactive=not canvas, **update) for name, update in values.items()},
                **{self.controls[canvas_key(name)]: gr.update(visible=canvas, placeholder=knob_placeholder(info, name))
                   for name in CANVAS_KNOBS}}

    def show_model(self, preset: str | None = None) -> dict:
        """The model line and the controls for the model loaded now: a page opened after another
        tab switched models shows that model, not the one it was built with."""
        info = self.session.info()
        return {self.model_line: model_line(info), **self.kind_shown(info, self.built_for, self.kept.value, preset)}

    def _wire_model_box(self) -> None:
        loaded = [self.model_line, self.status, self.layer, self.downloads.note, self.downloads.button,
                  self.downloads.box, self.kept, *self.kind_boxes()]
        inputs, shown = [self.model_pick, self.quant, self.kept], {"cache": self.controls["cache"],
                                                                   "block_size": self.controls["block_size"],
                                                                   "preset": self.preset}
        self.load_btn.click(self.load_model, inputs, loaded, api_name="load_model", inputs_kwargs=shown, **ENGINE)
        self.downloads.wire(self.model_pick, self.load_downloaded, inputs, loaded, inputs_kwargs=shown)

    @engine_handler  # Stop pressed while it waited: it ends unrun, as Stop said
    @checked
    def load_model(self, request: gr.Request, name: Choice, quantization: Quantization, kept: PageState | None = None,
                   progress=gr.Progress(), **shown: Any) -> dict:
        """``kept``: the user's masked-model cache and block size while a block model's stand in the
        controls; ``shown``: the cache and block size the controls show now."""
        client = client_of(request)
        self.engine.lab.require_lecturer(self.engine.lab.who(request), "Switching the model")
        try:
            target = self.models.check(name)  # only the models the page was started to allow
            progress((0, None), desc=f"loading {name}", unit="s")
            previous = self.session.info()
            # The model loads in the engine process; the page shows the seconds it has taken.
            info = self.session.switch_model(target, quantization, run_id=client,
                                             on_wait=lambda s: progress((int(s), None), desc=f"loading {name}", unit="s"))
        except DownloadNeeded as need:  # nothing is fetched before its user has seen the size and agreed
            return self.downloads.offer(need)
        except Exception as exc:  # noqa: BLE001
            return {self.status: f"⚠ {error_text(exc)}"}
        kept = kept_aside(info, previous, shown, kept or {}) if shown else kept or {}
        updates = self.kind_shown(info, previous, kept, shown.get("preset"))
        return {self.model_line: model_line(info), self.layer: gr.update(**layer_choices(info["layers"])),
                self.status: " ".join(filter(None, [f"Loaded {info['name']}.", switch_note(info, updates, self.controls)])),
                self.downloads.box: gr.update(visible=False), self.kept: kept, **updates}

    @checked
    def load_downloaded(self, request: gr.Request, name: Choice, quantization: Quantization,
                        kept: PageState | None = None, progress=gr.Progress(), **shown: Any) -> dict:
        """After a download: the model loads if it is complete on disk; after a cancel or a failure
        the download's own message stays."""
        try:
            self.models.check(name)
        except Exception:  # noqa: BLE001 - still not on disk: the download said why
            return {}
        return self.load_model(request, name, quantization, kept, progress, **shown)

