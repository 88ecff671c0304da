"""What model families exist and what the loader reads of each: one registered spec per family.

A ``FamilySpec`` names a family's config and model classes, how it decodes (its kind's name, ``dllm_local.kinds``), where its
weights are by name (``WeightNames``: what the loader checks before building), the tokenizer class
its files load as, its mask token, and the rules its config.json keeps (``config_rules``). Each
family's file declares its spec beside its classes and registers it; ``register`` also registers the classes with transformers' Auto classes. The
loader, the checks and the builder read a family from here, never by its name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .. import kinds
from .config_rules import ConfigRules

# The attention's sizes by their config.json names (width, heads, key/value heads): Qwen2's.
QWEN2_SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads")


@dataclass(frozen=True)
class WeightNames:
    """Where a family's weights are, by name: the loader checks a checkpoint's tensors against
    them (and the config's sizes) before anything is built."""

    embedding: str  # the input embedding's weight
    blocks: str  # a regular expression matching a block's weight names from the start; group 1 its index
    # From the config: the input embedding's shape (vocabulary x width) and the number of blocks.
    sizes: Callable[[Any], tuple[list[int], int]]

    def block_indices(self, names: Iterable[str]) -> set[int]:
        """The block indices the weight ``names`` hold."""
        return {int(m.group(1)) for m in map(re.compile(self.blocks).match, names) if m}


# The names transformers' Qwen2 gives its weights (Dream, SDAR, LLaDA-MoE, Fast-dLLM v2 keep them).
QWEN2_WEIGHTS = WeightNames("model.embed_tokens.weight", r"model\.layers\.(\d+)\.",
                            lambda c: ([c.vocab_size, c.hidden_size], c.num_hidden_layers))


@dataclass(frozen=True)
class FamilySpec:
    config: type  # the config class; its ``model_type`` (config.json's) names the family
    model: type  # the model class (a PreTrainedModel keeping the DiffusionLM protocol)
    kind: str  # how it decodes: a registered kind's name (``dllm_local.kinds``)
    weights: WeightNames
    # The transformers tokenizer class (by name) its tokenizer files load as when AutoTokenizer
    # refuses them (a tokenizer_config.json naming a remote-code class, as Dream's does).
    tokenizer: str
    # The tokenizer's mask token, for a config.json that names no mask_token_id (SDAR, LLaDA2, ...).
    mask_token: str | None = None
    size_keys: tuple[str, str, str] = QWEN2_SIZE_KEYS  # the attention's sizes in config.json
    # A config.json of another model_type that is this family's (LLaDA-MoE's released config says
    # "llada", its expert sizes tell it apart): True for such a config.
    claims: Callable[[dict], bool] | None = None
    transformers_own: bool = False  # transformers ships the classes (and registers them itself)
    # What its config.json must hold, checked before its config class or any module is built.
    rules: ConfigRules = ConfigRules()

    def __post_init__(self) -> None:
        if self.kind not in kinds.names():
            raise ValueError(f"family {self.model_type}: kind must be one of {', '.join(kinds.names())}, not {self.kind!r}")

    @property
    def model_type(self) -> str:
        return self.config.model_type


_FAMILIES: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family (a spec of the same model_type replaces the old one); this project's own
    classes are registered with transformers' Auto classes too."""
    _FAMILIES[spec.model_type] = spec
    if not spec.transformers_own:
        AutoConfig.register(spec.model_type, spec.config, exist_ok=True)
        AutoModel.register(spec.config, spec.model, exist_ok=True)
        AutoModelForCausalLM.register(spec.config, spec.model, exist_ok=True)
    return spec


def get(model_type: str) -> FamilySpec:
    """The registered family of ``model_type``; a KeyError for one not registered."""
    return _FAMILIES[model_type]


def known(model_type: Any) -> bool:
    """Whether ``model_type`` (a config.json value, of any JSON type) names a registered family."""
    return isinstance(model_type, str) and model_type in _FAMILIES


def all_specs() -> tuple[FamilySpec, ...]:
    """Every registered family, in registration order."""
    return tuple(_FAMILIES.values())


def of_config(raw: dict) -> FamilySpec | None:
    """The family a config.json's object ``raw`` is: one that claims it, else its model_type's."""
    claimed = [spec for spec in _FAMILIES.values() if spec.claims is not None and spec.claims(raw)]
    if claimed:
        return claimed[0]
    return _FAMILIES[raw["model_type"]] if known(raw.get("model_type")) else None
