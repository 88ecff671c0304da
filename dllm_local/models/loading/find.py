"""Finds a checkpoint's folder on disk from a short name, a local path or a Hugging Face hub id.

A hub id is fetched with huggingface_hub (its progress bar shows) unless it is in the local cache
already; a local folder is read as is.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import ModelLoadError
from ...hub import DOWNLOADED, HUB_MODELS, TINY_FAMILIES

ASSETS = Path(__file__).resolve().parents[3] / "assets"
TINY_MODEL = ASSETS / "models" / "tiny-llada"
TINY_GUIDER = ASSETS / "models" / "tiny-guider"
TINY_DIFFUSION_GEMMA = ASSETS / "models" / "tiny-diffusiongemma"  # random weights: tiny/diffusion_gemma.py

# Short names the page and the CLI accept.
ALIASES = {"tiny": str(TINY_MODEL), "tiny-guider": str(TINY_GUIDER), "tiny-diffusiongemma": str(TINY_DIFFUSION_GEMMA),
           **{name: str(ASSETS / "models" / name) for name in TINY_FAMILIES},
           **{name: repo for name, (repo, _) in HUB_MODELS.items()}}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_path(name_or_path: str) -> Path:
    """A local folder for ``name_or_path``, downloading a hub id when it is not cached yet."""
    name = ALIASES.get(name_or_path, name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; give the folder that holds config.json")
        return path
    if not _HUB_ID.match(name) or name.startswith((".", "/", "~")):
        raise ModelLoadError(f"model path {name!r} does not exist")
    from huggingface_hub import snapshot_download

    patterns = list(DOWNLOADED)
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelLoadError(_offline_message(name) + " To let this command download it, add --allow-downloads.")
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # network errors come in many classes; the advice is the same
        raise ModelLoadError(_offline_message(name) + f" ({type(exc).__name__}: {exc})") from exc


def _offline_message(repo_id: str) -> str:
    return (
        f"model {repo_id!r} is not in the local Hugging Face cache and could not be downloaded. "
        f"On a machine with internet run `huggingface-cli download {repo_id}` (or `hf download {repo_id}`), "
        f"or pass the path of a local copy."
    )
