"""Model families: this project's own (LLaDA, Dream, LLaDA-MoE; the block-diffusion SDAR,
LLaDA2 and Fast-dLLM v2), registered with the transformers Auto classes at import (no remote
code), and those transformers ships itself (DiffusionGemma), loaded through transformers' own
classes."""
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from . import fast_dllm_v2, llada2, llada_moe, sdar
from .dream import DreamConfig, DreamModel
from .llada import LLaDAConfig, LLaDAModelLM

OWN_FAMILIES = {
    "llada": (LLaDAConfig, LLaDAModelLM),
    "Dream": (DreamConfig, DreamModel),
    "lladamoe": (llada_moe.LLaDAMoEConfig, llada_moe.LLaDAMoEModelLM),
    "sdar": (sdar.SDARConfig, sdar.SDARForCausalLM),
    "sdar_moe": (sdar.SDARMoeConfig, sdar.SDARMoeForCausalLM),
    "llada2_moe": (llada2.LLaDA2MoeConfig, llada2.LLaDA2MoeModelLM),
    "Fast_dLLM_Qwen": (fast_dllm_v2.FastDLLMv2Config, fast_dllm_v2.FastDLLMv2ForCausalLM),
}
FAMILIES = {**OWN_FAMILIES, "diffusion_gemma": (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion)}
# The modules of the families added with block diffusion, each declaring its checkpoint's facts
# (WEIGHTS, TOKENIZER, MASK_TOKEN) beside its classes.
FAMILY_MODULES = {"lladamoe": llada_moe, "sdar": sdar, "sdar_moe": sdar, "llada2_moe": llada2,
                  "Fast_dLLM_Qwen": fast_dllm_v2}
# How each family decodes: masked diffusion (bidirectional: a mask per undecoded position, the
# sampler's loop), block diffusion (the same loop, causal between blocks at absolute positions),
# or canvas diffusion (a canvas of tokens refined as a whole, canvas.py's loop).
KINDS = {"llada": "masked", "Dream": "masked", "lladamoe": "masked", "sdar": "block", "sdar_moe": "block",
         "llada2_moe": "block", "Fast_dLLM_Qwen": "block", "diffusion_gemma": "canvas"}

for _config, _model in OWN_FAMILIES.values():
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = ["FAMILIES", "FAMILY_MODULES", "KINDS", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
