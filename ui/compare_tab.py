"""The Compare tab: two settings on the Run tab's prompt and seed, run one after the other."""
from __future__ import annotations

import html
import json
from collections.abc import Iterator

import gradio as gr

from dllm_local.errors import DllmError, SettingsError
from dllm_local.settings import Settings

from . import grid, tables
from .controls import Specs, settings_from_controls, settings_line, spec_named
from .engine_queue import CANCELLED, ENGINE, EngineQueue, client_of, error_text, throttled
from .replay import compare
from .run_tab import RunTab

CURRENT = "Current Run settings"
SETTING_FIELDS = ("gen_length", "block_size", "steps", "temperature", "seed", "exact_drift", "early_stop")


def apply_changes(settings: dict, changes: str, specs: Specs) -> dict:
    """``settings`` with "key=value, ..." applied: a settings field (block_size, gen_length,
    temperature, cache, unmask, ...) or a parameter of the chosen policies (threshold, ...).
    The values are checked where every setting is, by ``Settings``."""
    out = {**settings, "cache_params": dict(settings.get("cache_params", {})),
           "unmask_params": dict(settings.get("unmask_params", {}))}
    pairs = [p.strip() for p in str(changes or "").split(",") if p.strip()]
    for pair in pairs:
        key, sep, text = (part.strip() for part in pair.partition("="))
        if not sep or not key or not text:
            raise SettingsError(f"Changes to B: {pair!r} is not key=value (e.g. threshold=0.5)")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if key in ("cache", "unmask"):
            out[key], out[f"{key}_params"] = value, {}
        elif key in SETTING_FIELDS:
            out[key] = value
        else:
            kind = next((k for k in ("unmask", "cache")
                         if any(p["name"] == key for p in spec_named(specs, k, out[k])["params"])), None)
            if kind is None:
                raise SettingsError(f"Changes to B: {key!r} is neither a setting nor a parameter of "
                                    f"{out['cache']} or {out['unmask']}")
            out[f"{kind}_params"][key] = value
    return out


class CompareTab:
    """The Compare tab's components (laid out on creation, inside a ``gr.Tab``) and its callback.
    It reads the Run tab's prompt and controls."""

    def __init__(self, engine: EngineQueue, presets: dict, run: RunTab) -> None:
        self.engine, self.session, self.presets, self.specs, self.run_tab = (engine, engine.session, presets,
                                                                            run.specs, run)
        gr.Markdown("Two settings on the Run tab's prompt and seed, run one after the other so each run's time is its "
                    "own. Either side can be the Run tab's current settings or a preset; B can be changed further.")
        choices = [CURRENT, *presets]
        with gr.Row():
            self.preset_a = gr.Dropdown(choices, value=CURRENT, label="Settings A", elem_id="preset-a")
            baseline = "LLaDA baseline" if "LLaDA baseline" in presets else next(iter(presets), None)
            self.preset_b = gr.Dropdown(choices, value=baseline, label="Settings B", elem_id="preset-b")
        self.changes = gr.Textbox("", label="Changes to B (optional), e.g. threshold=0.5, block_size=16, cache=prefix",
                                  elem_id="cmp-changes")
        self.button = gr.Button("Run both", variant="primary", elem_id="cmp-btn")
        self.status = gr.Markdown("", elem_id="cmp-status")
        with gr.Row():
            self.grid_a = gr.HTML(elem_id="grid-a")
            self.grid_b = gr.HTML(elem_id="grid-b")
        self.table = gr.HTML(elem_id="cmp-table")

    def wire(self) -> None:
        self.button.click(self.run_compare, [self.preset_a, self.preset_b, self.changes, self.run_tab.prompt],
                          [self.grid_a, self.grid_b, self.table, self.status], inputs_kwargs=self.run_tab.controls,
                          api_name="compare", **ENGINE)

    def _side(self, name: str, current: dict) -> dict:
        return dict(current) if name == CURRENT else dict(self.presets[name]["settings"], seed=current["seed"])

    def run_compare(self, request: gr.Request, name_a: str, name_b: str, changes: str, prompt: str,
                    **controls) -> Iterator[dict]:
        client = client_of(request)
        if self.engine.take_cancel(client):
            yield {self.status: CANCELLED}
            return
        try:
            current, _ = settings_from_controls(controls, self.specs)
            sides = {"a": Settings.from_dict(self._side(name_a, current)),
                     "b": Settings.from_dict(apply_changes(self._side(name_b, current), changes, self.specs))}
        except (ValueError, TypeError, DllmError) as exc:
            yield {self.status: f"⚠ {exc}"}
            return
        results = {}
        grids = {"a": "", "b": ""}  # a new comparison clears the last one's grids

        def shown(status: str) -> dict:
            return {self.grid_a: grids["a"], self.grid_b: grids["b"], self.table: "", self.status: status}

        for key, settings in sides.items():
            label = f"{key.upper()}: {settings_line(settings.to_dict())}"
            try:
                for live, _ in throttled(self.session.run(prompt, settings, run_id=client)):
                    grids[key] = f'<div class="dl-side"><b>{html.escape(label)}</b></div>' + grid.token_grid_html(
                        live, len(live["steps"]) - 1)
                    yield shown(f"Running {label}…")
                results[key] = live
            except Exception as exc:  # noqa: BLE001
                yield shown(f"⚠ {error_text(exc)}")
                return
        yield {self.table: tables.compare_html(compare(results["a"], results["b"])),
               self.status: f"Done. Both on the Run tab's prompt, seed {sides['a'].seed}."}
