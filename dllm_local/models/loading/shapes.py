"""The config's sizes against each other, and the weights' shapes against the config, before a model is built.

Attention heads split the width and key/value heads the heads, the vocabulary fits the embedding;
then the family's model, built from the config on the meta device (no memory, no weights read),
names every tensor's shape, compared with the safetensors headers. transformers would otherwise
fail mid-load, or load garbage, with an error that names neither the file nor the rule.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from ...errors import ModelLoadError
from ..family import FamilySpec
from ..protocol import DiffusionLM, FamilyConfig

def check_config_sizes(family: FamilySpec, config: FamilyConfig, config_file: Path) -> None:
    """Heads that divide the width (unless the config names head_dim), key/value heads that divide
    the heads, and no token id past the embedding's rows (LLaDA's embedding_size); the attention's
    sizes by the names the family's spec gives (``size_keys``)."""
    text = config.get_text_config()  # a composite config (DiffusionGemma) keeps its sizes in text_config
    values = text.to_dict()
    prefix = "" if text is config else "text_config."
    keys = family.size_keys
    width, heads, kv_heads = (values.get(key) for key in keys)
    named = ", ".join(f"{prefix}{key} {values.get(key)!r}" for key in keys)
    if not all(type(size) is int and size > 0 for size in (width, heads, kv_heads)):
        raise ModelLoadError(f"{config_file}: {named}: the attention's sizes are positive whole numbers")
    if values.get("head_dim") is None and width % heads:
        raise ModelLoadError(f"{config_file}: {prefix}{keys[1]} {heads} does not divide {prefix}{keys[0]} {width}: "
                             "each attention head takes an equal share of the width (or the config names head_dim)")
    if heads % kv_heads:
        raise ModelLoadError(f"{config_file}: {prefix}{keys[2]} {kv_heads} does not divide {prefix}{keys[1]} {heads}: "
                             "each key/value head serves an equal group of attention heads")
    vocab, rows = values.get("vocab_size"), values.get("embedding_size")
    if type(vocab) is int and type(rows) is int and vocab > rows:
        raise ModelLoadError(f"{config_file}: vocab_size {vocab} is larger than embedding_size {rows}: every token id "
                             "needs a row of the embedding")


def meta_model(family: FamilySpec, config: FamilyConfig, config_file: Path) -> DiffusionLM:
    """The family's model built from ``config`` on the meta device: its tensors' names and shapes
    at no memory cost. A config the model's code cannot build is a ModelLoadError naming config.json."""
    try:
        with torch.device("meta"):
            return family.model(copy.deepcopy(config))  # building may write to its config
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model's code raises many classes; its message is the point
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise ModelLoadError(f"{config_file} does not make a {family.model_type} model ({type(exc).__name__}: {first}); "
                             "fix its sizes") from None


def _matches(patterns: Iterable[str] | None, name: str) -> bool:
    return any(re.search(pattern, name) for pattern in patterns or ())


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def check_shapes(family: FamilySpec, config: FamilyConfig, tensors: dict[str, dict], config_file: Path) -> None:
    """Every tensor of the weights (``check_weights``'s headers) has the shape the config's model
    gives it, and the model has every tensor, as transformers loads them: a tied tensor (a head
    that is the embedding) may be absent, and the names its class ignores are ignored."""
    model = meta_model(family, config, config_file)
    expected = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    wrong = [name for name, shape in expected.items() if name in tensors and tensors[name]["shape"] != shape]
    if wrong:
        name = wrong[0]
        raise ModelLoadError(f"weight file {tensors[name]['file']}: {name} is {tensors[name]['shape']}, {config_file.name} "
                             f"makes it {expected[name]}{_more(wrong)}: the weights are not this config's")
    missing = [name for name in expected if name not in tensors and name not in model.all_tied_weights_keys
               and not _matches(model._keys_to_ignore_on_load_missing, name)]
    if missing:
        raise ModelLoadError(f"the weights in {config_file.parent} have no {missing[0]}{_more(missing)}, which the "
                             f"{family.model_type} model of {config_file.name} has: the weights are not this config's")
    extra = [name for name in tensors if name not in expected
             and not _matches(model._keys_to_ignore_on_load_unexpected, name)]
    if extra:
        raise ModelLoadError(f"weight file {tensors[extra[0]]['file']}: {extra[0]}{_more(extra)} has no place in the "
                             f"{family.model_type} model of {config_file.name}: the weights are not this config's")
