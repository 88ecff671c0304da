"""Intervening in a run: the side panel of the position clicked in the grid, and a branch — the run
repeated with that position forced to a token (one of its candidates, or typed) or sent back to
mask after the step shown, decoded on with the same settings and drawn beside the original."""
from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from dllm_local.limits import MAX_GEN_LENGTH
from dllm_local.serving.cost import answer_positions
from dllm_local.values import integer

from ..lessons import acceptance, verdicts as lessons
from ..block.edit_lessons import edit_verdict
from ..canvas.parts import is_canvas
from ..engine.handler import engine_handler
from ..engine.queue import RUNS, error_text, place_text
from ..grid.tokens import token_label
from ..parts.inputs import Choice, PageState, StepIndex, checked, number_box
from ..lab.classroom import Who
from .position_panel import candidates_at, position_panel_html
from ..parts.replay import answer_length, prompt_len, prompt_of, state_at
from .views import grid_at

Position = integer(0, MAX_GEN_LENGTH - 1) | None
NO_BRANCH = "Pick a position in the grid, then force a token there or re-mask it: the run decodes on from this step."


def candidate_choices(trace: dict, step: int, position: int) -> list[tuple[str, str]]:
    """The candidates the side panel shows for the position (at the step shown, else when it was
    committed), as menu entries "label (p)" -> token id; the token standing there left out, as
    forcing it would repeat the run unchanged (see :func:`no_change`)."""
    state = state_at(trace, step)
    standing = state["ids"][position]
    shown = candidates_at(trace, state["step"], position, state["commit_step"][position])
    found = {int(t): float(q) for t, q in next((pairs for _, pairs in shown if pairs), [])}
    return [(f"{token_label(trace, t)} (p {q:.2f})", str(t)) for t, q in found.items() if t != standing]


def no_change(trace: dict, step: int, position: int, token: str | None) -> str:
    """Why re-masking (``token`` None) or forcing ``token`` at answer ``position`` after ``step``
    would leave the position as it stands, so that the branch would only repeat the run; "" when the
    change is a real one. A position outside the answer, and a canvas model's run (no branches), are
    the sampler's to refuse, in its words."""
    state = state_at(trace, step)
    if is_canvas(trace) or not 0 <= position < len(state["ids"]):
        return ""
    standing, at = state["ids"][position], state["step"]
    if token is None and standing is None:
        return (f"Position {position} is still masked after step {at}: nothing to re-mask; pick a committed token, "
                "or force a token there")
    if token is not None and standing == int(token):
        return (f"Position {position} already holds '{token_label(trace, standing)}' after step {at}: forcing it "
                "again would repeat the run unchanged; pick another token")
    return ""


def branch_title(trace: dict) -> str:
    branch = trace.get("branch") or {}
    if not branch:
        return ""
    position = int(branch["position"]) - prompt_len(trace)
    token = branch.get("token")
    change = "sent back to mask" if token is None else f"forced to '{token_label(trace, token)}'"
    return (f'<div class="dl-branch-title" style="font-size:17px;font-weight:700;">Branch: position {position} '
            f"{change} after step {branch['after_step']}</div>")


def branch_views(trace: dict, step: int, color_by: str) -> tuple[str, str]:
    """The branch's grid (headed by its one change) and its verdicts at ``step`` (clamped to it)."""
    steps = len(trace.get("steps") or [])
    if not steps:
        return "", ""
    at = min(int(step), steps - 1)
    verdicts = lessons.verdicts_html([*lessons.grid_verdicts(trace, at), acceptance.acceptance_verdict(trace, at),
                                         edit_verdict(trace, at)])
    return branch_title(trace) + grid_at(trace, at, color_by, 0.0), verdicts


class Branching:
    """The Run tab's side panel and branches. Mixed into ``RunTab``, whose ``session``, ``trace``,
    ``scrub``, ``color_by``, ``status`` and ``exports`` it reads."""

    def _token_panel(self) -> None:
        self.position = number_box(None, label="Position (click a token in the grid)", precision=0, minimum=0,
                                   elem_id="position")
        # Force and Re-mask above the position's history (which grows with the run): on the first
        # screen in presenter view at every font scale.
        with gr.Row(equal_height=True, elem_id="branch-controls"):
            self.branch_token = gr.Dropdown([], label="Token to force (a candidate, or type a token id)",
                                            allow_custom_value=True, elem_id="branch-token", scale=3)
            self.force_btn = gr.Button("Force it, branch", elem_id="force-btn", scale=1)
            self.remask_btn = gr.Button("Re-mask, branch", elem_id="remask-btn", scale=1)
        self.branch_status = gr.Markdown(NO_BRANCH, elem_id="branch-status")
        self.position_panel = gr.HTML(elem_id="position-panel")
        self.branch_trace = gr.State({})

    def _branch_boxes(self) -> None:
        with gr.Column(elem_id="branch-col", visible=False) as self.branch_col:
            self.branch_grid = gr.HTML(elem_id="branch-grid")
            self.branch_verdicts = gr.HTML(elem_id="branch-verdicts")
            self.branch_export = gr.DownloadButton("Export branch (JSON)", visible=False, elem_id="branch-export")

    @checked
    def show_position(self, trace: PageState, step: StepIndex, position: Position) -> tuple:
        """The side panel and the menu of tokens to force, for the position picked at the step shown."""
        if position is None or not trace or not trace.get("steps"):
            return "", gr.update(choices=[], value=None)
        choices = candidate_choices(trace, int(step), int(position)) if position < answer_length(trace) else []
        return (position_panel_html(trace, int(step), int(position)),
                gr.update(choices=choices, value=choices[0][1] if choices else None))

    @checked
    def show_branch(self, branch: PageState, step: StepIndex, color_by: Choice) -> tuple:
        return branch_views(branch, int(step), color_by) if branch else ("", "")

    def branch_force(self, request: gr.Request, trace: dict, step: int, position: int | None, token: str | None,
                     color_by: str) -> Iterator[dict]:
        yield from self.branch(request, False, trace, step, position, token, color_by)

    def branch_remask(self, request: gr.Request, trace: dict, step: int, position: int | None, token: str | None,
                      color_by: str) -> Iterator[dict]:
        yield from self.branch(request, True, trace, step, position, token, color_by)

    @engine_handler
    @checked
    def branch(self, request: gr.Request, remask: bool, trace: PageState, step: StepIndex, position: Position,
               token: Choice | None, color_by: Choice) -> Iterator[dict]:
        """The run of ``trace`` again, with ``position`` forced to ``token`` (or sent back to mask,
        ``remask``) after step ``step``; streamed into the branch's grid."""
        if not trace or not trace.get("steps") or position is None:
            yield {self.branch_status: "⚠ Run something and pick a position in the grid first."}
            return
        if not remask and not (token or "").strip().isdigit():
            yield {self.branch_status: "⚠ Choose a candidate, or type a token id (a whole number), to force."}
            return
        prompt = prompt_of(trace)
        if prompt is None:
            yield {self.branch_status: "⚠ This trace's prompt cannot be read back from it, so it cannot be repeated."}
            return
        at = min(int(step), len(trace["steps"]) - 1)
        why = no_change(trace, at, int(position), None if remask else token)
        if why:
            yield {self.branch_status: f"⚠ {why}."}
            return
        change = {"after_step": at, "position": prompt_len(trace) + int(position),
                  "token": None if remask else int(token)}
        who = self.engine.lab.who(request)
        try:
            # The settings as the engine will run them: a trace's missing length is the default's.
            with self.engine.lab.admitted(who, answer_positions(trace["settings"], self.session.info())):
                yield from self._branched(trace, prompt, change, who, step, color_by)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
            yield {self.branch_status: f"⚠ {error_text(exc)}"}

    def _branched(self, trace: dict, prompt, change: dict, who: Who, step: int, color_by: str) -> Iterator[dict]:
        live: dict = {}
        for event in self.session.run(prompt, trace["settings"], run_id=who.client, branch=change, first=who.lecturer):
            if "queued" in event:
                yield {self.branch_status: place_text(event["queued"])}
                continue
            live = event["trace"]
            if live.get("prompt_ids") != trace.get("prompt_ids"):
                yield {self.branch_status: "⚠ The prompt read back from this trace encodes differently; "
                                           "the branch would not repeat the run."}
                return
            grid_html, verdicts = branch_views(live, step, color_by)
            yield {self.branch_trace: live, self.branch_grid: grid_html, self.branch_verdicts: verdicts,
                   self.branch_col: gr.Column(visible=True),
                   self.branch_status: f"Branching: {len(live.get('steps') or [])} steps decoded…"}
        same = live.get("final_ids") == trace.get("final_ids")
        yield {self.branch_status: f"Branch done: {len(live['steps'])} steps (the original: {len(trace['steps'])});"
                                   f" its answer {'is the same' if same else 'differs'}: {live.get('text', '')!r}",
               self.branch_export: gr.update(value=self.exports.write(live), visible=True)}

    def _wire_branching(self, step_moves: list) -> None:
        """``step_moves``: the events after which the step shown has moved."""
        shown = [self.trace, self.scrub, self.position]
        self.position.change(self.show_position, shown, [self.position_panel, self.branch_token], queue=False)
        for moved in step_moves:
            moved.then(self.show_position, shown, [self.position_panel, self.branch_token], queue=False,
                       api_visibility="private").then(
                self.show_branch, [self.branch_trace, self.scrub, self.color_by], [self.branch_grid,
                                                                                  self.branch_verdicts],
                queue=False, api_visibility="private")
        outputs = [self.branch_trace, self.branch_grid, self.branch_verdicts, self.branch_status, self.branch_export,
                   self.branch_col, self.status]
        for button, handler in ((self.force_btn, self.branch_force), (self.remask_btn, self.branch_remask)):
            button.click(handler, [self.trace, self.scrub, self.position, self.branch_token, self.color_by], outputs,
                         api_name=handler.__name__, show_progress="minimal", show_progress_on=[self.branch_status],
                         **RUNS)
