"""The bitsandbytes 4-bit and 8-bit path: its config, and what a quantized weight costs and keeps."""
from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

import torch

from ...errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig

# Tensors a quantized load keeps in full precision: the families' input embeddings and output heads.
FULL_PRECISION = {"model.transformer.wte.weight", "model.transformer.ff_out.weight", "model.embed_tokens.weight",
                  "lm_head.weight"}
# Bytes one value of a quantized weight takes.
BYTES_PER_VALUE = {"4bit": 0.5, "8bit": 1.0}


def quantization_config(quantization: str | None, dtype: torch.dtype) -> BitsAndBytesConfig | None:
    """bitsandbytes' config for ``quantization``. It runs on CUDA and, slowly, on the CPU.

    4-bit computes in the model's dtype. 8-bit runs pure int8 matmuls (``llm_int8_threshold=0``):
    the default outlier split (6.0) costs a host sync per Linear per forward to find the outlier
    columns (about 450 per step on LLaDA-8B), which would hide the cache policies' differences."""
    if quantization in (None, "none"):
        return None
    if quantization not in ("8bit", "4bit"):
        raise ModelLoadError(f"quantization must be none, 8bit or 4bit, not {quantization!r}")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(f"{quantization} quantization needs bitsandbytes: pip install bitsandbytes") from exc
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_type="nf4")


def quiet_bitsandbytes() -> None:
    """Silence what bitsandbytes says at import that is not the user's to act on."""
    # It warns about optional GPU kernels when imported on a CPU-only machine, and its import
    # trips torch's deprecation of jit.script_method.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*is deprecated", category=DeprecationWarning)
