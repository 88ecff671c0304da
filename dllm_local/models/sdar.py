"""SKELETON: being written (issue 43). Replace whole."""
import re

from transformers import PretrainedConfig, PreTrainedModel

class SDARConfig(PretrainedConfig):
    model_type = "sdar"

class SDARForCausalLM(PreTrainedModel):
    config_class = SDARConfig
    packs_requests = True
    block_size = None
    experts = None

    def __init__(self, config):
        raise NotImplementedError("being written")

class SDARMoeConfig(PretrainedConfig):
    model_type = "sdar_moe"

class SDARMoeForCausalLM(PreTrainedModel):
    config_class = SDARMoeConfig
    packs_requests = True
    block_size = None
    experts = None

    def __init__(self, config):
        raise NotImplementedError("being written")

WEIGHTS = ("model.embed_tokens.weight", re.compile(r"model\.layers\.(\d+)\."), lambda c: ([c.vocab_size, c.hidden_size], c.num_hidden_layers))
TOKENIZER = "Qwen2Tokenizer"
MASK_TOKEN = None
