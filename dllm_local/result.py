"""A finished run, as the sampler and the canvas loop both return it: its trace, and the answer
and stats read from it."""
from __future__ import annotations

from dataclasses import dataclass

from .trace import Stats, Trace


@dataclass
class Result:
    trace: Trace

    @property
    def text(self) -> str:
        return self.trace.text

    @property
    def token_ids(self) -> list[int]:
        """The whole answer region, EOS padding included."""
        return self.trace.final_ids

    @property
    def stats(self) -> Stats:
        return self.trace.stats
