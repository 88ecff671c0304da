"""A trace in and out of the Run tab: the export file written once a run is drawn, and an
imported trace, checked in full, replayed with its prompt and settings put into the controls."""
from __future__ import annotations

from typing import Any

import gradio as gr

from dllm_local.errors import DllmError
from dllm_local.trace import load_trace_file

from .inputs import Choice, ColorBy, Fraction, KVView, Which, checked
from .replay import prompt_of
from .run_views import draw, step_slider
from .status_line import count, off_task_line


class TraceFiles:
    """The Run tab's export and import. Mixed into ``RunTab``, whose ``exports``, components,
    ``shown``, ``control_values`` and ``preset_matching`` it reads."""

    def export_ready(self, trace: dict):
        # After the final state is drawn: writing a long trace is not what the user waits to see.
        return self.exports.write(trace) if trace.get("steps") else gr.update()

    @checked
    def import_trace(self, file: Any, color_by: ColorBy, layer: Choice, which: Which, kv_view: KVView,
                     what_if: Fraction) -> dict:
        """A trace file, checked in full before anything is drawn; its prompt and settings go into
        the Run tab's controls. A bad file is one message in the status line."""
        try:
            if file is None:
                raise DllmError("no file was given; choose a trace exported by dllm-local")
            trace = load_trace_file(file if isinstance(file, str) else file.name).to_dict()
        except DllmError as exc:
            return {self.status: f"⚠ could not import that file: {exc}"}
        n = len(trace["steps"])
        prompt = prompt_of(trace)
        try:
            controls = self.control_values(trace["settings"])
            preset = self.preset_matching(trace["settings"], prompt)
        except (ValueError, TypeError, KeyError):
            controls, preset = {}, None  # a trace of policies this build lacks
        status = " ".join(filter(None, [
            off_task_line(prompt, (trace.get("model") or {}).get("name")),
            f"Replaying an imported trace: {count(n, 'step')}, {trace['settings'].get('cache')} + "
            f"{trace['settings'].get('unmask')}." + (" Move the step slider." if n > 1 else "")]))
        return {self.trace: trace, **self.shown(draw(trace, None, color_by, layer, which, kv_view, what_if)),
                self.scrub: step_slider(n, True, value=max(0, n - 1)), self.status: status,
                self.export_btn: self.exports.write(trace), **({} if prompt is None else {self.prompt: prompt}),
                **controls, self.preset: preset}
