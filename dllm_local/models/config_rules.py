"""What a model folder's config must hold before anything is built from it: each family's rules
(``FamilySpec.rules``, declared in the family's own file), made of the shared ones here.

A family's ``ConfigRules`` gives each key it reads a rule (a whole number or a finite number in
bounds; a dotted key reaches into a nested config, ``text_config.top_k_experts``) and, for what
relates keys (experts routed per token within the experts, expert groups), a check function
built from ``routed`` and ``grouped``. A value is the file's, else the config class's default
(what the model would be built with). A broken rule is a ModelLoadError naming the file, the key,
its value and the rule: a config of 0 experts per token, or of more than its experts, would
otherwise build and fail inside the first forward (or decode silently wrong).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from ..errors import ModelLoadError, shown

# Bounds past any real model's: a vocabulary (262,144 at most today) or a width; the layers and
# experts a config may ask for (each is a module: a million of them is a load that never ends).
MAX_SIZE = 2**24
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
_ABSENT = object()


@dataclass(frozen=True)
class Whole:
    """A whole number (not a bool, not 4.0) in ``[low, high]``; ``optional``: null too (the class's
    meaning of none, e.g. a dense model's experts)."""

    low: int = 1
    high: int = MAX_SIZE
    optional: bool = False

    def broken(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if type(value) is not int or not self.low <= value <= self.high:
            return f"must be a whole number from {self.low:,} to {self.high:,}{' (or null)' * self.optional}"
        return None


@dataclass(frozen=True)
class Real:
    """A finite number in its bounds (``low_open``: above ``low``, not at it)."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    optional: bool = False

    def broken(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        number = float(value) if type(value) is float or (type(value) is int and abs(value) < 2**1000) else math.nan
        if math.isfinite(number) and number <= self.high and (number > self.low if self.low_open else number >= self.low):
            return None
        low = f"above {self.low:g}" if self.low_open else f"at least {self.low:g}" if self.low > -math.inf else ""
        high = f"at most {self.high:g}" if self.high < math.inf else ""
        return "must be a finite number" + (" " if low or high else "") + " and ".join(p for p in (low, high) if p)


class Values:
    """A config's values as the model will see them, for a family's check function: each read
    once its key's rule holds (``ConfigRules.keys``)."""

    def __init__(self, raw: dict, defaults: dict, file: Path) -> None:
        self.raw, self.defaults, self.file = raw, defaults, file

    def __getitem__(self, key: str) -> Any:
        value = _at(self.raw, key)
        return _at(self.defaults, key) if value is _ABSENT else value

    def refuse(self, key: str, rule: str) -> NoReturn:
        raise ModelLoadError(f"{self.file}: {key} {shown(self[key])} {rule}")


@dataclass(frozen=True)
class ConfigRules:
    """A family's rules: its keys' rules, then ``check`` (relations between keys, on ``Values``)."""

    keys: Mapping[str, Whole | Real] = field(default_factory=dict)
    check: Callable[[Values], None] | None = None

    def enforce(self, raw: dict, config_class: type, config_file: Path) -> None:
        """``raw`` (config.json's object) against these rules, its absent keys at ``config_class``'s
        defaults, before the config class or any module is built from it."""
        values = Values(raw, _defaults(config_class), config_file)
        for key, rule in self.keys.items():
            value = values[key]
            broken = None if value is _ABSENT else rule.broken(value)
            if broken:
                values.refuse(key, broken)
        if self.check is not None:
            self.check(values)


def _at(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return _ABSENT
        data = data[part]
    return data


@cache
def _defaults(config_class: type) -> dict:
    return config_class().to_dict()


def routed(values: Values, experts: str, per_token: str) -> None:
    """Each position is routed to ``per_token`` of the ``experts`` (none: a dense model, no rule)."""
    total, count = values[experts], values[per_token]
    if total and not (type(count) is int and 1 <= count <= total):
        values.refuse(per_token, f"must be from 1 to {experts} ({total}): a position is routed to that many of them")


def grouped(values: Values, experts: str, per_token: str, groups: str, chosen: str) -> None:
    """Experts in ``groups`` equal groups, each position choosing its experts within the best
    ``chosen`` groups by each group's two best scores (LLaDA2's router, DeepSeek-V3's)."""
    total, count = values[experts], values[groups]
    if not total:
        return
    if total % count or total // count < 2:
        values.refuse(groups, f"must divide {experts} ({total}) into groups of two or more experts")
    if not 1 <= values[chosen] <= count:
        values.refuse(chosen, f"must be from 1 to {groups} ({count}): the groups a position's experts come from")
    room = values[chosen] * (total // count)
    if values[per_token] > room:
        values.refuse(per_token, f"must be at most the experts of {chosen} groups ({room}): a position's experts "
                                 "come from those groups")


# The sizes and numbers of a Qwen2-style config.json (Dream, SDAR, Fast-dLLM v2, LLaDA2, LLaDA-MoE).
QWEN2_KEYS: Mapping[str, Whole | Real] = {
    "vocab_size": Whole(), "hidden_size": Whole(), "num_hidden_layers": Whole(high=MAX_LAYERS),
    "num_attention_heads": Whole(), "num_key_value_heads": Whole(optional=True), "max_position_embeddings": Whole(),
    "rms_norm_eps": Real(0, 1, low_open=True), "rope_theta": Real(0, low_open=True),
}
