"""Attention backends: how a forward's queries attend their keys, once ``models.attention`` has
written the cache and said which keys each query may attend (a ``KeyRule``).

One file per backend, registered in ``BACKENDS`` under the name ``Settings.attention_backend``
takes: ``sdpa`` (``sdpa.py``: PyTorch's scaled dot-product attention over the layout's dense mask,
packed requests padded to one row each) and ``flex`` (``flex.py``: FlexAttention with the rule as a
``mask_mod``, packed requests unpadded over every slot's keys). ``rule.py`` holds what they share.
Imports torch only: ``models.attention`` imports this package, never the other way.
"""
from .flex import Flex
from .rule import AttentionBackend, KeyRule
from .sdpa import SDPA

BACKENDS: dict[str, AttentionBackend] = {"sdpa": SDPA(), "flex": Flex()}
DEFAULT = "sdpa"


def get(name: str) -> AttentionBackend:
    """The backend registered as ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


__all__ = ["AttentionBackend", "BACKENDS", "DEFAULT", "KeyRule", "get"]
