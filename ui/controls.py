"""The controls' logic, kept apart from the layout so that it is plain, testable Python."""
from __future__ import annotations

# Which knobs each policy uses: only those are shown.
CACHE_KNOBS = {
    "none": set(), "prefix": {"refresh_every"}, "dual": {"refresh_every"}, "freecache": set(),
    "adaptive": {"refresh_every", "floor", "budget"},
}
UNMASK_KNOBS = {
    "fixed": {"steps"}, "threshold": {"threshold"}, "factor": {"factor"}, "guided": {"guider_rule"},
    "self_verify": {"threshold", "rho", "window"},
}
ALL_KNOBS = ["steps", "threshold", "factor", "refresh_every", "floor", "budget", "rho", "window", "guider_rule"]


def visible_knobs(cache: str, unmask: str) -> dict[str, bool]:
    shown = CACHE_KNOBS.get(cache, set()) | UNMASK_KNOBS.get(unmask, set())
    return {k: k in shown for k in ALL_KNOBS}


def fit_block(gen_length: int, block_size: int) -> tuple[int, int, str]:
    """Block size must divide the generation length: round the length up, and say so."""
    gen_length, block_size = int(gen_length), max(1, int(block_size))
    if gen_length % block_size == 0:
        return gen_length, block_size, ""
    adjusted = -(-gen_length // block_size) * block_size
    return adjusted, block_size, (f"Generation length adjusted from {gen_length} to {adjusted} so that "
                                  f"block size {block_size} divides it.")


def settings_from_controls(v: dict) -> tuple[dict, str]:
    """Control values -> a settings dict (validated later by the engine) and a notice."""
    gen_length, block_size, notice = fit_block(v["gen_length"], v["block_size"])
    cache, unmask = v["cache"], v["unmask"]
    cache_params: dict = {}
    if "refresh_every" in CACHE_KNOBS[cache]:
        cache_params["refresh_every"] = int(v["refresh_every"])
    if cache == "adaptive":
        cache_params["floor"] = float(v["floor"])
        if v.get("budget"):
            cache_params["budget"] = int(v["budget"])
    unmask_params: dict = {}
    if unmask in ("threshold", "self_verify"):
        unmask_params["threshold"] = float(v["threshold"])
    if unmask == "factor":
        unmask_params["factor"] = float(v["factor"])
    if unmask == "self_verify":
        unmask_params.update(rho=float(v["rho"]), window=int(v["window"]))
    if unmask == "guided":
        unmask_params["rule"] = v["guider_rule"]
    steps = None
    if unmask == "fixed" and v.get("steps"):
        blocks = gen_length // block_size
        steps = max(blocks, int(v["steps"]) // blocks * blocks)
    settings = {
        "gen_length": gen_length, "block_size": block_size, "steps": steps,
        "temperature": float(v["temperature"]), "seed": int(v["seed"]), "remasking": v.get("remasking", "low_confidence"),
        "cache": cache, "cache_params": cache_params, "unmask": unmask, "unmask_params": unmask_params,
        "trace": "full", "exact_drift": bool(v["exact_drift"]), "early_stop": False,
    }
    return settings, notice


def controls_from_settings(s: dict) -> dict:
    """A preset's settings -> control values (knobs a preset leaves out keep their defaults)."""
    cp, up = s.get("cache_params", {}), s.get("unmask_params", {})
    out = {
        "gen_length": s.get("gen_length", 128), "block_size": s.get("block_size", 32),
        "steps": s.get("steps") or s.get("gen_length", 128), "temperature": s.get("temperature", 0.0),
        "seed": s.get("seed", 0), "cache": s.get("cache", "none"), "unmask": s.get("unmask", "fixed"),
        "refresh_every": cp.get("refresh_every", 0), "floor": cp.get("floor", 0.5), "budget": cp.get("budget") or 0,
        "threshold": up.get("threshold", 0.9), "factor": up.get("factor", 1.0), "rho": up.get("rho", 0.5),
        "window": up.get("window", 4), "guider_rule": up.get("rule", "exact"), "exact_drift": s.get("exact_drift", False),
    }
    return out
