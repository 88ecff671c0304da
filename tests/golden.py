"""Golden traces: every registered cache x unmasking pair on three prompts, decoded by a frozen copy of the
tiny models (tests/data/frozen, never replaced by a retraining), reduced to what must never
change under a refactor: tokens, forwards, and per step G, reads and the commits.

    python tests/golden.py          # re-record tests/data/golden_traces.json (only on purpose)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FROZEN = HERE / "data" / "frozen"
GOLDEN = HERE / "data" / "golden_traces.json"

# Parameters other than the defaults, where the defaults would not show the policy at work (a
# budget that evicts, a named device so that no machine's measurement enters, a threshold that
# lets self-verification see conflicts). Every other registered policy runs at its defaults.
CACHE_PARAMS = {"adaptive": {"budget": 48, "device_profile": "H100"}}
UNMASK_PARAMS = {"self_verify": {"threshold": 0.3}}
# (prompt, temperature, seed, LLaDA remasking for the fixed schedule)
PROMPTS = [
    ("Tom has 3 bags of 4 apples and gives away 5 apples. How many apples are left?", 0.0, 0, "low_confidence"),
    ("Name one poker hand that Ana might have.", 1.0, 3, "random"),
    ("Give two numbers whose sum is 9.", 0.0, 1, "low_confidence"),
]


def pairs() -> list[tuple[str, str]]:
    """Every registered (cache, unmask) pair that decodes together, in registration order."""
    from dllm_local.policies import registry

    return [(cache, unmask) for cache, c in registry.for_model("masked", registry.CACHE).items() for unmask, u in registry.UNMASK.items()
            if registry.pair_problem(c, u) is None]


def golden_settings(cache: str, unmask: str, temperature: float, seed: int, remasking: str):
    from dllm_local import Settings

    unmask_params = dict(UNMASK_PARAMS.get(unmask, {}))
    if unmask == "fixed":
        unmask_params["remasking"] = remasking
    return Settings(gen_length=64, block_size=16, temperature=temperature, seed=seed, cache=cache,
                    cache_params=dict(CACHE_PARAMS.get(cache, {})), unmask=unmask, unmask_params=unmask_params, trace="full")


def record(pad_queries: bool = False, prompts: range | None = None) -> dict:
    """``pad_queries``: every forward padded to its bucket (``dllm_local.runner.buckets``), as a
    compiled forward runs it, here in eager mode; ``prompts``: which of ``PROMPTS`` (default all)."""
    import dllm_local
    from dllm_local.runner import runner_for

    handle = dllm_local.load(str(FROZEN / "tiny-llada"), device="cpu")
    runner_for(handle.model, "auto").pads = pad_queries
    guider = dllm_local.load_guider(str(FROZEN / "tiny-guider"), device="cpu")
    out = {}
    for p, (prompt, temperature, seed, remasking) in enumerate(PROMPTS):
        if prompts is not None and p not in prompts:
            continue
        for cache, unmask in pairs():
            settings = golden_settings(cache, unmask, temperature, seed, remasking)
            result = dllm_local.generate(handle, prompt, settings, guider)
            st = result.stats
            out[f"{p}/{cache}/{unmask}"] = {
                "tokens": result.token_ids, "nfe": st.nfe, "guider_forwards": st.guider_forwards,
                "steps": [{"g": s.g, "reads": s.reads, "forwards": s.forwards, "full_refresh": s.full_refresh,
                           "committed": [[c[0], c[1], round(c[2], 4)] for c in s.committed],
                           "revoked": [r[:2] for r in s.revoked]}
                          for s in result.trace.steps],
            }
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    GOLDEN.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}")
