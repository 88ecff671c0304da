"""Model families, registered with the transformers Auto classes at import (no remote code)."""
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .dream import DreamConfig, DreamModel
from .llada import LLaDAConfig, LLaDAModelLM

FAMILIES = {"llada": (LLaDAConfig, LLaDAModelLM), "Dream": (DreamConfig, DreamModel)}

for _config, _model in FAMILIES.values():
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = ["FAMILIES", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
