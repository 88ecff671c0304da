"""The Compare tab: two settings on one prompt, seed and generation length, each timed in a chosen
number of interleaved repeats after a warm-up, their speeds judged by a rank test."""
from __future__ import annotations

import html
from collections import deque
from collections.abc import Iterator
from typing import Any

import gradio as gr

from dllm_local.errors import SettingsError, shown
from dllm_local.files import FileRefused, parse_json
from dllm_local.serving.cost import answer_positions
from dllm_local.values import Text, integer
from dllm_local.settings import Settings

from ..grid import tokens as grid
from ..parts import tables
from .comparison import compare, compare_html
from ..run.controls import Specs, settings_from_controls, settings_line, spec_named
from ..engine.handler import engine_handler
from ..engine.queue import ENGINE, EngineQueue, client_of, error_text, place_text, throttled
from ..parts.replay import numbers
from ..parts.inputs import Choice, checked, number_slider
from ..parts.presets import CURRENT_RUN
from ..run.tab import RunTab
from ..parts.timing import ALPHA, MAX_REPEATS, MIN_REPEATS, REPEATS, repeats_needed, smallest_p

SETTING_FIELDS = ("gen_length", "block_size", "steps", "temperature", "seed", "exact_drift", "early_stop",
                  "forward_mode")
Repeats = integer(MIN_REPEATS, MAX_REPEATS)  # the repeat count: timed runs of each side


def at_length(settings: dict, gen_length: int) -> tuple[dict, str]:
    """``settings`` answering in ``gen_length`` positions, and a note of what changed ("" when
    nothing did). A fixed schedule's steps scale with the length, so that each step commits as
    many tokens as the settings' own schedule does. Their checks (a block size that must divide
    the length, ...) are ``Settings``', when the side is read."""
    own = Settings.from_dict(settings)
    if own.gen_length == gen_length:
        return settings, ""
    out, note = dict(settings, gen_length=gen_length), f"its own length is {own.gen_length}"
    if own.steps is not None:
        out["steps"] = max(1, round(own.steps * gen_length / own.gen_length))
        note += f"; steps {own.steps} → {out['steps']}, the same tokens per step"
    return out, note


def _applies(settings: dict, changes: str, specs: Specs) -> bool:
    """Whether ``changes`` make valid settings of ``settings`` as they are (at their own length)."""
    try:
        Settings.from_dict(apply_changes(settings, changes, specs))
    except SettingsError:
        return False
    return True


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
            raise SettingsError(f"Changes to B: {shown(pair)} is not key=value (e.g. threshold=0.5)")
        try:
            value = parse_json(text)
        except FileRefused:  # not JSON (or nested past reason): the schema reads it as text
            value = text
        if key in ("cache", "unmask"):
            out[key], out[f"{key}_params"] = value, {}
        elif key in SETTING_FIELDS:
            out[key] = value
        else:
            kind = next((k for k in ("unmask", "cache")
                         if any(p["name"] == key for p in spec_named(specs, k, out[k])["params"])), None)
            if kind is None:
                raise SettingsError(f"Changes to B: {shown(key)} is neither a setting nor a parameter of "
                                    f"{out['cache']} or {out['unmask']}")
            out[f"{kind}_params"][key] = value
    return out


def side_line(settings: Settings) -> str:
    """A side's settings in one line, with its forward mode where it asks for one (B may differ from
    A in nothing else: forward_mode=compiled against eager)."""
    mode = "" if settings.forward_mode == "auto" else f" · forward {settings.forward_mode}"
    return settings_line(settings.to_dict()) + mode


class CompareTab:
    """The Compare tab's components (laid out on creation, inside a ``gr.Tab``) and its callback.
    It reads the Run tab's controls (and its prompt, for Current Run settings)."""

    def __init__(self, engine: EngineQueue, presets: dict, run: RunTab) -> None:
        self.engine, self.session, self.presets, self.specs, self.run_tab = (engine, engine.session, presets,
                                                                            run.specs, run)
        gr.Markdown("Two settings on one prompt, the Run tab's seed and **A's generation length**: B runs at A's "
                    "length (a fixed schedule's steps scaled to match), since times and answers of different lengths "
                    "are of different work; Changes to B that set another length are refused. Each side runs once "
                    "untimed (a warm-up, drawn live), then the chosen number of timed repeats of each, interleaved "
                    "A, B, A, B, … so that a busy machine slows both alike. Times are medians with their min–max; "
                    "the speedup of B is the ratio of the medians, claimed only when a rank test (Mann–Whitney, "
                    f"exact) finds the two sides' times apart at p < {ALPHA}. Answers are compared up to their end "
                    "of text. Either side can be the Run tab's current settings or a preset; B can be changed "
                    "further.")
        choices = [CURRENT_RUN, *presets]
        with gr.Row():
            self.preset_a = gr.Dropdown(choices, value=CURRENT_RUN, label="Settings A", elem_id="preset-a")
            baseline = "LLaDA baseline" if "LLaDA baseline" in presets else next(iter(presets), None)
            self.preset_b = gr.Dropdown(choices, value=baseline, label="Settings B", elem_id="preset-b")
        self.changes = gr.Textbox("", label="Changes to B (optional), e.g. threshold=0.5, block_size=16, cache=prefix",
                                  elem_id="cmp-changes")
        self.prompt = gr.Textbox(run.prompt.value, lines=2, elem_id="cmp-prompt",
                                 label="Prompt of both sides: Settings A's preset prompt, or the Run tab's prompt "
                                       "for Current Run settings (filled in when they change; yours to edit)")
        with gr.Row():
            fewest = repeats_needed()
            self.repeats = number_slider(MIN_REPEATS, MAX_REPEATS, value=REPEATS, step=1, elem_id="cmp-repeats",
                                        label="Timed repeats of each side",
                                        info=f"below {fewest} the rank test cannot find a difference (with {fewest - 1} "
                                             f"a side its smallest p is {smallest_p(fewest - 1, fewest - 1):.2f})")
            self.button = gr.Button("Run both", variant="primary", elem_id="cmp-btn")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="cmp-stop-btn")
        self.stop_note = gr.Markdown("", elem_id="cmp-stop-note")
        self.status = gr.Markdown("", elem_id="cmp-status")
        with gr.Row():
            self.grid_a = gr.HTML(elem_id="grid-a")
            self.grid_b = gr.HTML(elem_id="grid-b")
        self.table = gr.HTML(elem_id="cmp-table")

    def wire(self) -> None:
        self.preset_a.change(self.prompt_of_a, [self.preset_a, self.run_tab.prompt, self.prompt], [self.prompt],
                             queue=False, api_visibility="private")
        self.run_tab.prompt.change(lambda name_a, run_prompt, shown: run_prompt if name_a == CURRENT_RUN else shown,
                                   [self.preset_a, self.run_tab.prompt, self.prompt], [self.prompt], queue=False,
                                   api_visibility="private")
        event = self.button.click(self.run_compare, [self.preset_a, self.preset_b, self.changes, self.prompt,
                                                     self.repeats],
                                  [self.grid_a, self.grid_b, self.table, self.status],
                                  inputs_kwargs=self.run_tab.controls, api_name="compare", **ENGINE)
        self.engine.wire_stop(self.stop_btn, self.stop_note, [event], api_name="compare_stop")

    @checked
    def prompt_of_a(self, name_a: Choice, run_prompt: Text, shown: Text) -> str:
        """The prompt that comes with Settings A: its preset's own (``shown`` when it has none), or
        the Run tab's for Current Run settings."""
        if name_a == CURRENT_RUN:
            return run_prompt
        return self.presets.get(name_a, {}).get("prompt", shown)

    def _side(self, name: str, current: dict) -> dict:
        return dict(current) if name == CURRENT_RUN else dict(self.presets[name]["settings"], seed=current["seed"])

    def _sides(self, name_a: str, name_b: str, changes: str, current: dict) -> tuple[dict[str, Settings], str]:
        """Both sides' settings at A's generation length, and a note of how B's was changed to it
        ("" when it was not). Changes to B that set another length are refused: like with like."""
        a = Settings.from_dict(self._side(name_a, current))
        base_b, note = at_length(self._side(name_b, current), a.gen_length)
        try:
            b = Settings.from_dict(apply_changes(base_b, changes, self.specs))
        except SettingsError as exc:
            if not note or not _applies(self._side(name_b, current), changes, self.specs):
                raise  # the changes themselves, at any length: the length is not the problem
            raise SettingsError(f"B cannot run at A's generation length {a.gen_length} ({note}), so the two cannot "
                                f"be compared: {exc}. Changes to B can set what A's length needs.") from exc
        if b.gen_length != a.gen_length:
            raise SettingsError(f"Not compared: Changes to B set its generation length to {b.gen_length} and A's is "
                                f"{a.gen_length}; times and answers of different lengths are of different work. "
                                "Leave gen_length out of Changes to B (B runs at A's length), or change A's.")
        return {"a": a, "b": b}, note and f"B runs at A's generation length {a.gen_length} ({note})"

    @engine_handler
    @checked
    def run_compare(self, request: gr.Request, name_a: Choice, name_b: Choice, changes: Text, prompt: Text,
                    repeats: Repeats = REPEATS, **controls: Any) -> Iterator[dict]:
        client = client_of(request)
        self.engine.lab.require_lecturer(self.engine.lab.who(request), "Compare",
                                         "its timed runs have the engine to themselves, which would hold every "
                                         "student's run")
        current, _ = settings_from_controls(controls, self.specs, self.session.info())
        sides, length_note = self._sides(name_a, name_b, changes, current)
        labels = {key: f"{key.upper()}: {side_line(settings)}" for key, settings in sides.items()}
        if length_note:
            labels["b"] += f" ({length_note})"
        grids = {"a": "", "b": ""}  # a new comparison clears the last one's grids
        timed: dict[str, list[dict]] = {"a": [], "b": []}

        def shown(status: str) -> dict:
            return {self.grid_a: grids["a"], self.grid_b: grids["b"], self.table: "", self.status: status}

        def drawn(key: str, trace: dict) -> str:
            return (f'<div class="dl-side"><b>{html.escape(labels[key])}</b></div>'
                    + grid.token_grid_html(trace, len(trace["steps"]) - 1))

        try:
            who = self.engine.lab.who(request)
            cost = max(answer_positions(settings, self.session.info()) for settings in sides.values())
            with self.engine.several_runs(client) as stop_asked, self.engine.lab.admitted(who, cost):
                for key, settings in sides.items():  # the warm-ups, drawn live: their time is not counted
                    if stop_asked():
                        yield shown(f"Stopped before the warm-up of {key.upper()}: nothing was timed.")
                        return
                    for live, _ in throttled(self.session.run(prompt, settings, run_id=client, alone=True)):
                        if "queued" in live:
                            yield shown(place_text(live["queued"]))
                            continue
                        grids[key] = drawn(key, live)
                        yield shown(f"Warm-up of {labels[key]} (not timed)…")
                    if live["stats"].get("stopped"):
                        yield shown(f"Stopped during the warm-up of {key.upper()}: nothing was timed.")
                        return
                for repeat in range(1, repeats + 1):
                    for key, settings in sides.items():
                        if stop_asked():  # pressed between two runs, when no run was going
                            yield self._ended(grids, timed, f"Stopped before {key.upper()}'s repeat {repeat} of "
                                                            f"{repeats}")
                            return
                        # Started before the status is sent, so a Stop pressed meanwhile reaches this run;
                        # not drawn, so the page's drawing stays out of the engine's time.
                        events = self.session.run(prompt, settings, run_id=client, alone=True)
                        yield {self.status: f"Timing: repeat {repeat} of {repeats}, {labels[key]}…"}
                        trace = deque(events, maxlen=1)[0]["trace"]
                        if trace["stats"].get("stopped"):
                            yield self._ended(grids, timed,
                                              f"Stopped during {key.upper()}'s repeat {repeat} of {repeats}")
                            return
                        timed[key].append(trace)
        except Exception as exc:  # noqa: BLE001
            yield shown(f"⚠ {error_text(exc)}")
            return
        grids.update({key: drawn(key, timed[key][-1]) for key in sides})
        yield self._ended(grids, timed, f"Done. {repeats} timed repeats of each side, interleaved, after a warm-up "
                                        f"of each; both on the prompt above, seed {sides['a'].seed}, generation "
                                        f"length {sides['a'].gen_length}" + (f". {length_note}" if length_note else ""))

    def _ended(self, grids: dict, timed: dict, how: str) -> dict:
        """The comparison of the repeats timed so far (each grid shows the last of its side, with
        its numbers over the repeats), or only ``how`` when a side has none."""
        if not timed["a"] or not timed["b"]:
            return {self.grid_a: grids["a"], self.grid_b: grids["b"], self.table: "",
                    self.status: f"{how}: no side was timed to the end, so there is nothing to compare."}
        result = compare(timed["a"][-1], timed["b"][-1], timed["a"], timed["b"])
        cards = {key: tables.numbers_html(numbers(timed[key][-1]), result[f"timing_{key}"]) for key in "ab"}
        counts = f"{result['repeats_a']} of A, {result['repeats_b']} of B"
        return {self.grid_a: grids["a"] + cards["a"], self.grid_b: grids["b"] + cards["b"],
                self.table: compare_html(result),
                self.status: how + ("." if how.startswith("Done") else f": the table covers the repeats finished "
                                                                         f"({counts}).")}
