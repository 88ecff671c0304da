"""The field types of every value from outside, in two families (pydantic). Values typed in (a
knob, a policy parameter, a count) go through ``integer``, ``number``, ``FLAG``, ``WORD``: text is
parsed as the type asked for (Compare's changes box, a command-line flag), true and false never
pass as numbers, numbers are finite and within their declared bounds, and a refusal is a
SettingsError naming the value's place and the rule it breaks. Files go through ``Count``,
``Number``, ``Flag``, ``Text``: strict (a bool is not a number, text is not parsed), so a file reads
back as it was written; their schemas live beside what they describe (``trace.py``,
``experiments/units.py``, ``experiments/reports.py``, ``ui/parts/presets.py``)."""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, Strict, StrictBool, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from .errors import SettingsError, schema_message

TYPE_WORDS = {int: "an integer", float: "a number", str: "text", bool: "true or false"}
MAX_TEXT = 2**20  # characters in one text field of a file (an answer, a prompt, a token's text, a name)


def _plain_number(value: Any) -> Any:
    """True is 1 to Python: as a length or a threshold it is a mistake, told as one. Infinite and
    NaN, given as numbers or as text, are told as such before any bound is compared."""
    if isinstance(value, bool):
        raise PydanticCustomError("number_type", "must be a number")
    try:
        finite = math.isfinite(float(value.strip()) if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        return value  # not a number: the type's own check says so
    if not finite:
        raise PydanticCustomError("finite_number", "must be a finite number")
    return value


def unicode_text(value: Any) -> Any:
    """Text that can be written back out: JSON's ``"\\ud800"`` reads as a lone surrogate, which no
    UTF-8 file, page or tokenizer takes, so it is refused where it comes in, not where it is shown."""
    try:
        if isinstance(value, str):
            value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError("unicode", "must be valid Unicode text (a lone surrogate at character {at})",
                                  {"at": exc.start}) from None
    return value


def _flag_words(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _none_words(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() in ("", "none", "null") else value


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> dict:
    return {"gt" if low_open else "ge": low, "lt" if high_open else "le": high}


def integer(low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False) -> Any:
    """An integer in its bounds; integral floats (a slider's 32.0) and integer text ("32") pass."""
    return Annotated[int, BeforeValidator(_plain_number), Field(**_bounds(low, high, low_open, high_open))]


def number(low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = False) -> Any:
    """A finite number in its bounds; number text ("0.9") passes."""
    return Annotated[float, BeforeValidator(_plain_number),
                     Field(allow_inf_nan=False, **_bounds(low, high, low_open, high_open))]


FLAG = Annotated[bool, BeforeValidator(_flag_words), Strict()]  # true/false, or that text
WORD = Annotated[str, Strict(), BeforeValidator(unicode_text)]

# A file's fields: strict, so what was written is what is read.
Count = Annotated[int, Strict(), Field(ge=0)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Flag = StrictBool
Text = Annotated[str, Strict(), Field(max_length=MAX_TEXT), BeforeValidator(unicode_text)]


def about(kind: Any, label: str, help_: str, top: float | None = None) -> Any:
    """``kind`` with the label and help text its knob shows on the command line and the page, and
    ``top``: where the page's slider ends when the bound is past what a slider shows well."""
    return Annotated[kind, Field(title=label, description=help_, json_schema_extra={"top": top})]


def one_of(choices: tuple) -> Any:
    return Literal[choices]


def optional(kind: Any) -> Any:
    """``kind`` or None ("none" and "" as text)."""
    return Annotated[kind | None, BeforeValidator(_none_words)]


def read(schema: TypeAdapter, value: Any, place: str = "the value", owner: str = "") -> Any:
    """``value`` read through ``schema``; else a SettingsError naming the field (``place`` for the
    value itself) and its rule, after "``owner``: " when given."""
    try:
        return schema.validate_python(value)
    except ValidationError as exc:
        raise SettingsError(f"{owner}: " * bool(owner) + schema_message(exc, value, subject=place)) from None
