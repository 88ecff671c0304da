"""One loader for real and tiny checkpoints: ``dllm_local.load(name_or_path)``, and its handles.

A checkpoint is found (``find``), checked (``checks``), built (``build``, ``quantize``) and placed
(``placement``); ``trust_remote_code`` is never used: the families are this project's own classes,
chosen by the config's ``model_type``. The names of those modules that others use stay importable
from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ... import kinds
from ...errors import ModelLoadError, SettingsError
from ...tiny.tasks import TASKS
from .. import diffusion_gemma
from ..family import FamilySpec
from .build import build_model, family_config, load_tokenizer, reading
from .checks import (check_family, check_folder, check_guider_type, check_mask_id, check_memory,
                     check_tensors, check_tokenizer, check_weights, needed_bytes, read_json_object)
from .find import ALIASES, ASSETS, TINY_GUIDER, TINY_MODEL, resolve_path
from .footprint import arithmetic_parameters, logical_parameters, weight_read_bytes
from .placement import apply_threads, auto_cuda_dtype, free_bytes, free_device_memory, pick_device, pick_dtype
from ..protocol import DiffusionLM
from .quantize import quantization_config, quiet_bitsandbytes
from .shapes import check_config_sizes, check_shapes, meta_model

__all__ = ["ALIASES", "ASSETS", "TINY_GUIDER", "TINY_MODEL", "GuiderHandle", "ModelHandle", "apply_threads",
           "auto_cuda_dtype", "check_memory", "check_weights", "free_device_memory", "load", "load_guider",
           "load_tokenizer", "needed_bytes", "pick_device", "pick_dtype", "resolve_path"]

_STOP_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>")


@dataclass
class ModelHandle:
    """A loaded diffusion LM with everything the sampler needs to drive it."""

    name: str
    path: Path
    family: str
    model: DiffusionLM
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
    # The longest answer region the model was trained on, when its config.json says (the tiny
    # model's "trained_gen_length"); decoding past it is allowed, with a notice.
    trained_length: int | None = None
    # The tiny tasks it was trained on (config.json's "trained_tasks", the project's own models):
    # () for a random checkpoint, None for a model the project did not make.
    trained_tasks: tuple[str, ...] | None = None
    # Bytes one forward reads (weights as stored, without the input embedding): the cost model's term.
    weight_read_bytes: int = 0
    kind: str = "masked"  # the name of its kind (``kinds.get``): how it decodes
    experts: tuple[int, int] | None = None  # a mixture of experts': (per layer, routed per token)
    canvas_length: int | None = None  # a canvas model's tokens per canvas
    canvas_defaults: dict | None = None  # its knobs' values when a run leaves them unset
    # A block-diffusion model's block (its blocks sit at absolute positions, causal between them).
    block_size: int | None = None

    def require_masked(self, what: str) -> None:
        """Refuse ``what`` (a masked-diffusion tool: policies compared, requests packed) before it
        starts, for a canvas model, with what it can do instead."""
        kind = kinds.get(self.kind)
        if not kind.has_mask:
            raise SettingsError(kind.masked_tools_refusal.format(what=what, name=self.name))

    def quantized_parts(self) -> tuple[float, list[str]]:
        """The share of the parameters in quantized layers, and the modules that hold them (their
        first three name parts: ``model.decoder.self_conditioning``): transformers leaves tied weights unquantized, which for some families
        (DiffusionGemma: every text layer) is most of the model."""
        counts = {"all": 0, "quantized": 0}
        groups = set()
        for name, module in self.model.named_modules():
            quantized = type(module).__name__ in ("Linear4bit", "Linear8bitLt")
            for param in module.parameters(recurse=False):
                size = logical_parameters(torch.nn.ParameterList([param]))
                counts["all"] += size
                counts["quantized"] += size * quantized
            if quantized:
                groups.add(".".join(name.split(".")[:3]))
        return counts["quantized"] / max(1, counts["all"]), sorted(groups)

    def decoding(self) -> dict:
        """How the loaded model decodes, as ``decoding_facts`` reads it from a config."""
        kind = kinds.get(self.kind)  # a canvas model's class (transformers' own) declares no block
        return kind.decoding(self.block_size, self.model.sub_block) if kind.own_block else kind.decoding()

    def summary(self) -> dict:
        """What the handle holds, as JSON values (``python -m dllm_local info`` prints it)."""
        return {
            "name": self.name, "path": str(self.path), "family": self.family, "device": str(self.device),
            # The GPU by name: the page matches it to a device profile, for the floor of a measured step.
            **({"gpu_name": torch.cuda.get_device_name(self.device)} if self.device.type == "cuda" else {}),
            "dtype": str(self.dtype).replace("torch.", ""), "quantization": self.quantization or "none",
            "parameters": self.num_parameters, "arithmetic_parameters": arithmetic_parameters(self.model),
            "memory_mb": round(self.memory_bytes / 2**20, 1),
            "weight_read_mb": round(self.weight_read_bytes / 2**20, 1),
            "max_length": self.max_length, "trained_length": self.trained_length, "mask_id": self.mask_id, "stop_ids": list(self.stop_ids),
            "layers": self.model.config.get_text_config().num_hidden_layers, "kind": self.kind,
            **({"experts": self.experts[0], "active_experts": self.experts[1]} if self.experts else {}),
            **({"block_size": self.block_size} if self.block_size else {}),
            # A shifted head reads a position's logits from the one before it (Dream, Fast-dLLM v2).
            **({"shifted_head": True} if kinds.get(self.kind).has_mask and not self.model.packs_requests else {}),
            # Trained on the tiny task suite (our models; [] for a random checkpoint; absent: not ours).
            **({"trained_tasks": list(self.trained_tasks)} if self.trained_tasks is not None else {}),
            **({"sub_block": self.model.sub_block} if kinds.get(self.kind).own_block and self.model.sub_block else {}),
            **({"canvas_length": self.canvas_length, "canvas_defaults": self.canvas_defaults}
               if self.canvas_length else {}),
            **self._quantization_summary(),
        }

    def _quantization_summary(self) -> dict:
        if not self.quantization:
            return {}
        share, groups = self.quantized_parts()
        return {"quantized_share": round(share, 4), "quantized_modules": groups}


@dataclass
class GuiderHandle:
    """A small autoregressive model that checks the diffusion model's drafts (guided decoding)."""

    name: str
    model: Any
    tokenizer: Any
    num_parameters: int


class _Checkpoint(NamedTuple):
    """A checkpoint's folder, found and checked, with its config.json and what that holds."""

    path: Path
    config_file: Path
    raw: dict


def _read_config(path: Path) -> tuple[Path, dict]:
    """The folder's config.json and its JSON object."""
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json; is it a model folder?")
    return config_file, read_json_object(config_file)


def _open(name_or_path: str) -> _Checkpoint:
    """The checkpoint ``name_or_path`` names, its folder's files checked before any is read."""
    path = resolve_path(name_or_path)
    check_folder(path)
    return _Checkpoint(path, *_read_config(path))


def _trained_length(raw: dict) -> int | None:
    value = raw.get("trained_gen_length")
    return value if type(value) is int and value > 0 else None


def _trained_tasks(raw: dict) -> tuple[str, ...] | None:
    value = raw.get("trained_tasks")
    return tuple(t for t in value if t in TASKS) if isinstance(value, list) else None


def decoding_facts(name_or_path: str) -> dict:
    """How a checkpoint decodes, from its config alone (no weights read): its kind and, for a
    block-diffusion model, the block and sub-block its class declares (built on the meta device)."""
    path, config_file, raw = _open(name_or_path)
    family = check_family(raw, config_file)
    family.rules.enforce(raw, family.config, config_file)
    kind = kinds.get(family.kind)
    if not kind.own_block:
        return kind.decoding()
    model = meta_model(family, family_config(raw, family, config_file), config_file)
    return kind.decoding(model.block_size, model.sub_block)


def load(
    name_or_path: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    quantization: str | None = None,
    device_map: str | dict | None = None,
) -> ModelHandle:
    """Load a LLaDA, Dream or DiffusionGemma checkpoint (a hub id, a local folder, or a short name)."""
    quiet_bitsandbytes()
    path, config_file, raw = _open(name_or_path)
    family = check_family(raw, config_file)
    family.rules.enforce(raw, family.config, config_file)  # before any config class or module is built
    config = family_config(raw, family, config_file)
    check_config_sizes(family, config, config_file)
    has_mask = kinds.get(family.kind).has_mask
    tensors = check_weights(path)
    check_tensors(family, config, tensors, path)
    check_shapes(family, config, tensors, config_file)
    tokenizer = load_tokenizer(path, family)
    mask_id = None if not has_mask else check_mask_id(raw, config, config_file, tokenizer, family.mask_token)
    check_tokenizer(tokenizer, path)
    dev = pick_device(device)
    dtype = pick_dtype(dtype, dev, quantization)
    if device_map is None:  # one device: spread over several, the placement is transformers' own
        check_memory(path, needed_bytes(tensors, dtype, quantization), free_bytes(dev), dev, quantization)
    qconfig = quantization_config(quantization, dtype)
    model = build_model(path, family, config, dtype, dev, qconfig, device_map)
    if not has_mask:
        return _canvas_handle(name_or_path, path, family, model, tokenizer, dtype,
                              quantization if qconfig else None, raw)
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if type(eos_id) is not int:
        raise ModelLoadError(f"{path} names no end-of-text token: set eos_token_id in {config_file}")
    vocab = tokenizer.get_vocab()
    stop_ids = tuple(dict.fromkeys([eos_id] + [vocab[t] for t in _STOP_TOKENS if t in vocab]))
    return ModelHandle(
        name=name_or_path, path=path, family=family.model_type, model=model, tokenizer=tokenizer,
        mask_id=mask_id, eos_id=eos_id, stop_ids=stop_ids,
        device=next(model.parameters()).device, dtype=dtype, quantization=None if qconfig is None else quantization,
        num_parameters=logical_parameters(model),  # a 4-bit weight's numel counts packed pairs
        memory_bytes=model.get_memory_footprint(), max_length=config.max_positions,
        trained_length=_trained_length(raw), trained_tasks=_trained_tasks(raw), weight_read_bytes=weight_read_bytes(model),
        kind=family.kind, experts=model.experts, block_size=model.block_size,
    )


def _canvas_handle(name: str, path: Path, family: FamilySpec, model, tokenizer, dtype: torch.dtype,
                   quantization: str | None, raw: dict) -> ModelHandle:
    """A canvas model's handle: no mask token (a canvas starts as random tokens; ``mask_id`` holds
    the pad token, which fills a finished answer), its end tokens from its generation config."""
    return ModelHandle(
        name=name, path=path, family=family.model_type, model=model, tokenizer=tokenizer,
        mask_id=diffusion_gemma.pad_token(model), eos_id=diffusion_gemma.end_of_text(model, path),
        stop_ids=diffusion_gemma.end_tokens(model),
        device=next(model.parameters()).device, dtype=dtype, quantization=quantization,
        num_parameters=logical_parameters(model), memory_bytes=model.get_memory_footprint(),
        max_length=diffusion_gemma.max_positions(model.config), weight_read_bytes=weight_read_bytes(model),
        kind=family.kind, experts=diffusion_gemma.experts(model.config), canvas_length=model.config.canvas_length,
        canvas_defaults=diffusion_gemma.knob_defaults(model), trained_tasks=_trained_tasks(raw),
    )


def load_guider(name_or_path: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto") -> GuiderHandle:
    """Load a causal LM guider (any transformers architecture) by hub id, folder or ``tiny-guider``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, config_file, raw = _open(name_or_path)
    check_guider_type(raw, name_or_path, config_file)
    check_weights(path)
    dev = pick_device(device)
    with reading(f"the guider in {path} could not be loaded"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, dev), trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    model = model.to(dev).eval()
    return GuiderHandle(name_or_path, model, tokenizer, sum(p.numel() for p in model.parameters()))
