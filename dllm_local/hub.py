"""The hub models this project lists by short name, and whether one is on this machine already.
Torch-free: the page decides before the engine downloads anything."""
from __future__ import annotations

# Short name -> (hub id, gigabytes of bf16 weights a download brings).
HUB_MODELS = {
    "llada-8b-instruct": ("GSAI-ML/LLaDA-8B-Instruct", 16.0),
    "llada-1.5": ("GSAI-ML/LLaDA-1.5", 16.0),
    "dream-7b": ("Dream-org/Dream-v0-Instruct-7B", 15.2),
}


def on_disk(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id`` (its config, at least)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
