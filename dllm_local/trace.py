"""The trace: one plain, serialisable record per model forward. The page is built only from it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class StepRecord:
    step: int
    block: int
    step_in_block: int
    full_refresh: bool
    g: int  # positions recomputed by the main forward
    reads: int  # cached K/V entries read instead of recomputed
    committed: list[list]  # [position, token id, confidence at commit]
    forwards: int  # main forward plus any verification forwards
    model_ms: float  # forwards of the diffusion model (and the guider), device-synchronised
    other_ms: float  # policies, sampling and trace bookkeeping
    masked_positions: list[int] = field(default_factory=list)  # still-masked positions scored this step
    masked_confidence: list[float] = field(default_factory=list)  # their max softmax probability
    recomputed: list[int] | None = None  # full trace only
    kv: dict[str, Any] | None = None  # per layer cosine with the entry's previous value
    exact: dict[str, Any] | None = None  # exact-drift diagnostic (its cost is exact_ms, apart)
    exact_ms: float = 0.0
    policy: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The record as a dict sharing its lists: a record is never changed once emitted, and a
        deep copy per step (``dataclasses.asdict``) cost the engine thread a tenth of a run."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def hit_rate(self) -> float:
        total = self.g + self.reads
        return self.reads / total if total else 0.0


@dataclass
class Stats:
    nfe: int = 0  # diffusion-model forwards, verification included
    guider_forwards: int = 0
    exact_forwards: int = 0
    gen_length: int = 0
    content_tokens: int = 0  # answer tokens before the first EOS/EOT
    tokens_per_forward: float = 0.0
    content_tokens_per_forward: float = 0.0
    mean_g: float = 0.0
    cache_hit_rate: float = 0.0
    model_s: float = 0.0
    other_s: float = 0.0
    exact_s: float = 0.0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0  # all committed tokens over model time
    content_tokens_per_s: float = 0.0
    stopped: bool = False


@dataclass
class Trace:
    settings: dict
    model: dict
    prompt_ids: list[int]
    gen_length: int
    mask_id: int
    steps: list[StepRecord] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    vocab: dict[str, str] = field(default_factory=dict)  # token id (as text) -> its text
    stats: Stats = field(default_factory=Stats)
    text: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def to_dict(self) -> dict:
        """Plain dict of the trace; step records are shared, not copied (see ``StepRecord.to_dict``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "steps": [s.to_dict() for s in self.steps], "stats": asdict(self.stats),
                "settings": dict(self.settings), "vocab": dict(self.vocab)}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "Trace":
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"trace schema version {version!r} is not supported (this build reads {SCHEMA_VERSION})")
        data = dict(data)
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        data["stats"] = Stats(**data.get("stats", {}))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(json.loads(text))
