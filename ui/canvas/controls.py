"""A canvas model's (DiffusionGemma's) place among the run's controls, as plain Python: why the
masked models' controls mean nothing for it, its own knobs (``canvas_settings.CANVAS_KNOBS``) by
control name, the knobs a run of it takes, and its settings in one line. Its knobs' boxes may be
left empty: an empty knob is the checkpoint's own value (its ``generation_config.json``)."""
from __future__ import annotations

from dllm_local.canvas.settings import CANVAS_KNOBS

from .parts import is_canvas_model

REASON = ("DiffusionGemma refines whole canvases with its own sampler: block size and cache policy do not apply; "
          "its encoder cache is exact by construction.")
# Shown above the run's controls while a canvas model is loaded.
REASON_NOTE = f"ℹ {REASON} Its own knobs are below (empty: the checkpoint's value)."


# The released checkpoint a block-diffusion or mixture-of-experts family's runs project onto (its
# tiny test checkpoints' too): the cost model's target of that family's size.
FAMILY_TARGETS = {"sdar": "SDAR-8B-Chat", "sdar_moe": "SDAR-30B-A3B-Chat", "llada2_moe": "LLaDA2.0-mini",
                  "lladamoe": "LLaDA-MoE-7B-A1B", "Fast_dLLM_Qwen": "Fast-dLLM-v2-7B"}


def cost_target(model: dict) -> str:
    """The real model the cost panel projects a run of ``model`` onto: a canvas model's released
    checkpoint, a block-diffusion or MoE family's (``FAMILY_TARGETS``), else LLaDA-8B."""
    if is_canvas_model(model):
        return "DiffusionGemma-26B-A4B"
    return FAMILY_TARGETS.get(model.get("family"), "LLaDA-8B-Instruct")


def canvas_key(name: str) -> str:
    """The control name of a canvas knob, e.g. "canvas.entropy_bound"."""
    return f"canvas.{name}"


CANVAS_CONTROLS = tuple(canvas_key(name) for name in CANVAS_KNOBS)


def canvas_values(settings: dict) -> dict[str, str]:
    """The knob boxes set to ``settings``' canvas_params: a knob it leaves out is empty."""
    given = settings.get("canvas_params") or {}
    return {canvas_key(name): "" if given.get(name) is None else str(given[name]) for name in CANVAS_KNOBS}


def knob_placeholder(model: dict, name: str) -> str:
    """What an empty knob box stands for: the loaded checkpoint's value (its info's
    ``canvas_defaults``, from its generation_config.json)."""
    value = (model.get("canvas_defaults") or {}).get(name)
    return "empty: the checkpoint's value" if value is None else f"empty: the checkpoint's {value:g}"


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def canvas_params(values: dict) -> dict:
    """The knobs filled in (by knob name), as the boxes give them: ``Settings`` reads the text as
    the number each asks for, and says which one is wrong and why."""
    return {name: values[canvas_key(name)] for name in CANVAS_KNOBS if not _empty(values.get(canvas_key(name)))}


def canvas_notice(gen_length: int, canvas_length: int) -> str:
    """The answer is whole canvases: a length that is not one is rounded up, and said."""
    canvases = -(-gen_length // canvas_length)
    if canvases * canvas_length == gen_length:
        return ""
    return (f"Generation length {gen_length} runs as {canvases} canvas{'es' if canvases > 1 else ''} of "
            f"{canvas_length} tokens: {canvases * canvas_length}.")


def canvas_settings_line(settings: dict) -> str:
    """A canvas run's settings in one line: its knobs given (the rest the checkpoint's), length, seed."""
    given = ", ".join(f"{name} {value}" for name, value in sorted((settings.get("canvas_params") or {}).items()))
    knobs = f"canvas sampler ({given})" if given else "canvas sampler (the checkpoint's knobs)"
    return f"{knobs} · length {settings['gen_length']} · seed {settings['seed']}"
