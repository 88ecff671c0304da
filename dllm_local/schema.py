"""The field types the project's file schemas share (pydantic): counts, finite numbers, flags and
bounded text, each strict (a bool is not a number, text is not parsed), so a file reads back as it
was written. The schemas themselves live beside what they describe: ``trace.py`` (trace files),
``experiments/units.py`` (results-file records), ``experiments/reports.py`` (added results),
``ui/presets.py`` (presets)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict, StrictBool

MAX_TEXT = 2**20  # characters in one text field (an answer, a prompt, a token's text, a name)

Count = Annotated[int, Strict(), Field(ge=0)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Flag = StrictBool
Text = Annotated[str, Strict(), Field(max_length=MAX_TEXT)]
