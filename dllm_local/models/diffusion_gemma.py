"""DiffusionGemma as transformers ships it (``transformers.models.diffusion_gemma``): what the
loader and the canvas loop read from its config and its ``generation_config.json``. The model
itself is transformers' ``DiffusionGemmaForBlockDiffusion``, never re-implemented here; its spec
names transformers' classes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from ..canvas.settings import CANVAS_KNOBS, check_canvas_params
from ..errors import ModelLoadError, SettingsError, shown
from .config_rules import MAX_EXPERTS, MAX_LAYERS, ConfigRules, Real, Values, Whole, routed
from .family import FamilySpec, WeightNames, register
from .loading.checks import read_json_object


def _ids(value: Any) -> list[int]:
    return [value] if type(value) is int else [v for v in value or () if type(v) is int]


def end_tokens(model: Any) -> tuple[int, ...]:
    """Every end token the checkpoint's generation config names: each ends the answer, as in
    transformers' ``generate``; none named, nothing ends it before its length."""
    return tuple(dict.fromkeys(_ids(model.generation_config.eos_token_id)))


def end_of_text(model: Any, path: Path) -> int:
    """The end-of-text token to name: the generation config's first end token, else the text config's."""
    ids = _ids(model.generation_config.eos_token_id) or _ids(model.config.text_config.eos_token_id)
    if not ids:
        raise ModelLoadError(f"{path} names no end token: set eos_token_id in generation_config.json")
    return ids[0]


def pad_token(model: Any) -> int:
    """What transformers writes after the first end token of a finished canvas (the text
    config's pad where the generation config names none: then transformers writes none, and it
    only fills the canvases a finished answer never started)."""
    pad = model.generation_config.pad_token_id
    return pad if type(pad) is int else model.config.text_config.pad_token_id or 0


def experts(config: Any) -> tuple[int, int] | None:
    """(experts per layer, experts routed per token), or None for a dense model."""
    text = config.text_config
    return (text.num_experts, text.top_k_experts) if text.num_experts else None


def max_positions(config: Any) -> int:
    return config.text_config.max_position_embeddings


def knob_defaults(model: Any) -> dict:
    """Each canvas knob's value when a run leaves it unset: the checkpoint's generation config,
    transformers' defaults where that is silent (as ``generate`` resolves them)."""
    config, _ = model._prepare_generation_config(None)
    return {"max_denoising_steps": config.max_denoising_steps, "canvas_length": model.config.canvas_length,
            "entropy_bound": config.sampler_config.entropy_bound, "t_max": config.t_max, "t_min": config.t_min,
            "stability_threshold": config.stability_threshold, "confidence_threshold": config.confidence_threshold}


def _check(values: Values) -> None:
    """Experts routed within the experts; the canvas length and the generation config's knobs within
    the bounds a run's own knobs keep (``canvas.settings``): the checkpoint's are a run's defaults."""
    routed(values, "text_config.num_experts", "text_config.top_k_experts")
    _knobs({"canvas_length": values["canvas_length"]}, values.file)
    generation = values.file.parent / "generation_config.json"
    if not (generation.exists() or generation.is_symlink()):
        return
    raw = read_json_object(generation)
    sampler = raw.get("sampler_config", {})
    if not isinstance(sampler, dict):
        raise ModelLoadError(f"{generation}: sampler_config {shown(sampler)} must be an object (its entropy_bound)")
    _knobs({**{k: raw[k] for k in CANVAS_KNOBS if k in raw},
            **{k: sampler[k] for k in ("entropy_bound",) if k in sampler}}, generation)


def _knobs(knobs: dict, file: Path) -> None:
    """``knobs`` as a run's canvas knobs are checked, but numbers as the file wrote them (no text)."""
    text = [key for key, value in knobs.items() if type(value) not in (int, float)]
    if text:
        raise ModelLoadError(f"{file}: {text[0]} {shown(knobs[text[0]])} must be a number")
    try:
        check_canvas_params(knobs, str(file))
    except SettingsError as exc:
        raise ModelLoadError(str(exc)) from None


RULES = ConfigRules({
    **{f"text_config.{key}": Whole() for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                                 "num_key_value_heads", "head_dim", "max_position_embeddings",
                                                 "sliding_window")},
    "text_config.num_hidden_layers": Whole(high=MAX_LAYERS),
    "text_config.num_experts": Whole(0, MAX_EXPERTS, optional=True),
    "text_config.top_k_experts": Whole(high=MAX_EXPERTS, optional=True),
    "text_config.moe_intermediate_size": Whole(optional=True),
    "text_config.rms_norm_eps": Real(0, 1, low_open=True),
}, _check)


register(FamilySpec(
    config=DiffusionGemmaConfig, model=DiffusionGemmaForBlockDiffusion, kind="canvas",
    # The encoder's weights are the decoder's (tied): the file holds the decoder's.
    weights=WeightNames("model.decoder.embed_tokens.weight", r"model\.decoder\.layers\.(\d+)\.",
                        lambda c: ([c.text_config.vocab_size, c.text_config.hidden_size],
                                   c.text_config.num_hidden_layers)),
    tokenizer="PreTrainedTokenizerFast", transformers_own=True, rules=RULES))
