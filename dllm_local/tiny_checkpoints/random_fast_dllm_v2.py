"""A tiny random Fast-dLLM v2 in the released on-disk format: config.json with the released keys
(Qwen2.5's, ``bd_size``, ``layer_types``, the remote-code ``auto_map`` and ``model_type``
"Fast_dLLM_Qwen"), Qwen2's weight names, Qwen2.5-Instruct's generation_config.json, and a Qwen2
tokenizer (the embedded tiny model's BPE) with Qwen's turn markers, the mask token ``|<MASK>|``
and Qwen2.5's chat template.

``tie_word_embeddings=True`` writes the 1.5B's layout (one model.safetensors, no lm_head.weight);
False the 7B's (its own head, shards under model.safetensors.index.json). Never trained: it shows
the mechanics of block and sub-block decoding, not good answers. ``python -m
dllm_local.tiny_checkpoints.random_fast_dllm_v2 FOLDER`` writes one.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..tiny import checkpoint_cli

QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
MASK, IM_START, IM_END, END_OF_TEXT = "|<MASK>|", "<|im_start|>", "<|im_end|>", "<|endoftext|>"
AUTO_MAP = {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
            "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"}
# Qwen2.5-1.5B-Instruct's layout, scaled down; bd_size and the attention as released.
BIAS_STD = 0.02  # the biases' and norms' spread around 0 and 1: larger ones make every position alike
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def tokenizer():
    """The tiny model's byte-level BPE as a Qwen2 tokenizer with Qwen's markers, the mask token and
    Qwen2.5's chat template."""
    from transformers import PreTrainedTokenizerFast

    from ..models.loading.find import TINY_MODEL

    tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    tok.add_special_tokens({"additional_special_tokens": [IM_START, IM_END, MASK]})
    return tok


def config_json(vocab_size: int, eos_id: int, pad_id: int, tie_word_embeddings: bool, **sizes) -> dict:
    """config.json as released (keys in the released order), at the given sizes."""
    s = {**SIZES, **sizes}
    return {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0, "auto_map": AUTO_MAP,
        "bd_size": 32, "bos_token_id": pad_id, "eos_token_id": eos_id, "hidden_act": "silu",
        "hidden_size": s["hidden_size"], "initializer_range": 0.02, "intermediate_size": s["intermediate_size"],
        "layer_types": ["full_attention"] * s["num_hidden_layers"], "max_position_embeddings": 32768,
        "max_window_layers": s["num_hidden_layers"], "model_type": "Fast_dLLM_Qwen",
        "num_attention_heads": s["num_attention_heads"], "num_hidden_layers": s["num_hidden_layers"],
        "num_key_value_heads": s["num_key_value_heads"], "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": "bfloat16", "transformers_version": "4.53.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab_size,
    }


def _write_tokenizer(tok, path: Path) -> None:
    """The tokenizer files with tokenizer_config.json's keys as Qwen2.5-Instruct's are."""
    tok.save_pretrained(path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    for key in ("mask_token", "backend", "is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg.update(bos_token=None, eos_token=IM_END, pad_token=END_OF_TEXT, tokenizer_class="Qwen2Tokenizer",
               chat_template=QWEN25_CHAT_TEMPLATE, model_max_length=131072, errors="replace",
               split_special_tokens=False, add_prefix_space=False)
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (path / "added_tokens.json").write_text(json.dumps({t: tok.convert_tokens_to_ids(t)
                                                        for t in (END_OF_TEXT, IM_START, IM_END, MASK)}, indent=2))


def build_checkpoint(path: str | Path, init_seed: int = 0, tie_word_embeddings: bool = True, logit_scale: float = 64.0,
                     dtype: torch.dtype = torch.float32, **sizes) -> Path:
    """Write a random Fast-dLLM v2 to ``path``, its weights drawn from ``init_seed``; ``logit_scale``
    multiplies the final norm (so the logits), so that greedy decoding at threshold 0.9 sees some
    confident tokens and commits several in some forwards."""
    from ..models.fast_dllm_v2 import FastDLLMv2Config, FastDLLMv2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    raw = config_json(len(tok), tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(END_OF_TEXT),
                      tie_word_embeddings, **sizes)
    torch.manual_seed(init_seed)
    model = FastDLLMv2ForCausalLM(FastDLLMv2Config.from_dict(raw)).eval()
    g = torch.Generator().manual_seed(init_seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):  # ones and zeros would hide a misapplied one
                p.copy_(name.endswith("norm.weight") + BIAS_STD * torch.randn(p.shape, generator=g))
        model.model.norm.weight.mul_(logit_scale)  # not the head: the 1.5B's is the input embedding too
        # The released generate would commit a predicted mask token and never finish the block: a
        # head row of zeros keeps the mask's logit at 0, below the best of the others.
        model.get_output_embeddings().weight[tok.convert_tokens_to_ids(MASK)] = 0
    # The 7B's head is its own and its weights come in shards, as released.
    model.to(dtype).save_pretrained(path, max_shard_size="100KB" if not tie_word_embeddings else "5GB")
    for name, content in (("config.json", raw), ("generation_config.json", generation_json(raw))):
        (path / name).write_text(json.dumps(content, indent=2))
    _write_tokenizer(tok, path)
    return path


def generation_json(raw: dict) -> dict:
    """Qwen2.5-Instruct's generation_config.json, as the released checkpoints keep it (the released
    ``generate`` reads none of it: it stops at its own ``stop_token``, <|im_end|>)."""
    end_of_text = raw["bos_token_id"]
    return {"bos_token_id": end_of_text, "do_sample": True, "eos_token_id": [raw["eos_token_id"], end_of_text],
            "pad_token_id": end_of_text, "repetition_penalty": 1.1 if raw["tie_word_embeddings"] else 1.05,
            "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "4.53.1"}


if __name__ == "__main__":
    checkpoint_cli(build_checkpoint, __doc__, {"untied": ("the 7B's layout: its own head, sharded weights",
                                                          "tie_word_embeddings", False)})
