"""Cache and unmasking policies, each a small unit chosen by name."""
from .cache import CACHE_POLICIES, CachePolicy
from .unmask import UNMASK_POLICIES, UnmaskPolicy

__all__ = ["CACHE_POLICIES", "UNMASK_POLICIES", "CachePolicy", "UnmaskPolicy"]
