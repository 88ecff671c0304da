"""The token grid's names for tokens and its ends of text: a distinct name for each stop token
that still reads as an end of text, and the runs of end-of-text boxes folded into one chip, split
so that nothing that happened at the step shown is hidden inside a chip; and the boxes' look (box,
colour scales, swatch) that the masked-model grid (``grid``) and the canvas grid (``canvas_views``) share."""
from __future__ import annotations

import html
from collections.abc import Callable
import re

from ..parts.replay import Trace, is_end_token, token_text, visible

_SPECIAL_TOKEN = re.compile(r"\s*<\|([^|]*)\|>\s*")
_BRACKETED = re.compile(r"\s*<([^<>]+)>\s*")  # </s>, <eos>, <pad>
# A stop token's name that already says "end" (end of text, of turn, of sequence; padding).
_READS_AS_END = ("end", "eot", "eos", "pad", "/s")


def token_label(trace: Trace, token: int | None) -> str:
    """A token as the grid shows it: a special token ``<|name|>`` as ``⟨name⟩``, whitespace made
    visible; a special token is never shown raw. Each end of text keeps a name of its own (LLaDA's
    ``<|eot_id|>`` and ``<|endoftext|>`` are ``⟨eot_id⟩`` and ``⟨endoftext⟩``, not one marker), and
    a stop token whose name does not say so is called ``⟨end NAME⟩``."""
    text = token_text(trace, token)
    special = _SPECIAL_TOKEN.fullmatch(text)
    if is_end_token(trace, token):
        bracketed = _BRACKETED.fullmatch(text)
        name = special.group(1) if special else bracketed.group(1) if bracketed else visible(text.strip())
        return f"⟨{name}⟩" if any(w in name.lower() for w in _READS_AS_END) else f"⟨end {name}⟩"
    return f"⟨{special.group(1)}⟩" if special else visible(text)


# A run of end-of-text tokens collapses into one chip when at least this long.
COLLAPSE_PADDING = 4


def end_runs(trace: Trace, ids: list[int | None], eventful: set[int], new: set[int]) -> list[tuple[int, int, bool]]:
    """(start, stop, committed this step) of every run of at least COLLAPSE_PADDING end-of-text
    tokens that may fold into one chip. A position with an event of its own (a revision, a draft
    sent back, a what-if frame, a token a branch forced) is in no run, so it stays a box of its own;
    a run holds either this step's commits or earlier ones, never both, so a chip can say which it folds."""
    runs, start, kind = [], None, None
    for p, token in enumerate([*ids, None]):
        key = None if p >= len(ids) or p in eventful or not is_end_token(trace, token) else p in new
        if key != kind or key is None:
            if start is not None and p - start >= COLLAPSE_PADDING:
                runs.append((start, p, bool(kind)))
            start, kind = (p, key) if key is not None else (None, None)
    return runs


def fold_end_runs(trace: Trace, ids: list[int | None], boxes: list[str], runs: list[tuple[int, int, bool]],
                  box_style: str, commit_outline: str, bar: Callable[[int, int], str]) -> None:
    """Replace each run's boxes by a ``<details>`` whose chip counts them, names the end tokens it
    holds and, for this step's commits, carries their outline and says so; the boxes stay inside,
    shown when the chip is opened. ``bar(start, stop)`` is the chip's window bar (Flash-dLLM) or ""."""
    for start, stop, new in reversed(runs):  # from the end, so earlier indices stay valid
        names: dict[str, int] = {}
        for token in ids[start:stop]:
            label = token_label(trace, token)
            names[label] = names.get(label, 0) + 1
        which = (next(iter(names)) if len(names) == 1
                 else ", ".join(f"{count} {label}" for label, count in names.items()))
        when = " committed this step" if new else ""
        title = (f"{stop - start} end-of-text tokens{when} at answer positions {start}–{stop - 1} ({which}); "
                 "click to show them one by one")
        chip = (f'<summary class="dl-pad-chip{" dl-new" if new else ""}" data-from="{start}" data-to="{stop - 1}" '
                f'data-new="{stop - start if new else 0}" title="{html.escape(title)}" style="{box_style}'
                f'display:inline-block;white-space:normal;max-width:95%;background:#f0f0f0;color:#333;'
                f'{commit_outline if new else ""}'
                f'{bar(start, stop)}">× {stop - start} end of text{when}: {html.escape(which)} '
                f"(pos {start}–{stop - 1})</summary>")
        boxes[start:stop] = [f'<details class="dl-pad" style="display:inline;">{chip}{"".join(boxes[start:stop])}'
                             "</details>"]


def attr(text: str) -> str:
    """Escape for a double-quoted attribute; apostrophes stay readable in the hover text."""
    return html.escape(text, quote=False).replace('"', "&quot;")


def interp(stops: list[tuple[int, int, int]], t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = stops[i], stops[i + 1]
    return tuple(round(a[k] + (b[k] - a[k]) * f) for k in range(3))  # type: ignore[return-value]


# Light -> dark blue for "when" (sequential), red -> yellow -> green for "how sure".
STEP_STOPS = [(222, 235, 247), (158, 202, 225), (66, 146, 198), (8, 81, 156), (8, 48, 107)]
CONF_STOPS = [(215, 48, 39), (252, 141, 89), (254, 224, 139), (145, 207, 96), (26, 152, 80)]


def css(rgb: tuple[int, int, int]) -> str:
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def text_colour(rgb: tuple[int, int, int]) -> str:
    luminance = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return "#fff" if luminance < 140 else "#111"


# Every box is a button for the side panel: data-pos names its answer position.
BOX = ("display:inline-flex;flex-direction:column;align-items:center;margin:2px;padding:1px 5px;border-radius:4px;"
       "font-family:ui-monospace,monospace;font-size:18px;white-space:pre;min-width:1.6em;vertical-align:top;cursor:pointer;")
POS = '<span class="dl-pos" style="font-size:14px;opacity:0.85;line-height:1.1;color:inherit;">{}</span>'
# A masked box (and a canvas position not started): ink dark enough that its position number, faded
# by POS's opacity, still reads at 4.5:1 on the grey (WCAG 1.4.3; #777 gave 2.8:1).
MASKED = "background:#e5e5e5;color:#4d4d4d;"
SWATCH = "display:inline-block;width:1.1em;height:0.9em;border-radius:3px;vertical-align:middle;margin:0 3px;"
