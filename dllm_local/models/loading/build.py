"""Builds a checked checkpoint's config, tokenizer and model from its files, without remote code."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...errors import DllmError, ModelLoadError
from ..family import FamilySpec
from ..layers import pack_weights
from ..protocol import DiffusionLM, FamilyConfig

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig, PreTrainedTokenizerBase


@contextmanager
def reading(what: str) -> Iterator[None]:
    """A model folder's files read by transformers or tokenizers (a config class, a tokenizer, the
    weights, a generation config): what they raise comes from the files, in any class, and is told
    as a ModelLoadError naming ``what`` (the file or the folder) and the first line of the cause."""
    try:
        yield
    except DllmError:
        raise
    except Exception as exc:  # noqa: BLE001 - a checkpoint's data reaches code that raises many classes
        raise ModelLoadError(f"{what}: {cause(exc)}") from exc


def cause(exc: BaseException) -> str:
    """An exception in one bounded line: its class and its message's first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc).strip() else ''}"


def family_config(raw: dict, family: FamilySpec, config_file: Path) -> FamilyConfig:
    """The family's config class made from config.json's object ``raw``."""
    with reading(f"{config_file} is not a valid {family.model_type} config"):
        return family.config.from_dict(raw)


def load_tokenizer(path: Path, family: FamilySpec) -> PreTrainedTokenizerBase:
    """The tokenizer in ``path``: as its files say, else as the family's own tokenizer class (its
    spec's ``tokenizer``: for a tokenizer_config.json that names a remote-code class, as Dream's
    does, which AutoTokenizer refuses without trust_remote_code)."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - whatever AutoTokenizer refuses, the family's own class is tried
        pass
    native = getattr(transformers, family.tokenizer)
    try:
        return native.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - as ``reading``: the tokenizer files' failures, in any class
        raise ModelLoadError(f"this app runs no remote code; {family.model_type} is supported natively, but the "
                             f"tokenizer in {path} does not load as {native.__name__} either ({cause(exc)}); check its "
                             "tokenizer files") from exc


def build_model(path: Path, family: FamilySpec, config: FamilyConfig, dtype: torch.dtype, device: torch.device,
                qconfig: BitsAndBytesConfig | None, device_map: str | dict | None) -> DiffusionLM:
    """The family's model with the weights in ``path``, in ``dtype`` (quantized by ``qconfig``),
    on ``device`` or spread by ``device_map``, in eval mode. Weights that leave a parameter unset,
    or name one the architecture lacks, are refused."""
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype}
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = device_map or {"": (device.index or 0) if device.type == "cuda" else "cpu"}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    with reading(f"the weights in {path} could not be loaded"):
        model, info = family.model.from_pretrained(path, output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ModelLoadError(f"weights in {path} do not match the {family.model_type} architecture: {bad}")
    if qconfig is None and device_map is None:
        model = model.to(device)
    pack_weights(model)
    return model.eval()
