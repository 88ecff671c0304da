"""What a policy adds to the token grid: the drafts self-verify sent back, the guider's line, and
for Flash-dLLM as released the sliding window, the drafts its verify forward accepted and the
positions left masked after the end of text. Pure functions of the trace dict, HTML pieces out."""
from __future__ import annotations

from ..parts.replay import Trace, prompt_len
from ..parts.trace_parts import block_span

# The sliding window: a purple bar under each box it scored (a masked one also turns lavender),
# drawn outside the box so that it shows under every step colour and beside the commit outline.
# No other mark of the grid is a bar or purple.
WINDOW_COLOUR = "#6a3d9a"
WINDOW_MASKED = "background-color:#e4d8f1;"
ACCEPTED_MARK = ('<b class="dl-accepted-mark" style="background:#1a7f37;color:#fff;border-radius:7px;'
                 'font-size:12px;padding:0 3px;margin-left:2px;">✓</b>')


def window_bar(other_shadow: str = "") -> str:
    """The window's bar under a box, kept with another shadow the box has (the what-if frame)."""
    return f"box-shadow:{other_shadow + ', ' if other_shadow else ''}0 8px 0 -1px {WINDOW_COLOUR};margin-bottom:10px;"


def sent_back(trace: Trace, upto: int) -> dict[int, list[tuple[int, int, float]]]:
    """Per answer position, the drafts self-verify sent back to mask up to step ``upto``:
    (step, token, conflict score), read from the steps' ``policy.rejected_at``."""
    P, found = prompt_len(trace), {}
    for index, record in enumerate((trace.get("steps") or [])[: max(0, upto + 1)]):
        for position, token, score in (record.get("policy") or {}).get("rejected_at") or []:
            found.setdefault(int(position) - P, []).append((index, int(token), float(score)))
    return found


def guider_line(trace: Trace, record: dict, shown: int) -> str:
    """What the guider accepted at the step shown (guided decoding's ``policy.guider_accepted``)."""
    accepted = (record.get("policy") or {}).get("guider_accepted")
    if accepted is None:
        return ""
    committed = len(record.get("committed") or [])
    block = block_span(trace, int(record.get("block") or 0))
    drafted = sum(int(p) in block for p in record.get("masked_positions") or [])
    of = f" of the {drafted} drafted" if drafted else ""
    told = (f"the guider agreed with the first {accepted}{of} token(s); {committed} committed"
            if accepted else "the guider rejected the first drafted token; it is committed anyway")
    return (f'<div class="dl-guider-line" data-accepted="{accepted}" style="font-size:16px;color:#1a4f8a;">'
            f"Step {shown}: {told}.</div>")


# ----------------------------------------------------------------------------- Flash-dLLM as released

def window(trace: Trace, record: dict) -> set[int] | None:
    """The answer positions the sliding window scored at this step (the cache policy's
    ``policy.window``, absolute positions); None for a run without a sliding window."""
    found = (record.get("policy") or {}).get("window")
    if found is None:
        return None
    P = prompt_len(trace)
    return {int(p) - P for p in found}


def accepted(trace: Trace, record: dict) -> dict[int, float]:
    """Answer position -> P(draft | masked) of each draft the verify forward accepted this step
    (Flash-Verify's ``policy.accepted_at``)."""
    P = prompt_len(trace)
    return {int(p) - P: float(q) for p, _, q in (record.get("policy") or {}).get("accepted_at") or []}


def masked_tail(trace: Trace, record: dict, ids: list[int | None]) -> tuple[int, int] | None:
    """(start, stop) of the masked positions that end the answer after its first committed end of
    text, in a sliding-window run: Flash-dLLM as released ends the answer there and decodes none
    of them (the finished answer holds end of text). The engine says where (``policy.length`` of
    the step ``record``, after its commits). None when there is no such run."""
    end = (record.get("policy") or {}).get("length")
    if end is None:
        return None
    end = max(0, end - prompt_len(trace))  # an end inside the prompt: the whole answer may be the tail
    start = len(ids)
    while start > end and ids[start - 1] is None:
        start -= 1
    return (start, len(ids)) if start < len(ids) else None


def tail_chip(start: int, stop: int, in_window: int, box: str) -> str:
    """The summary chip of a masked tail; a purple bar when the window reaches into it."""
    reach = f"; the window scored {in_window} of them this step" if in_window else ""
    title = ("still masked after the first end of text: the released Flash-dLLM ends the answer at the end of "
             f"text it commits and decodes nothing after it{reach}")
    return (f'<summary class="dl-pad-chip dl-tail{" dl-window" if in_window else ""}" title="{title}" '
            # Its long label wraps inside the grid, as the end-of-text chip's does.
            f'style="{box}display:inline-block;white-space:normal;max-width:95%;background:#ececec;color:#555;'
            'cursor:pointer;'
            f'{window_bar() if in_window else ""}">× {stop - start} masked after the end of text '
            f"(pos {start}–{stop - 1})</summary>")


def window_legend(positions: set[int], accepted_here: dict[int, float], swatch: str) -> str:
    """The legend's words for the window and the accepted drafts (empty for another run)."""
    words = (f' · <span style="{swatch}{WINDOW_MASKED}border-bottom:5px solid {WINDOW_COLOUR};"></span>'
             f"<b>sliding window</b>: the {len(positions)} position{'' if len(positions) == 1 else 's'} Flash-Cache "
             "scored this step, wherever they lie (not a fixed block)")
    if accepted_here:
        words += f" · {ACCEPTED_MARK} accepted by the verify forward this step"
    return words
