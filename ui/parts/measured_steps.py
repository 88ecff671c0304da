"""The cost panel's measured steps: this run's median step times, and on a CUDA GPU each against
the roofline floor of the loaded model on that GPU's device profile (``costmodel``): how far the
run is from what its weights and arithmetic allow. A pure function of the trace."""
from __future__ import annotations

import html
import re
import statistics
from typing import Any

from dllm_local.analysis.costmodel import TargetModel
from dllm_local.devices import DEVICES, DeviceProfile

from .replay import Trace
from .trace_parts import mapping, read_number

STYLE = 'style="font-size:15px;color:#333;"'
HEAD_STYLE = 'style="font-size:15px;color:#333;margin-top:12px;"'  # set apart from the projection above


def gpu_profile(gpu_name: str) -> DeviceProfile | None:
    """The device profile named in ``gpu_name`` ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"),
    as a whole word, so that "L40S" is not taken for "L4"; None when no profile is named."""
    for key in sorted(DEVICES, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", gpu_name, re.IGNORECASE):
            return DEVICES[key]
    return None


def _one_forward(step: Any) -> tuple[bool, int, float] | None:
    """(full refresh, G, model_ms) of a step whose time is one forward of the model and nothing
    else: not the prefill (step 0), no verifying, guider or K/V store forward beside it; else None."""
    if not isinstance(step, dict) or step.get("stored") is not None:
        return None
    g, ms = read_number(step.get("g"), int), read_number(step.get("model_ms"), float)
    alone = (read_number(step.get("step"), int) not in (None, 0) and read_number(step.get("forwards"), int) == 1
             and not read_number(step.get("guider_forwards"), int))
    return (bool(step.get("full_refresh")), g, ms) if alone and g and g > 0 and ms and ms > 0 else None


def measured_rows(trace: Trace) -> list[dict]:
    """Per kind of step ("cached", then "full refresh"), over the steps that are one forward alone:
    how many, their median G and their median ``model_ms``. A kind the run has none of is left out."""
    steps = [alone for alone in map(_one_forward, trace.get("steps") or []) if alone is not None]
    rows = []
    for kind, full in (("cached", False), ("full refresh", True)):
        chosen = [(g, ms) for refresh, g, ms in steps if refresh is full]
        if chosen:
            rows.append({"kind": kind, "n": len(chosen), "g": statistics.median(g for g, _ in chosen),
                         "ms": statistics.median(ms for _, ms in chosen)})
    return rows


def loaded_model(model: dict) -> TargetModel | None:
    """The loaded model as the cost model counts it, from its info: the bytes a forward reads and
    the parameters its arithmetic uses; None when the trace does not record them."""
    read_mb = read_number(model.get("weight_read_mb"), float)
    # A trace written before the info had ``arithmetic_parameters``: all of them, the input embedding too.
    params = read_number(model.get("arithmetic_parameters"), int) or read_number(model.get("parameters"), int)
    if not read_mb or read_mb <= 0 or not params or params <= 0:
        return None
    return TargetModel(str(model.get("name", "the loaded model")), float(params), read_mb * 2**20)


def _duration(ms: float) -> str:
    return f"{ms:.2f} ms" if ms >= 1 else f"{ms * 1e3:.1f} µs"


def _ratio(ratio: float) -> str:
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


def _floor_unknown(gpu_name: Any, profile: DeviceProfile | None, target: TargetModel | None) -> str:
    """Why a CUDA run's steps get no floor ("" when they get one)."""
    if not isinstance(gpu_name, str):
        return "the trace does not name its GPU"
    if profile is None:
        return f"no device profile matches {gpu_name} (profiles: {', '.join(DEVICES)})"
    return "" if target is not None else "the trace does not record the model's size"


def measured_steps_html(trace: Trace) -> str:
    """The run's median step times (cached steps, full refreshes) beside the roofline: on a CUDA
    GPU whose name matches a device profile, each with its floor and "× floor"; on another GPU,
    the floor said to be unknown, and why; on the CPU, the times said to be CPU times, with no floor."""
    model, stats = mapping(trace.get("model")), mapping(trace.get("stats"))
    rows = measured_rows(trace)
    if not rows:
        return (f"<div {HEAD_STYLE}>No step of this run is a forward of the model alone (each has a verifying, guider "
                f"or K/V store forward beside it, or the trace keeps no steps): no measured step to show.</div>")
    device, gpu_name, mode = str(model.get("device", "")), model.get("gpu_name"), stats.get("forward_mode")
    ran = f" (forward: {html.escape(str(mode))})" if mode else ""
    target = loaded_model(model)
    profile = gpu_profile(gpu_name) if isinstance(gpu_name, str) else None
    unknown = _floor_unknown(gpu_name, profile, target)
    on_gpu = device.startswith("cuda")
    floor_on = profile if on_gpu and not unknown else None  # the profile the steps are held to, if any
    if not on_gpu:
        head = (f"<b>Measured steps: CPU times</b>{ran}. This run ran on "
                f"{html.escape(device or 'a device the trace does not name')}, not a GPU: the roofline above is a GPU "
                f"projection, so these times get no × floor.")
    elif floor_on is None:
        head = (f"<b>Measured steps on {html.escape(str(gpu_name or device))}</b>{ran}: the floor is unknown for this "
                f"GPU: {html.escape(unknown)}.")
    else:
        head = (f"<b>Measured steps on {html.escape(gpu_name)}</b>{ran}, each against the floor of "
                f"{html.escape(target.name)} itself ({target.params / 1e6:,.1f} M parameters, "
                f"{target.weight_bytes / 2**20:,.1f} MB read a forward) on the {html.escape(floor_on.name)} "
                f"profile: max(weight read / bandwidth, G × 2 × params / FLOP rate).")
    # A mixture of experts' floor counts every expert, read and computed: above a routed forward's own.
    at_least = "≥ " if floor_on is not None and read_number(model.get("experts"), int) else ""
    if at_least:
        head += (" A mixture of experts: the floor counts every expert, read and computed, more than a forward "
                 "that routes its tokens to a few needs, so the true × floor is at least the one shown.")
    batch = read_number(stats.get("batch_size"), int) or 1
    if batch > 1:
        head += (f" Some of its forwards were packed with other requests' (up to {batch} together): such a step's "
                 f"time is the whole packed forward's.")
    cells = "<th>steps (one forward each)</th><th>median G</th><th>measured (median)</th>" + (
        "<th>floor</th><th>× floor</th>" if floor_on is not None else "")
    body = ""
    for row in rows:
        body += f"<tr><td>{row['kind']} ({row['n']})</td><td>{row['g']:g}</td><td>{_duration(row['ms'])}</td>"
        if floor_on is not None:
            floor_ms = target.floor_s(row["g"], floor_on) * 1e3
            body += f"<td>{_duration(floor_ms)}</td><td><b>{at_least}{_ratio(row['ms'] / floor_ms)}</b></td>"
        body += "</tr>"
    return (f'<div class="dl-measured" {HEAD_STYLE}>{head}</div>'
            f'<table class="dl-cost dl-measured-steps" {STYLE}><tr>{cells}</tr>{body}</table>')
