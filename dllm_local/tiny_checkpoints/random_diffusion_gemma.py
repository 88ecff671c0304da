"""A tiny random DiffusionGemma in the released on-disk format, made with transformers' own
classes: its config.json, model.safetensors and generation_config.json as ``save_pretrained``
writes them, and tokenizer files with Gemma's turn markers and chat template.

It has never been trained: it shows the mechanics of canvas decoding (the encoder cache, the
entropy-bound sampler, renoising, the stopping rule, the routed experts), not good answers. The
page's ``tiny-diffusiongemma`` is this checkpoint (``python -m dllm_local.tiny_checkpoints.random_diffusion_gemma
FOLDER`` writes it again).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..tiny import checkpoint_cli

GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' "
    "else message['role']) + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# The sizes of a 26B-A4B layout, scaled down: sliding and full attention layers, a dense MLP
# beside the experts in every layer, tied embeddings, a vision tower the text path never runs.
TEXT_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                  sliding_window=64, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                  layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048)
VISION_SIZES = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=8, position_embedding_size=64, model_type="gemma4_vision")
# transformers' own defaults for generate, written out as a released checkpoint does.
GENERATION = dict(max_denoising_steps=48, entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1,
                  confidence_threshold=0.005)


def tokenizer():
    """The tiny model's byte-level BPE with Gemma's pad and turn markers and its chat template."""
    from transformers import PreTrainedTokenizerFast

    from ..models.loading.find import TINY_MODEL

    tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    tok.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = GEMMA_CHAT_TEMPLATE
    return tok


def build_checkpoint(path: str | Path, init_seed: int = 0, canvas_length: int = 16, logit_scale: float = 32.0,
                     dtype: torch.dtype = torch.float32, **text_sizes) -> Path:
    """Write a random DiffusionGemma to ``path``, its weights drawn from ``init_seed``; ``logit_scale``
    multiplies the (tied) embedding, so its logits are that much sharper: with canvases of 16, some
    settle before the last step (a random model's mean entropy rarely falls below the stopping
    rule's threshold otherwise)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    path = Path(path)
    tok = tokenizer()
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    text = {**TEXT_SIZES, **text_sizes, "vocab_size": len(tok), "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    config = DiffusionGemmaConfig(text_config=text, vision_config=VISION_SIZES, canvas_length=canvas_length,
                                  image_token_id=2, boi_token_id=2, eoi_token_id=2)  # the unused <|mdm_mask|>
    torch.manual_seed(init_seed)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(logit_scale)
        g = torch.Generator().manual_seed(init_seed)
        for name, p in model.named_parameters():  # norms of ones would hide a norm applied to the wrong tensor
            if name.endswith("norm.weight") and "vision" not in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                                 EntropyBoundSamplerConfig)

    settings = {k: v for k, v in GENERATION.items() if k != "entropy_bound"}
    model.generation_config = DiffusionGemmaGenerationConfig(
        **settings, sampler_config=EntropyBoundSamplerConfig(GENERATION["entropy_bound"]),
        eos_token_id=[tok.eos_token_id, end_of_turn], pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    model.to(dtype).save_pretrained(path)
    tok.save_pretrained(path)
    return path


if __name__ == "__main__":
    checkpoint_cli(build_checkpoint, __doc__)
