"""Checking a value that comes from outside (a knob, a count), one rule for all of them: text is
parsed as the type asked for, bools never pass as numbers, numbers are finite, and a refusal
names the value's place and its rule. Settings, the policy registry and the task suite use it."""
from __future__ import annotations

import math
from typing import Any, Callable

from .errors import SettingsError

TYPE_WORDS = {int: "an integer", float: "a number", str: "text", bool: "true or false"}


def check_value(value: Any, kind: type, where: str, rule: str, ok: Callable[[Any], bool] = lambda v: True) -> Any:
    """``value`` as ``kind`` (text parsed; bools never pass as numbers; numbers finite), checked by ``ok``."""
    bad = SettingsError(f"{where} must be {rule}, not {value!r}")
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        try:
            value = _parse(text, kind)
        except (KeyError, ValueError, OverflowError):
            typed = rule if rule.startswith(("a ", "an ", "true")) else f"{TYPE_WORDS[kind]} {rule}"
            raise SettingsError(f"{where} must be {typed}, not {value!r}") from None
    if kind is bool:
        if not isinstance(value, bool):
            raise bad
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            raise bad
        value = int(value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad
        value = float(value)
    elif not isinstance(value, kind):
        raise bad
    if not ok(value):
        raise bad
    return value


def _parse(text: str, kind: type) -> Any:
    """Text typed for a knob as ``kind``; raises KeyError, ValueError or OverflowError."""
    if kind is bool:
        return {"true": True, "false": False}[text]
    if kind is int and float(text).is_integer():
        return int(float(text))  # "3" and "3.0" alike
    return kind(text)
