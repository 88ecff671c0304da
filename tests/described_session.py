"""A session that answers what ``ui.page.build`` asks from this process's registry: a page built without an engine."""
from __future__ import annotations

from dllm_local.policies import registry


class DescribedSession:
    """What ``page.build`` asks of a session, answered from this process's registry (no engine)."""

    batch_mode = "packed"

    def info(self) -> dict:
        return {"name": "tiny", "family": "llada", "parameters": 1e6, "device": "cpu", "dtype": "float32",
                "quantization": "none", "memory_mb": 1, "layers": 2}

    def quantization_options(self) -> list:
        return [("none", True, "")]

    def model_options(self) -> list:
        return [("tiny", True, "")]

    def policy_specs(self) -> dict:
        return registry.all_specs()
