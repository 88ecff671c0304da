"""A canvas model's own knobs (``Settings.canvas_params``): what transformers' DiffusionGemma
``generate`` takes besides the length. Each is optional; one not given is the checkpoint's
``generation_config.json`` value (transformers' defaults where that is silent). Their bounds are
transformers' own checks, told before a run instead of inside it."""
from __future__ import annotations

from functools import cache

from pydantic import TypeAdapter
from typing_extensions import TypedDict

from ..errors import SettingsError, listed
from ..limits import MAX_GEN_LENGTH
from ..values import about, integer, number, read


class CanvasParams(TypedDict, total=False):
    max_denoising_steps: about(integer(1, MAX_GEN_LENGTH), "Denoising steps",
                               "the most decoder passes per canvas; the stopping rule may end one sooner", top=256)
    canvas_length: about(integer(1, MAX_GEN_LENGTH), "Canvas length",
                         "tokens refined together; the answer is whole canvases", top=512)
    entropy_bound: about(number(0, low_open=True), "Entropy bound",
                         "the sampler keeps the lowest-entropy tokens while their entropies, less the largest, sum "
                         "to at most this; the rest are renoised", top=4.0)
    t_max: about(number(0, low_open=True), "Temperature at the first step", "the schedule falls linearly from this",
                 top=2.0)
    t_min: about(number(0), "Temperature at the last step", "where the schedule ends, at the last step", top=2.0)
    stability_threshold: about(integer(0, 64), "Stable for (steps)",
                               "a canvas ends once its draft was the same this many steps and it is confident", top=8)
    confidence_threshold: about(number(0, low_open=True), "Confident below (mean entropy)",
                                "and a canvas is confident once the mean entropy of its positions is below this", top=1.0)


CANVAS_KNOBS = tuple(CanvasParams.__annotations__)


def canvas_knob(name: str) -> tuple[str, str]:
    """The knob's label and help, as the command line and the page show them."""
    from typing import get_type_hints

    about = get_type_hints(CanvasParams, include_extras=True)[name].__metadata__[-1]
    return about.title, about.description


@cache
def _schema() -> TypeAdapter:
    from typing import get_type_hints

    return TypeAdapter(TypedDict("CanvasParams", get_type_hints(CanvasParams, include_extras=True), total=False))


def check_canvas_params(params: dict, owner: str = "") -> dict:
    """``params`` read through the schema (text parsed as the number asked for); t_max above t_min.
    A refusal names ``owner`` first when given: where the knobs come from (a checkpoint's file)."""
    where = owner or "canvas_params"
    unknown = sorted(set(map(str, params)) - set(CANVAS_KNOBS))
    if unknown:
        raise SettingsError(f"{where}: {listed(unknown, 'unknown knob')}; known: {', '.join(CANVAS_KNOBS)}")
    valid = read(_schema(), params, "canvas_params", owner)
    if "t_min" in valid and "t_max" in valid and valid["t_max"] <= valid["t_min"]:
        raise SettingsError(f"{where}: t_max ({valid['t_max']}) must be above t_min ({valid['t_min']}): "
                            "the temperature falls from t_max to t_min")
    return valid
