"""One loader for real and tiny checkpoints: ``dllm_local.load(name_or_path)``.

A Hugging Face id is fetched with huggingface_hub (its progress bar shows) unless it is in the
local cache already; a local folder is read as is. ``trust_remote_code`` is never used: the
families are this project's own classes, chosen by the config's ``model_type``.
"""
from __future__ import annotations

import json
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from . import FAMILIES

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY_MODEL = ASSETS / "models" / "tiny-llada"
TINY_GUIDER = ASSETS / "models" / "tiny-guider"

# Short names the page and the CLI accept.
ALIASES = {
    "tiny": str(TINY_MODEL),
    "tiny-guider": str(TINY_GUIDER),
    "llada-8b-instruct": "GSAI-ML/LLaDA-8B-Instruct",
    "llada-1.5": "GSAI-ML/LLaDA-1.5",
    "dream-7b": "Dream-org/Dream-v0-Instruct-7B",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_STOP_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>")


@dataclass
class ModelHandle:
    """A loaded diffusion LM with everything the sampler needs to drive it."""

    name: str
    path: Path
    family: str
    model: Any
    tokenizer: Any
    mask_id: int
    eos_id: int
    stop_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    quantization: str | None
    num_parameters: int
    memory_bytes: int
    max_length: int

    def summary(self) -> dict:
        return {
            "name": self.name, "path": str(self.path), "family": self.family, "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""), "quantization": self.quantization or "none",
            "parameters": self.num_parameters, "memory_mb": round(self.memory_bytes / 2**20, 1),
            "max_length": self.max_length, "mask_id": self.mask_id, "stop_ids": list(self.stop_ids),
            "layers": int(getattr(self.model.config, "num_hidden_layers", 0) or getattr(self.model.config, "n_layers", 0)),
        }


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

    patterns = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelLoadError(_offline_message(name))
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


def check_weights(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, each checked to be present and complete."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        names = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{path} has no weights: expected model.safetensors or model.safetensors.index.json")
    files = []
    for name in names:
        f = path / name
        if not f.exists():
            raise ModelLoadError(f"weight file {name} named in the index is missing from {path}")
        _check_safetensors_complete(f)
        files.append(f)
    return files


def _check_safetensors_complete(f: Path) -> None:
    size = f.stat().st_size
    try:
        with f.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > size:
                raise ValueError
            header = json.loads(fh.read(header_len))
    except (struct.error, ValueError) as exc:
        raise ModelLoadError(f"weight file {f.name} is not a readable safetensors file ({size} bytes)") from exc
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    expected = 8 + header_len + end
    if size < expected:
        raise ModelLoadError(f"weight file {f.name} is truncated: {size} bytes, expected {expected}; download it again")


def _quantization_config(quantization: str | None, device: torch.device):
    if quantization in (None, "none"):
        return None
    if quantization not in ("8bit", "4bit"):
        raise ModelLoadError(f"quantization must be none, 8bit or 4bit, not {quantization!r}")
    if device.type != "cuda":
        raise ModelLoadError(f"{quantization} quantization needs a CUDA GPU (bitsandbytes); this run is on {device.type}")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(f"{quantization} quantization needs bitsandbytes: pip install bitsandbytes") from exc
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_type="nf4")


def pick_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    return device


def load_tokenizer(path: Path, family: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (ValueError, OSError, AttributeError):
        if family != "Dream":
            raise
    # Dream names a remote-code tokenizer class; its files are Qwen2's, which transformers has.
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(path)


def load(
    name_or_path: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    quantization: str | None = None,
    device_map: str | dict | None = None,
) -> ModelHandle:
    """Load a LLaDA or Dream checkpoint (a hub id, a local folder, or ``"tiny"``)."""
    _quiet_bitsandbytes()
    path = resolve_path(name_or_path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json; is it a model folder?")
    raw = json.loads(config_file.read_text())
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ModelLoadError(f"unsupported model_type {family!r} in {config_file}; supported: {', '.join(FAMILIES)}")
    check_weights(path)
    dev = pick_device(device)
    if dtype == "auto":
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    qconfig = _quantization_config(quantization, dev)
    config_cls, model_cls = FAMILIES[family]
    kwargs: dict[str, Any] = {"dtype": dtype}
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = device_map or {"": dev.index or 0}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    model, info = model_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ModelLoadError(f"weights in {path} do not match the {family} architecture: {bad}")
    if qconfig is None and device_map is None:
        model = model.to(dev)
    model.eval()
    tokenizer = load_tokenizer(path, family)
    config = model.config
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    vocab = tokenizer.get_vocab()
    stop_ids = tuple(dict.fromkeys([eos_id] + [vocab[t] for t in _STOP_TOKENS if t in vocab]))
    return ModelHandle(
        name=name_or_path, path=path, family=family, model=model, tokenizer=tokenizer,
        mask_id=int(config.mask_token_id), eos_id=int(eos_id), stop_ids=stop_ids,
        device=next(model.parameters()).device, dtype=dtype, quantization=None if qconfig is None else quantization,
        num_parameters=sum(p.numel() for p in model.parameters()),
        memory_bytes=model.get_memory_footprint(), max_length=config.max_positions,
    )


@dataclass
class GuiderHandle:
    """A small autoregressive model that checks the diffusion model's drafts (guided decoding)."""

    name: str
    model: Any
    tokenizer: Any
    num_parameters: int


def load_guider(name_or_path: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto") -> GuiderHandle:
    """Load a causal LM guider (any transformers architecture) by hub id, folder or ``tiny-guider``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_path(name_or_path)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json; is it a model folder?")
    check_weights(path)
    dev = pick_device(device)
    if dtype == "auto":
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False).to(dev).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    return GuiderHandle(name_or_path, model, tokenizer, sum(p.numel() for p in model.parameters()))


def _quiet_bitsandbytes() -> None:
    # bitsandbytes warns about optional GPU kernels when imported on a CPU-only machine.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
