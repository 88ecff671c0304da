"""The experts panel beside the KV view, for a mixture of experts: per layer, how many distinct
experts the step's forward routed its tokens to, out of the layer's experts, and which (a strip of
one box per expert, and their ids as ranges). Trace in, HTML out; empty for a dense model."""
from __future__ import annotations

import html

from ..block.parts import experts_of, routed_at
from ..parts.replay import Trace

_ON, _OFF = "#3d6aa6", "#e3e3e3"
_BOX = ('<span title="expert {id}{how}" style="display:inline-block;width:7px;height:12px;margin:0 1px 1px 0;'
        'background:{colour};"></span>')


def ranges(ids: list[int]) -> str:
    """Ascending ids as runs: [0, 1, 2, 5, 7, 8] -> "0–2, 5, 7–8"."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def experts_html(trace: Trace, step: int | None = None) -> str:
    """The panel at ``step`` (None: the last step): one line per mixture layer; dense layers are
    absent from the trace and from the panel. Empty for a dense model or a trace without routing."""
    shape = experts_of(trace)
    steps = trace.get("steps") or []
    at = len(steps) - 1 if step is None else min(int(step), len(steps) - 1)
    routed = routed_at(trace, at)
    if shape is None or not routed:
        return ""
    total, per_token = shape
    tokens = int(steps[at].get("g") or 0)
    reach = f"; its {tokens} recomputed token(s) × {per_token} could reach {min(total, tokens * per_token)}" if tokens else ""
    lines = []
    for layer, ids in routed.items():
        chosen = set(ids)
        strip = "".join(_BOX.format(id=e, how=" (routed)" if e in chosen else "", colour=_ON if e in chosen else _OFF)
                        for e in range(total))
        name = html.escape(layer)  # a layer's name is any text in a trace's schema
        lines.append(f'<div class="dl-experts-layer" data-layer="{name}" data-distinct="{len(ids)}">'
                     f"<b>layer {name}</b>: {len(ids)} of {total} experts · {strip}<br>"
                     f'<span style="font-size:0.9em;color:#555;">{html.escape(ranges(ids))}</span></div>')
    head = (f"<b>Experts routed at step {at}</b> (distinct per layer; {per_token} of {total} routed per token"
            f"{reach})")
    return f'<div class="dl-experts" data-step="{at}" style="margin:0.4em 0;">{head}{"".join(lines)}</div>'
