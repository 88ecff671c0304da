"""A verdict: a teaching claim checked on a run, "holds", "does not hold" or "not measurable in
this run", with the numbers behind it (``verdicts`` and each room's lessons make them)."""
from __future__ import annotations

from dataclasses import dataclass, field

HOLDS, FAILS, UNMEASURABLE = "holds", "does not hold", "not measurable in this run"
STATUS = {True: HOLDS, False: FAILS, None: UNMEASURABLE}  # a claim's status from whether it holds (None: unmeasurable)


@dataclass(frozen=True)
class Verdict:
    lesson: str  # which claim: "theorem1", "kv_reuse", "cache_saves", "answer", "verification"
    claim: str  # the sentence checked, e.g. "The cache saves recomputation"
    status: str  # HOLDS, FAILS or UNMEASURABLE
    detail: str  # the numbers behind the status, in words
    numbers: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The page's line: "claim: status — detail"."""
        return f"{self.claim}: {self.status} — {self.detail}"
