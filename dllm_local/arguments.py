"""argparse types for the project's command lines (app.py, the CLI, every ``bench/`` script): a value
outside its rule stops the command while it parses, with argparse's usage and a message naming the
flag and the rule, before any model loads. Each type also says which values it refuses
(``refused``), so one test can try them on every flag that uses it. A leaf: argparse and the
shared limits only."""
from __future__ import annotations

import argparse
import math

from .limits import MAX_GEN_LENGTH, MAX_SLOTS


def _span(low: float | None, high: float | None, low_open: bool = False) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}]" if low_open else f"in {low:g}..{high:g}"


class Count:
    """A whole number from ``least`` (to ``most``); ``what`` names it in the message and ``why``
    says where the bound comes from (said with the refusal, so the fix is in the message)."""

    def __init__(self, least: int = 1, most: int | None = None, what: str = "an integer", why: str = "") -> None:
        self.least, self.most, self.what, self.why = least, most, what, why
        self.__name__ = "count"  # argparse names a type in its own messages

    def __call__(self, text: str) -> int:
        value = text.strip()
        whole = value.lstrip("-").isdigit() and value.isascii()
        if not whole or int(value) < self.least or (self.most is not None and int(value) > self.most):
            raise argparse.ArgumentTypeError(f"must be {self.what} {_span(self.least, self.most)}"
                                             f"{f' ({self.why})' if self.why else ''}, not {text!r}")
        return int(value)

    @property
    def refused(self) -> tuple[str, ...]:
        """Values no flag of this type takes: text, nothing, a fraction, NaN, just past each bound."""
        past = (str(self.most + 1),) if self.most is not None else ()
        return ("abc", "", "1.5", "nan", "true", str(self.least - 1), *past)


class Number:
    """A finite number in its bounds (``low_open``: above ``low``, not at it)."""

    def __init__(self, low: float = 0.0, high: float | None = None, low_open: bool = False,
                 what: str = "a number") -> None:
        self.low, self.high, self.low_open, self.what = low, high, low_open, what
        self.__name__ = "number"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = math.isfinite(value) and (value > self.low if self.low_open else value >= self.low) and (
            self.high is None or value <= self.high)
        if not inside:
            raise argparse.ArgumentTypeError(f"must be {self.what} {_span(self.low, self.high, self.low_open)}, "
                                             f"not {text!r}")
        return value

    @property
    def refused(self) -> tuple[str, ...]:
        past = (str(self.high + 1),) if self.high is not None else ()
        return ("abc", "", "nan", "inf", "-inf", str(self.low if self.low_open else self.low - 1), *past)


class Counts:
    """Whole numbers joined by ``sep``, each a ``Count`` (``--batch-sizes 8,16``, ``--shapes 64/16``):
    a list of at least one (``size``: exactly that many; ``empty``: "" is the empty list, "none")."""

    def __init__(self, item: Count, sep: str = ",", size: int | None = None, empty: bool = False) -> None:
        self.item, self.sep, self.size, self.empty = item, sep, size, empty
        self.__name__ = "counts"

    def __call__(self, text: str) -> list[int]:
        if self.empty and not text.strip():
            return []
        try:
            values = [self.item(part) for part in text.split(self.sep)]
        except argparse.ArgumentTypeError:
            values = []
        if not values or (self.size is not None and len(values) != self.size):
            first = self.item.least
            example = self.sep.join(str(first + i) for i in range(self.size or 2))
            many = f"{self.size} " if self.size else ""
            raise argparse.ArgumentTypeError(
                f"must be {many}whole numbers joined by {self.sep!r} such as {example}, each "
                f"{_span(self.item.least, self.item.most)}{f' ({self.item.why})' if self.item.why else ''}"
                f"{' (empty: none)' if self.empty else ''}, not {text!r}")
        return values

    @property
    def refused(self) -> tuple[str, ...]:
        sep, least = self.sep, self.item.least
        whole = sep.join([str(least)] * (self.size or 1))
        too_many = (sep.join([str(least)] * (self.size + 1)),) if self.size else ()
        return (*(() if self.empty else ("",)), sep, f"{least}{sep}{sep}{least}", f"{least}{sep}abc", *too_many,
                *(whole.replace(str(least), bad, 1) for bad in self.item.refused if bad))


COUNT = Count()  # problems, runs, repeats, rounds, layers, threads: at least one
COUNT_LIST = Counts(COUNT)
LENGTH = Count(1, MAX_GEN_LENGTH, what="a length in tokens", why="the longest answer region")
LENGTH_LIST = Counts(LENGTH)
SECONDS = Number(0, low_open=True, what="a number of seconds")
SHARE = Number(0, 1, low_open=True, what="a share")  # of problems, a threshold
PORT = Count(1, 65535, what="a port number")
# Requests decoding at once in one batch (app.py --slots, --batch-size): the engine's own ceiling.
SLOT_COUNT = Count(1, MAX_SLOTS, what="a number of slots",
                   why=f"the engine's batch holds at most {MAX_SLOTS}, each slot a row of its preallocated KV cache")
SLOT_LIST = Counts(SLOT_COUNT)
