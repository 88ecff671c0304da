"""A trace in and out of the Run tab: the export file written once a run is drawn, and an
imported trace, checked in full, replayed with its prompt and settings put into the controls."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gradio as gr

from dllm_local.errors import DllmError
from dllm_local.trace import load_trace_file

from ..parts.inputs import Choice, ColorBy, FontScale, Fraction, KVView, Theme, Which, checked
from ..parts.replay import prompt_of
from .views import draw, step_slider
from .status_line import count, off_task_line


class TraceFiles:
    """The Run tab's export and import. Mixed into ``RunTab``, whose ``exports``, components,
    ``shown``, ``control_values``, ``preset_matching`` and ``apply_preset`` it reads."""

    def wire_import(self, views: list, controls: list) -> gr.events.Dependency:
        """Import trace: checked in full (size, schema, lengths) before anything is drawn; a bad
        file is one message. ``views``: the view boxes; ``controls``: the run's controls. Returns
        the upload's event, for what follows it."""
        return self.import_file.upload(self.import_trace, [self.import_file, *self.view_inputs],
                                       [self.trace, *views, self.scrub, self.status, self.export_btn, self.prompt,
                                        *controls, self.preset, self.preset_applied, self.layer, self.which,
                                        self.kv_view],
                                       api_name="import_trace", concurrency_limit=2, concurrency_id="import")

    def export_ready(self, trace: dict):
        # After the final state is drawn: writing a long trace is not what the user waits to see.
        return self.exports.write(trace) if trace.get("steps") else gr.update()

    @checked
    def import_trace(self, file: Any, color_by: ColorBy, layer: Choice, which: Which, kv_view: KVView,
                     what_if: Fraction, font_scale: FontScale = "1×", theme: Theme = "light") -> Iterator[dict]:
        """A trace file, checked in full before anything is drawn; its prompt and settings go into
        the Run tab's controls. A bad file is one message in the status line."""
        try:
            if file is None:
                raise DllmError("no file was given; choose a trace exported by dllm-local")
            trace = load_trace_file(file if isinstance(file, str) else file.name).to_dict()
        except DllmError as exc:
            yield {self.status: f"⚠ could not import that file: {exc}"}
            return
        n = len(trace["steps"])
        prompt = prompt_of(trace)
        try:
            controls = self.control_values(trace["settings"])
            preset = self.preset_matching(trace["settings"], prompt)
        except (ValueError, TypeError, KeyError):
            controls, preset = {}, None  # a trace of policies this build lacks
        status = " ".join(filter(None, [
            off_task_line(prompt, trace.get("model") or {}),
            f"Replaying an imported trace: {count(n, 'step')}, {trace['settings'].get('cache')} + "
            f"{trace['settings'].get('unmask')}." + (" Move the step slider." if n > 1 else "")]))
        # The KV panel opens where the preset the trace equals opens it (as choosing that preset
        # would), else stays; its boxes go in the same update as the plot and verdict drawn for them.
        opened = self.apply_preset(preset) if preset else {}
        layer, which, kv_view = (opened.get(box, value) for box, value in
                                 ((self.layer, layer), (self.which, which), (self.kv_view, kv_view)))
        views = draw(trace, None, color_by, layer, which, kv_view, what_if, font_scale=font_scale, theme=theme)
        panel = {self.layer: layer, self.which: which, self.kv_view: kv_view}
        slider = step_slider(n, True, value=max(0, n - 1))
        if panel:  # the step first: a panel box set changes, and its redraw reads the slider as it is then
            yield {self.trace: trace, self.scrub: slider}
        yield {self.trace: trace, **self.shown(views), **panel, self.scrub: slider, self.status: status,
                self.export_btn: self.exports.write(trace), **({} if prompt is None else {self.prompt: prompt}),
                **controls, self.preset: preset, self.preset_applied: preset or ""}
