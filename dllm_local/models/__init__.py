"""Model families: this project's own (LLaDA, Dream), registered with the transformers Auto
classes at import (no remote code), and those transformers ships itself (DiffusionGemma), loaded
through transformers' own classes."""
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from .dream import DreamConfig, DreamModel
from .llada import LLaDAConfig, LLaDAModelLM

OWN_FAMILIES = {"llada": (LLaDAConfig, LLaDAModelLM), "Dream": (DreamConfig, DreamModel)}
FAMILIES = {**OWN_FAMILIES, "diffusion_gemma": (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion)}
# How each family decodes: masked diffusion (a mask per undecoded position, the sampler's loop) or
# canvas diffusion (a canvas of tokens refined as a whole, canvas.py's loop).
KINDS = {"llada": "masked", "Dream": "masked", "diffusion_gemma": "canvas"}

for _config, _model in OWN_FAMILIES.values():
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = ["FAMILIES", "KINDS", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
