"""SKELETON: being written (issue 43). Replace whole."""
import re

from transformers import PretrainedConfig, PreTrainedModel

class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

class LLaDA2MoeModelLM(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    packs_requests = True
    block_size = None
    experts = None

    def __init__(self, config):
        raise NotImplementedError("being written")

WEIGHTS = ("model.embed_tokens.weight", re.compile(r"model\.layers\.(\d+)\."), lambda c: ([c.vocab_size, c.hidden_size], c.num_hidden_layers))
TOKENIZER = "Qwen2Tokenizer"
MASK_TOKEN = None
