"""Model families: this project's own (LLaDA, Dream, LLaDA-MoE; the block-diffusion SDAR,
LLaDA2 and Fast-dLLM v2), registered with the transformers Auto classes at import (no remote
code), and those transformers ships itself (DiffusionGemma), loaded through transformers' own
classes. Each family's file registers its spec (``family.py``) when imported: importing them here,
in this order, is what makes them known (the order the loader lists them in)."""
from . import llada, dream, llada_moe, sdar, llada2, fast_dllm_v2, diffusion_gemma  # noqa: F401, I001
from .dream import DreamConfig, DreamModel
from .llada import LLaDAConfig, LLaDAModelLM

__all__ = ["DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
