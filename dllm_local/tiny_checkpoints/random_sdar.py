"""A tiny random SDAR (dense) or SDAR MoE in the released on-disk format.

Written as JetLM's uploads are: the released config.json's keys (sizes scaled down, auto_map and
architectures kept), weights in two safetensors shards with model.safetensors.index.json, the
released generation_config.json, and Qwen2-style tokenizer files (the embedded tiny model's BPE
plus SDAR's special tokens: ``<|im_start|>``, ``<|im_end|>``, the mask ``<|MASK|>`` and the
rest Qwen3 declares, and the template's ``<think>`` and tool words) with SDAR's chat template
(Qwen3's). No SDAR MoE checkpoint's files are public beside its engines' loaders: its config is
the dense one plus Qwen3-MoE's keys, its expert weights Qwen3-MoE's names, as lmdeploy's and
SGLang's ``sdar_moe`` loaders read them.

It has never been trained: it shows the mechanics of block diffusion, not good answers.
``python -m dllm_local.tiny_checkpoints.random_sdar FOLDER [--moe]`` writes one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..tiny import checkpoint_cli

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# SDAR-4B/8B-Chat's chat_template.jinja (Qwen3's), verbatim.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# tokenizer_config.json's additional special tokens, as released.
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
           "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
           "<|video_pad|>", "<|MASK|>"]
TEMPLATE_WORDS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# JetLM/SDAR-4B-Chat's config.json, the sizes scaled down; ids are set from the tiny tokenizer.
DENSE = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention", "debug": False,
    "block_size": 4, "ep_size": 1, "fuse_cross_entropy": True, "head_dim": 16, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 2048,
    "max_window_layers": 2, "micro_forward": False, "model_type": "sdar", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False,
    "use_sliding_window": False,
}
# Qwen3-30B-A3B's expert keys (128 experts, 8 routed, 768 wide there), scaled down.
MOE = {
    "architectures": ["SDARMoeForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig", "AutoModel": "modeling_sdar_moe.SDARMoeModel",
                 "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"},
    "model_type": "sdar_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}


def tokenizer() -> PreTrainedTokenizerFast:
    """The tiny model's byte-level BPE with SDAR's special tokens, mask and chat template."""
    from transformers import PreTrainedTokenizerFast

    from ..models.loading.find import TINY_MODEL

    tok = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.add_tokens(TEMPLATE_WORDS)
    tok.mask_token = "<|MASK|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _write_tokenizer(tok: PreTrainedTokenizerFast, path: Path, tokenizer_class: str = "Qwen2Tokenizer") -> None:
    """The released tokenizer files: tokenizer.json, vocab.json and merges.txt, added_tokens.json,
    special_tokens_map.json, and tokenizer_config.json naming Qwen2Tokenizer (and its remote module,
    as released) with the template inline as well as in chat_template.jinja. ``tokenizer_class``:
    another class to name, without the remote module (a model trained on ``tok``'s own
    pre-tokenizer, which Qwen2Tokenizer's would replace)."""
    tok.save_pretrained(path)
    model = json.loads((path / "tokenizer.json").read_text())["model"]
    (path / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {t.content: i for i, t in tok.added_tokens_decoder.items()}
    (path / "added_tokens.json").write_text(json.dumps(dict(sorted(added.items())), indent=2))
    endoftext = {"content": tok.eos_token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"additional_special_tokens": SPECIAL, "eos_token": endoftext, "pad_token": endoftext}, indent=2))
    decoder = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                        "single_word": t.single_word, "special": t.special} for i, t in tok.added_tokens_decoder.items()}
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": SPECIAL,
        **({"auto_map": {"AutoTokenizer": ["tokenization_qwen2.Qwen2Tokenizer", None]}}
           if tokenizer_class == "Qwen2Tokenizer" else {}),
        "bos_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": tok.eos_token, "mask_token": "<|MASK|>", "errors": "replace", "model_max_length": 131072,
        "pad_token": tok.eos_token, "split_special_tokens": False, "tokenizer_class": tokenizer_class, "unk_token": None,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _write_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """Two shards and their index, as the released 4B and 8B checkpoints are stored."""
    from safetensors.torch import save_file

    names = list(state)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, part in enumerate(halves, 1):
        file = f"model-{i:05d}-of-{len(halves):05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, path / file, metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))


def build_checkpoint(path: str | Path, init_seed: int = 0, moe: bool = False, logit_scale: float = 32.0,
                     dtype: torch.dtype = torch.bfloat16, **sizes) -> Path:
    """Write a random SDAR (``moe``: SDAR MoE) to ``path``, its weights drawn from ``init_seed``.
    ``sizes`` override config keys; ``logit_scale`` multiplies the output head so that greedy
    decoding meets clear winners and some positions pass a 0.85 confidence threshold."""
    from ..models.sdar import SDARConfig, SDARForCausalLM, SDARMoeConfig, SDARMoeForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    raw = {**DENSE, **(MOE if moe else {}), **sizes, "vocab_size": len(tok), "bos_token_id": tok.eos_token_id,
           "eos_token_id": tok.eos_token_id, "mask_token_id": tok.convert_tokens_to_ids("<|MASK|>")}
    config_cls, model_cls = (SDARMoeConfig, SDARMoeForCausalLM) if moe else (SDARConfig, SDARForCausalLM)
    torch.manual_seed(init_seed)
    model = model_cls(config_cls.from_dict(raw)).eval()
    g = torch.Generator().manual_seed(init_seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
        for name, p in model.named_parameters():  # norms of ones would hide a norm applied to the wrong tensor
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    if raw["tie_word_embeddings"]:  # SDAR-1.7B: the head is the embedding, stored once
        del state["lm_head.weight"]
    _write_weights(state, path)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    generation = {"bos_token_id": tok.eos_token_id, "do_sample": True, "eos_token_id": [end_of_turn, tok.eos_token_id],
                  "pad_token_id": tok.eos_token_id, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                  "transformers_version": "4.51.0"}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=4))
    _write_tokenizer(tok, path)
    return path


if __name__ == "__main__":
    checkpoint_cli(build_checkpoint, __doc__, {"moe": ("SDAR MoE (sdar_moe) instead of dense SDAR", "moe", True)})
