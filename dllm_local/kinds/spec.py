"""The ``ModelKind`` spec: how a model of one kind decodes, and the registry of kinds.

A family's ``kind`` (``FamilySpec.kind``, ``ModelHandle.kind``, a trace's ``model["kind"]``) is
a kind's name; everything that differs by kind is read from its spec here, never from the name.
The spec is torch-free and names its run class as ``"module:Class"``, imported on use, so this
registry stays a leaf that the engine, the CLI and the page all read.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..errors import SettingsError

# The Settings fields a run of every kind reads: its length, seed and trace, and how its forwards
# run. Each kind's ``knobs`` are the others it reads; a test holds every Settings field to one of them.
COMMON_KNOBS = ("gen_length", "block_size", "seed", "trace", "forward_mode", "attention_backend", "absolute_blocks")


@dataclass(frozen=True)
class ModelKind:
    name: str  # what families, handles and traces call it
    label: str  # in messages: "a block-diffusion model"
    run: str  # its run class as "module:Class": stream(handle, prompt, settings, guider, branch)
    # Where a run's blocks sit: False, block 0 at the answer's first position and the block
    # dividing the answer (bidirectional forwards); True, at absolute positions p // block_size,
    # every forward block-causal (run_blocks).
    absolute_blocks: bool = False
    # The model declares its block (and sub-block): its ``decoding()`` says them and a run left
    # unset decodes with them, a sweep over that block alone, with the cache ``own_cache``.
    own_block: bool = False
    own_cache: str | None = None
    whole_answer_block: bool = False  # a run's block is its whole answer (any length is accepted)
    # A mask token per undecoded position: the masked-diffusion tools (policies compared, requests
    # packed, sweeps) run on it. Without one, ``masked_tools_refusal`` says what to do instead.
    has_mask: bool = True
    masked_tools_refusal: str = ""  # formatted with what, name
    canvas_steps: bool = False  # each step records a canvas (``canvas/trace.py``): the page draws canvases
    shares_batch: bool = False  # its runs may join the engine's continuous batch with others
    bench_set: str | None = None  # the bench's strategy set its policies fit, when only one does
    # The kind whose policies it takes (a policy spec's ``model_kinds`` names kinds); "": its own.
    policies: str = ""
    # A cache policy not made for this kind refused: formatted with cache, name, family.
    cache_refusal: str = ""
    # The Settings fields its runs read besides COMMON_KNOBS: any other set away from its default is a
    # knob this kind does not have, refused by ``check_knobs`` (never silently ignored).
    knobs: tuple[str, ...] = ()

    @property
    def policy_kind(self) -> str:
        """The kind name the policies' ``model_kinds`` are read against for this kind."""
        return self.policies or self.name

    def check_knobs(self, given: dict[str, Any], name: str) -> None:
        """Refuse the knobs of ``given`` (Settings fields set away from their defaults) that this kind
        does not have, each named (a parameter mapping by its keys), with the kind and its own knobs."""
        foreign = [f"{key} {value!r} ({field})" if isinstance(values, dict) else f"{field} {values!r}"
                   for field, values in given.items() if field not in (*COMMON_KNOBS, *self.knobs)
                   for key, value in (values.items() if isinstance(values, dict) else [(field, values)])]
        if foreign:
            raise SettingsError(f"{', '.join(foreign)}: {name} is a {self.label} model, which has no such knob; "
                                f"besides {', '.join(COMMON_KNOBS)}, its knobs are {', '.join(self.knobs)}")

    def run_class(self) -> type:
        """The class that runs a generation of a model of this kind (imported on first use)."""
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)

    def decoding(self, block_size: int | None = None, sub_block: int | None = None) -> dict:
        """How a model of this kind decodes, as JSON values: its kind, and its own block and
        sub-block when it declares them (``block_size``, ``sub_block``: the model's)."""
        if not self.own_block:
            return {"kind": self.name}
        return {"kind": self.name, "block_size": block_size, "sub_block": sub_block}

    def defaults(self, args: Any, decoding: dict) -> None:
        """Set the knobs of ``args`` (the CLI's namespace) left unset that this kind decides, from
        ``decoding`` (a model's ``decoding()``): its own block and cache (the sub-block as its
        release decodes it), or the whole answer as the block; blocks at absolute positions take
        any length."""
        args.absolute_blocks = args.absolute_blocks or self.absolute_blocks
        if self.own_block:
            args.block_size = args.block_size or decoding["block_size"]
            if args.cache is None and decoding["sub_block"]:
                args.cache_param = [f"sub_block={decoding['sub_block']}", *args.cache_param]
            args.cache = args.cache or self.own_cache
        elif self.whole_answer_block:
            args.block_size = args.gen_length


_KINDS: dict[str, ModelKind] = {}


def register(kind: ModelKind) -> ModelKind:
    """Add a kind (one of the same name replaces the old one)."""
    _KINDS[kind.name] = kind
    return kind


def get(name: str) -> ModelKind:
    """The registered kind called ``name``; a KeyError for one not registered."""
    return _KINDS[name]


def names() -> tuple[str, ...]:
    """Every registered kind's name, in registration order."""
    return tuple(_KINDS)


def all_kinds() -> tuple[ModelKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(_KINDS.values())
