"""Errors a user can hit, each naming the problem in words rather than a deep stack trace."""
from __future__ import annotations

import re
from typing import Any


class DllmError(Exception):
    """Base class: everything the engine raises on purpose."""


class ModelLoadError(DllmError):
    """A model could not be found, read or placed where it was asked to go."""


class SettingsError(DllmError, ValueError):
    """A decoding setting is out of range; the message names the knob."""


class SequenceTooLongError(DllmError, ValueError):
    """Prompt plus generation would exceed the model's maximum sequence length."""


class BusyError(DllmError):
    """A run is already going; runs are never mixed."""


class OutOfMemory(DllmError):
    """The device ran out of memory; the cache was freed."""


class EngineError(DllmError):
    """The engine process ended unexpectedly (it is started again on the next request)."""


class DecodingError(DllmError):
    """A run broke the decoding loop's hard bound on forwards (a policy stopped committing)."""


class TraceError(DllmError, ValueError):
    """An imported trace is not one this build can show; the message names the first bad field."""


_NOTHING = object()


def schema_message(exc, data: Any = _NOTHING, subject: str = "the file", limit: int = 3) -> str:
    """A schema's failures (a pydantic ``ValidationError``) in words: each wrong field's path as
    the data spells it (``steps[3].revoked[0]``), the rule it breaks and the value it has; the
    first ``limit`` fields. With ``data`` (the input), a union's branch names are left out of paths."""
    rules: dict[str, list[str]] = {}
    quoted: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        where = _path(error["loc"], data, error["type"] == "missing") or subject
        if where not in rules and any(found.startswith(where) for found in rules):
            continue  # a union's other branch, failing on the whole of what a deeper path names
        if where not in rules and len(rules) == limit:
            break
        rule = _rule(error)
        if rule not in rules.setdefault(where, []):
            rules[where].append(rule)
        if error["type"] not in ("missing", "extra_forbidden", "unexpected_keyword_argument") and _telling(error["input"]):
            quoted.setdefault(where, f" (not {shown(error['input'])})")
    return "; ".join(f"{where} {_either(found)}{quoted.get(where, '')}" for where, found in rules.items())


def _path(loc: tuple, data: Any, missing: bool) -> str:
    if data is _NOTHING:
        return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in loc).lstrip(".")
    path, node = "", data
    for i, key in enumerate(loc):
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            path, node = f"{path}[{key}]", node[key]
        elif isinstance(node, dict) and (key in node or (missing and i == len(loc) - 1)):
            path, node = f"{path}.{key}" if path else str(key), node.get(key)
        # else: the name of a union's branch, not a place in the data
    return path


def _rule(error: dict) -> str:
    if error["type"] == "missing":
        return "is missing"
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return "is not a known field"
    rule = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    rule = re.sub(r"^(Input|List|String|Dictionary|Value|Tuple|Set) should ", "must ", rule).replace(" after validation", "")
    return rule[:1].lower() + rule[1:]


def _either(rules: list[str]) -> str:
    """One field's rules: a union's branches as "must be a, b or c"."""
    if len(rules) > 1 and all(rule.startswith("must be ") for rule in rules):
        kinds = [rule.removeprefix("must be ") for rule in rules]
        return "must be " + ", ".join(kinds[:-1]) + " or " + kinds[-1]
    return "; ".join(rules)


def _telling(value: Any) -> bool:
    """A value worth quoting: a scalar or a short list of them (not an object or a long list)."""
    if isinstance(value, list):
        return len(value) <= 4 and not any(isinstance(item, (list, dict)) for item in value)
    return not isinstance(value, dict)


def shown(value: Any, limit: int = 40) -> str:
    """A value quoted in a message, cut to ``limit`` characters: a message never repeats a 100 kB input."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
