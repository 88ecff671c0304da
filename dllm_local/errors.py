"""Errors a user can hit, each naming the problem in words rather than a deep stack trace."""
from __future__ import annotations

import re
from typing import Any


MAX_MESSAGE = 2000  # characters: a message is read, not scrolled (a 10,000-key file is named, not listed)


class DllmError(Exception):
    """Base class: everything the engine raises on purpose. Its message is cut to MAX_MESSAGE
    characters, whatever went into it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(bounded(args[0]) if isinstance(args[0], str) else args[0], *args[1:]) if args else ())


def bounded(message: str) -> str:
    """``message`` cut to MAX_MESSAGE characters, saying how much was left out."""
    if len(message) <= MAX_MESSAGE:
        return message
    return f"{message[:MAX_MESSAGE - 40]}… ({len(message) - MAX_MESSAGE + 40:,} more characters)"


class ModelLoadError(DllmError):
    """A model could not be found, read or placed where it was asked to go."""


class SettingsError(DllmError, ValueError):
    """A decoding setting is out of range; the message names the knob."""


class SequenceTooLongError(DllmError, ValueError):
    """Prompt plus generation would exceed the model's maximum sequence length."""


NEVER_RAN = "Your queued request was cancelled before it started."


class NeverRanError(DllmError):
    """A request stopped while it waited in the engine's line: it never ran."""

    def __init__(self, message: str = NEVER_RAN) -> None:
        super().__init__(message)


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


def listed(items: Any, noun: str, limit: int = 5) -> str:
    """``items`` named in a message, at most ``limit`` of them, each cut to 40 characters, after
    their count and ``noun`` (singular): "1 unknown setting: a", "10,000 unknown settings, first: a, b, c, d, e"."""
    names = sorted(map(str, items))
    first = ", ".join(name if len(name) <= 40 else name[:39] + "…" for name in names[:limit])
    head = f"{len(names):,} {noun}{'s' * (len(names) != 1)}"
    return f"{head}, first: {first}" if len(names) > limit else f"{head}: {first}"


def shown(value: Any, limit: int = 40) -> str:
    """A value quoted in a message, cut to ``limit`` characters: a message never repeats a 100 kB input."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
