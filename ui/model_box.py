"""The Run tab's model box: the model the engine runs and its quantization, loaded on request
(through the queue), or offered for download when it is not on this machine."""
from __future__ import annotations

import gradio as gr

from .downloads import DownloadBox
from .engine_handler import engine_handler
from .engine_queue import ENGINE, client_of, error_text
from .inputs import Choice, Quantization, checked
from .model_access import DownloadNeeded
from .run_views import layer_choices


def model_line(info: dict) -> str:
    """The header's line on the loaded model: name, family, size, device, dtype, quantization, memory."""
    return (f"**Model:** {info['name']} · {info['family']} · {info['parameters'] / 1e6:.1f}M parameters · "
            f"{info['device']} · {info['dtype']} · quantization {info['quantization']} · {info['memory_mb']} MB")


class ModelBox:
    """The Run tab's model box. Mixed into ``RunTab``, whose ``session``, ``models``, ``engine``,
    ``status``, ``model_line`` and ``layer`` it reads."""

    def _model_box(self) -> None:
        """The box, laid out where it is called (inside a Blocks)."""
        options = self.session.quantization_options()
        quant_ok = {name: ok for name, ok, _ in options}
        quant_reason = next((r for name, _, r in options if name != "none" and r), "")
        with gr.Accordion("Model", open=False):
            self.model_pick = gr.Dropdown([n for n, _, _ in self.session.model_options()],
                                          value=self.session.info()["name"], label="Model", allow_custom_value=True)
            self.quant = gr.Radio(["none", "8bit", "4bit"], value="none", label="Quantization",
                                  info=quant_reason and f"8-bit and 4-bit: {quant_reason}",
                                  interactive=quant_ok.get("4bit", False))
            self.load_btn = gr.Button("Load model")
            self.downloads = DownloadBox(self.models, self.status)

    def _wire_model_box(self) -> None:
        loaded = [self.model_line, self.status, self.layer, self.downloads.note, self.downloads.button,
                  self.downloads.box]
        self.load_btn.click(self.load_model, [self.model_pick, self.quant], loaded, api_name="load_model", **ENGINE)
        self.downloads.wire(self.model_pick, self.load_downloaded, [self.model_pick, self.quant], loaded)

    @engine_handler  # Stop pressed while it waited: it ends unrun, as Stop said
    @checked
    def load_model(self, request: gr.Request, name: Choice, quantization: Quantization, progress=gr.Progress()) -> dict:
        client = client_of(request)
        try:
            target = self.models.check(name)  # only the models the page was started to allow
            progress((0, None), desc=f"loading {name}", unit="s")
            # The model loads in the engine process; the page shows the seconds it has taken.
            info = self.session.switch_model(target, quantization, run_id=client,
                                             on_wait=lambda s: progress((int(s), None), desc=f"loading {name}", unit="s"))
        except DownloadNeeded as need:  # nothing is fetched before its user has seen the size and agreed
            return self.downloads.offer(need)
        except Exception as exc:  # noqa: BLE001
            return {self.status: f"⚠ {error_text(exc)}"}
        return {self.model_line: model_line(info), self.status: f"Loaded {info['name']}.",
                self.layer: gr.update(**layer_choices(info["layers"])), self.downloads.box: gr.update(visible=False)}

    @checked
    def load_downloaded(self, request: gr.Request, name: Choice, quantization: Quantization,
                        progress=gr.Progress()) -> dict:
        """After a download: the model loads if it is complete on disk; after a cancel or a failure
        the download's own message stays."""
        try:
            self.models.check(name)
        except Exception:  # noqa: BLE001 - still not on disk: the download said why
            return {}
        return self.load_model(request, name, quantization, progress)

