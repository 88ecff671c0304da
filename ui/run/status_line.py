"""The Run tab's status line in words: the off-task word, notices, a run's progress (and how far
the view trails it) or how it ended, with its settings, answer and verdict."""
from __future__ import annotations

from dllm_local.tiny.tasks import verdict

from ..grid import tokens
from ..canvas.controls import canvas_settings_line
from ..canvas.parts import is_canvas_model
from .controls import settings_line
from ..parts.replay import prompt_of


def count(n: int, noun: str) -> str:
    """"1 step", "6 steps"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def off_task_line(prompt: str | None, model: dict) -> str:
    """A tiny-task model's word on a prompt none of its tasks pose; empty otherwise."""
    notice = tokens.off_task_notice(prompt, model)
    return f"⚠ {notice}" if notice else ""


def run_status(trace: dict, notice: str, first_paint: float | None, done: bool, behind: int = 0,
               redraw_s: float = 0.0, frozen_at: int | None = None, stopped_by: str | None = None) -> str:
    """The status line of a run: the off-task word, notices, then its progress or how it ended.
    While it runs: ``behind``, how many steps the engine gets ahead of the view before its next
    redraw, ``redraw_s`` apart (said when over 2), and ``frozen_at``, the step the view holds
    while Follow live is off; ``stopped_by``: who stopped the run, when not its own tab (the
    lecturer, ``Lab.stoppers``)."""
    n = len(trace.get("steps", []))
    parts = [off_task_line(prompt_of(trace), trace.get("model") or {}), notice]
    parts = [part for part in parts if part]
    if done:
        st = trace.get("stats", {})
        answer = trace.get("text", "")
        settings = (canvas_settings_line if is_canvas_model(trace.get("model") or {}) else settings_line)(trace["settings"])
        parts.extend(filter(None, [forward_notice_line(trace)]))  # before the answer: a fallback is never missed
        ended = "Done" if not st.get("stopped") else f"Stopped by {stopped_by}" if stopped_by else "Stopped"
        parts.append(f"{ended}: {work_line(trace)} "
                     f"({settings}{forward_part(trace)}). **Answer:** {answer}{_verdict_text(trace, answer)}")
    else:
        parts.append(f"Running… {count(n, 'step')} so far.")
        if frozen_at is not None:
            parts.append(f"The view holds step {frozen_at} (Follow live is off: tick it to catch up).")
        elif behind > 2:
            parts.append(f"The view trails the engine by up to {count(behind, 'step')}: it is redrawn every "
                         f"{redraw_s:.1f} s, as often as the page can without slowing the run.")
    if first_paint is not None:
        parts.append(f"(first step painted {first_paint * 1e3:.0f} ms after the click)")
    return " ".join(parts)


def ran_length_notice(trace: dict, asked: int) -> str:
    """The answer length a run of the ``trace`` going decodes where a block model runs on past the
    length ``asked``, to the end of the answer's last block; "" where it does not. (A canvas model's
    whole canvases are said before the run: ``canvas_notice``.)"""
    ran = trace["gen_length"]
    if ran == asked or is_canvas_model(trace.get("model") or {}):
        return ""
    return (f"This run decodes {ran} positions: a block model runs on to the end of the answer's last block "
            f"(the length control is left as it is).")


def forward_part(trace: dict) -> str:
    """" · forward: compiled": the mode the run's forwards ran in; "" for a trace that does not say
    (written before the forward runner, when every forward ran eager)."""
    mode = (trace.get("stats") or {}).get("forward_mode")
    return f" · forward: {mode}" if mode else ""


def forward_notice_line(trace: dict) -> str:
    """Why the run's forwards did not run as its settings asked, when they did not (a fallback to
    eager, CUDA graphs skipped): never left unsaid. "" when they ran as asked."""
    stats = trace.get("stats") or {}
    notice = stats.get("forward_notice")
    if not notice:
        return ""
    asked = (trace.get("settings") or {}).get("forward_mode", "auto")
    return f"⚠ **Forward mode {asked} asked, {stats.get('forward_mode', 'eager')} ran:** {str(notice).rstrip('.')}."


def work_line(trace: dict) -> str:
    """The steps and forwards of a finished run, counted as the NFE card counts them: "6 steps",
    "6 steps, 10 forwards (6 main + 4 verifying)", "4 steps, 4 forwards + 4 guider forwards",
    "19 steps + 5 K/V store forwards"."""
    steps = trace.get("steps", [])
    st = trace.get("stats", {})
    # A step is one record of the trace with one main forward; a policy that verifies runs more.
    forwards = st.get("nfe", sum(int(s.get("forwards") or 0) for s in steps))
    guider = int(st.get("guider_forwards") or 0)
    work = count(len(steps), "step") if steps else count(forwards, "forward")  # a trace without its steps
    if steps and forwards != len(steps):
        work += f", {count(forwards, 'forward')} ({len(steps)} main + {forwards - len(steps)} verifying)"
    elif steps and guider:
        work += f", {count(forwards, 'forward')}"
    encoder = int(st.get("encoder_forwards") or 0)  # a canvas model's encoder passes, apart from its decoder's
    stores = int(st.get("store_forwards") or 0)  # a block-diffusion run's K/V writes, apart from NFE
    return work + (f" + {count(guider, 'guider forward')}" if guider else "") + (
        f" + {count(encoder, 'encoder forward')}" if encoder else "") + (
        f" + {count(stores, 'K/V store forward')}" if stores else "")


def _verdict_text(trace: dict, answer: str) -> str:
    """" — ✓ valid" and the like, when the prompt is one of the tiny task suite's; a stopped
    run's answer is unfinished and not graded."""
    judged = verdict(prompt_of(trace) or "", answer)
    if judged is None:
        return ""
    if (trace.get("stats") or {}).get("stopped"):
        return " — not graded: the run was stopped before its end"
    mark = "✓" if judged in ("right", "valid") else "✗"
    return f" — {mark} **{judged}**"
