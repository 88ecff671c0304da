"""Model kinds: how a model decodes (masked, block or canvas diffusion), one registered spec each.

``spec.py`` holds the ``ModelKind`` type and its registry; each kind's file declares its spec and
registers it when imported, so importing them here is what makes them known (in this order).
Read a kind with ``kinds.get(name)``, never by comparing its name. Torch-free: the page reads it.
"""
from . import masked, block, canvas  # noqa: F401, I001
from .spec import ModelKind, all_kinds, get, names, register

__all__ = ["ModelKind", "all_kinds", "get", "names", "of", "register"]


def of(name: object) -> ModelKind:
    """The kind ``name`` names where it may name none: a trace's ``model["kind"]``. A trace that
    names none (an older one) or a kind this version does not know reads as a masked model's."""
    return get(name) if isinstance(name, str) and name in names() else masked.MASKED
