"""The page's endpoints read their inputs through one schema each: the handler's own type hints,
checked by pydantic (``validate_call``) before it runs. The page's components bound what a browser
sends, but each endpoint is also an API any local program can call with anything (NaN in a slider,
null in a menu): a value that fails is an error naming the input and its rule, never a traceback."""
from __future__ import annotations

import functools
import inspect
import json
import math
import types
from typing import Annotated, Any, Callable, Literal

import gradio as gr
from pydantic import ConfigDict, Field, PlainValidator, Strict, ValidationError, validate_call
from pydantic_core import PydanticCustomError

from dllm_local.devices import DEVICES
from dllm_local.errors import schema_message
from dllm_local.analysis.costmodel import CONCURRENCY_MODELS, TARGET_MODELS
from dllm_local.trace import KV_VIEWS
from dllm_local.values import integer, number

StepIndex = integer(0, 10**9)  # the step slider: past the last step means the last
Fraction = number(0, 1)  # the what-if threshold
ColorBy = Literal["step", "confidence"]
Which = Literal["k", "v"]
KVView = Literal[KV_VIEWS]
Choice = Annotated[str, Strict(), Field(max_length=500)]  # a menu's pick (a preset, a policy, a model)
Quantization = Literal["none", "8bit", "4bit"]
TargetName = Literal[tuple(TARGET_MODELS)]  # the cost model's real models
ConcurrencyModel = Literal[tuple(CONCURRENCY_MODELS)]  # and the write-up's teaching model
DeviceName = Literal[tuple(DEVICES)]
FontScale = Literal["1×", "1.5×", "2×"]  # the presenter's font scale (presenter.FONT_SCALES)
Theme = Literal["light", "dark"]


def _same_object(value: Any) -> dict:
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "must be an object (the page's state)")
    return value  # the page's own state object, not a copy


PageState = Annotated[dict, PlainValidator(_same_object)]  # a trace or a report the page holds


def checked(handler: Callable) -> Callable:
    """``handler`` with its arguments checked against its type hints first (``gr.Request`` and the
    like taken as they come); a failure is a ``gr.Error`` naming the input by its parameter name."""
    validated = validate_call(_gradio_objects_unchecked(handler), config=ConfigDict(arbitrary_types_allowed=True))
    names = list(inspect.signature(handler).parameters)

    def refused(exc: ValidationError) -> gr.Error:
        errors = exc.errors(include_url=False)
        for error in errors:  # a positional argument's place is its index: named here
            if error["loc"] and isinstance(error["loc"][0], int) and error["loc"][0] < len(names):
                error["loc"] = (names[error["loc"][0]], *error["loc"][1:])
        return gr.Error(schema_message(_Renamed(errors), subject="an input"), print_exception=False)

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def each(*args: Any, **kwargs: Any):
            try:
                events = validated(*args, **kwargs)
            except ValidationError as exc:
                raise refused(exc) from None
            yield from events
        return each

    @functools.wraps(handler)
    def once(*args: Any, **kwargs: Any):
        try:
            return validated(*args, **kwargs)
        except ValidationError as exc:
            raise refused(exc) from None
    return once


def _gradio_objects_unchecked(handler: Callable) -> Callable:
    """A copy of ``handler`` whose Gradio-given parameters (``gr.Request``, ``gr.Progress``,
    ``gr.SelectData``) are typed Any: Gradio fills them, and a test may pass None."""
    copy = types.FunctionType(handler.__code__, handler.__globals__, handler.__name__, handler.__defaults__,
                              handler.__closure__)
    copy.__kwdefaults__ = handler.__kwdefaults__
    given = (gr.Request, gr.Progress, gr.SelectData)
    copy.__annotations__ = {name: Any if hint in given or str(hint).startswith(("gr.", "gradio.")) else hint
                            for name, hint in handler.__annotations__.items()}
    copy.__qualname__, copy.__module__ = handler.__qualname__, handler.__module__
    return copy


class _Renamed:
    """A ValidationError's errors with positional places named (``schema_message`` reads ``errors()``)."""

    def __init__(self, errors: list[dict]) -> None:
        self._errors = errors

    def errors(self, include_url: bool = False) -> list[dict]:
        return self._errors


def raw_number(component: gr.components.Component, payload: Any) -> Any:
    """``payload`` as the API sent it, if it is a finite number or null; else a refusal naming the
    input. Gradio's own preprocessing rounds a Number's or a Slider's payload (true becomes 1, text
    and NaN fail inside it), so this check runs before it, on what was sent."""
    if payload is None or (isinstance(payload, (int, float)) and not isinstance(payload, bool) and math.isfinite(payload)):
        return payload
    shown = json.dumps(payload, default=str)
    raise gr.Error(f"{component.label or component.elem_id or 'a number input'}: must be a finite number, not "
                   f"{shown[:40]}{'…' if len(shown) > 40 else ''}", print_exception=False)


def _checked(component: gr.Number | gr.Slider) -> Any:
    """``component`` with its payload checked by ``raw_number`` before Gradio's own preprocessing.
    The instance's method is wrapped, not the class subclassed: Gradio writes a .pyi stub beside
    the module of any Component subclass when the subclass is defined."""
    rounded = component.preprocess
    component.preprocess = lambda payload: rounded(raw_number(component, payload))
    return component


def number_box(*args: Any, **kwargs: Any) -> gr.Number:
    """The page's number box: Gradio's Number (same arguments), its payload checked first."""
    return _checked(gr.Number(*args, **kwargs))


def number_slider(*args: Any, **kwargs: Any) -> gr.Slider:
    """The page's slider: Gradio's Slider (same arguments), its payload checked first."""
    return _checked(gr.Slider(*args, **kwargs))
