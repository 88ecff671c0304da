"""The checks a checkpoint passes before anything is built from it.

Its files stay inside its folder and are whole, its config is of a supported family with a mask
id of its vocabulary, its weights are the config's, its chat template renders, and its weights fit
in the memory free where they go. Each failure is a ModelLoadError saying what is wrong.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from ...errors import DllmError, ModelLoadError
from ...files import parse_json, read_json, regular
from ...hub import JSON_MAX_BYTES, OPENED_SUFFIXES
from ...prompts import encode_prompt, render_chat
from .build import cause
from ..family import FamilySpec, all_specs, known, of_config
from ..protocol import FamilyConfig
from .quantize import BYTES_PER_VALUE, FULL_PRECISION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HEADER_MAX_BYTES = 100_000_000  # a safetensors header: safetensors' own limit


def checkpoint_root(path: Path) -> Path:
    """The folder a checkpoint's files must resolve under: the model folder, or for a snapshot of
    the Hugging Face cache (whose files link to ../../blobs) the repository's cache folder."""
    path = path.resolve()
    return path.parent.parent if path.parent.name == "snapshots" else path


def inside(path: Path, name: str, what: str) -> Path:
    """``path / name`` when it (links followed) is a regular file under the checkpoint's folder or
    the hub cache: an index entry, a link or a tokenizer file may not open anything elsewhere
    (``/etc/passwd``, ``../other/x.safetensors``, ``/dev/zero``)."""
    f = path / name
    resolved = f.resolve()
    from huggingface_hub.constants import HF_HUB_CACHE

    # A folder made by `hf download --local-dir` (older versions) links its files into the hub cache.
    roots = (checkpoint_root(path), Path(HF_HUB_CACHE).resolve())
    if not any(resolved.is_relative_to(root) for root in roots):
        raise ModelLoadError(f"{what} {name!r} in {path} leads outside the model's folder: a checkpoint's files stay "
                             "in its folder")
    if f.exists() or f.is_symlink():  # a missing one is the caller's to name
        regular(f, f"{what} {name!r} in {path}", ModelLoadError)
    return f


def check_folder(path: Path) -> None:
    """Every file of the model folder that gets opened (config, tokenizer files, generation config,
    index, weights; links followed) is a regular file under it, or in the hub cache, and each JSON
    one is within ``read_json``'s bounds (size, depth), before any of them is opened by this
    project, transformers or tokenizers (Python's own JSON parser meets a deep file with a RecursionError)."""
    for entry in path.iterdir():
        if entry.name.endswith(OPENED_SUFFIXES):
            f = inside(path, entry.name, "file")
            if f.name.endswith(".json"):
                read_json(f, JSON_MAX_BYTES, str(f), ModelLoadError)


def read_json_object(file: Path) -> dict:
    """The JSON object in ``file``, read within ``read_json``'s bounds; another JSON type is a ModelLoadError."""
    data = read_json(file, JSON_MAX_BYTES, str(file), ModelLoadError)
    if not isinstance(data, dict):
        raise ModelLoadError(f"{file} must hold a JSON object, not a {type(data).__name__}")
    return data


def check_weights(path: Path) -> dict[str, dict]:
    """The tensors of a checkpoint (name -> its safetensors header entry: dtype, shape, and the
    file holding it), from its safetensors files, each checked to be present and complete."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index} has no weight_map (tensor name -> file name); download the checkpoint again")
        names = sorted(set(weight_map.values()))
    elif (path / "model.safetensors").exists():
        names = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{path} has no weights: expected model.safetensors or model.safetensors.index.json")
    tensors: dict[str, dict] = {}
    for name in names:
        f = inside(path, name, "weight file")
        if not f.exists():
            raise ModelLoadError(f"weight file {name} named in the index is missing from {path}")
        header = _check_safetensors_complete(f)
        tensors.update({k: {**v, "file": name} for k, v in header.items() if k != "__metadata__"})
    return tensors


def _check_safetensors_complete(f: Path) -> dict:
    """The file's header (tensor name -> dtype, shape, offsets), once the file is known to hold
    every byte the header names, each tensor's bytes where the header says and of its size."""
    size = regular(f, f"weight file {f.name}", ModelLoadError).st_size
    try:
        with f.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > min(size, HEADER_MAX_BYTES):
                raise ValueError
            header = parse_json(fh.read(header_len), f"the header of weight file {f.name}", ModelLoadError)
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        if not all(map(_is_tensor_entry, entries.values())):
            raise ValueError("a tensor's dtype, shape or data_offsets is not one")
    except (struct.error, ValueError, AttributeError, KeyError, IndexError, TypeError) as exc:
        # A short file, a header that is not JSON, or JSON that is not a tensor table.
        raise ModelLoadError(f"weight file {f.name} is not a readable safetensors file ({size} bytes)") from exc
    _check_offsets(f, entries, size - 8 - header_len)
    return header


def _sizes(value: Any) -> bool:
    return type(value) is list and all(type(d) is int and d >= 0 for d in value)


def _is_tensor_entry(entry: Any) -> bool:
    """A header entry as safetensors writes it: a dtype name, a shape and two byte offsets."""
    return (isinstance(entry, dict) and type(entry.get("dtype")) is str and _sizes(entry.get("shape"))
            and _sizes(entry.get("data_offsets")) and len(entry["data_offsets"]) == 2)


# Bytes per value of each safetensors dtype with whole bytes (the format's own names).
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _check_offsets(f: Path, entries: dict[str, dict], data_bytes: int) -> None:
    """The tensors' bytes lie end to end over the file's data, each as long as its shape and dtype
    need: safetensors refuses any other file, with an error from deep inside transformers."""
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in entries.items())
    for start, end, name in spans:
        needed = math.prod(entries[name]["shape"]) * DTYPE_BYTES.get(entries[name].get("dtype"), 0)
        if end < start or (entries[name].get("dtype") in DTYPE_BYTES and end - start != needed):
            raise ModelLoadError(f"weight file {f.name}: {name}'s data_offsets [{start}, {end}] hold {end - start} "
                                 f"bytes, its shape and dtype need {needed}: the header does not fit the tensor")
    last = max(spans, key=lambda span: span[1], default=(0, 0, ""))
    if last[1] > data_bytes:
        raise ModelLoadError(f"weight file {f.name} is truncated: its data is {data_bytes} bytes, {last[2]}'s "
                             f"data_offsets end at {last[1]}; download it again")
    for (_, end, before), (start, _, name) in zip([(0, 0, "")] + spans, spans):
        if start != end:
            after = f"{before}'s end at {end}" if before else "the data begins at 0"
            raise ModelLoadError(f"weight file {f.name}: {name}'s data_offsets start at {start}, {after}: tensors "
                                 f"{'overlap' if start < end else 'leave a gap'}; safetensors data is tensors end to end")
    if last[1] < data_bytes:
        raise ModelLoadError(f"weight file {f.name} has {data_bytes - last[1]} bytes after its last tensor: "
                             "safetensors data ends where its last tensor does")


FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


def check_tensors(family: FamilySpec, config: Any, tensors: dict[str, dict], path: Path) -> None:
    """The weights against the config before a model is built: floating point, of this family
    (its ``weights``: the embedding's name), with the embedding's shape and the number of blocks
    the config says.
    A checkpoint of another family, or a config of other sizes, would otherwise allocate a model
    of the config's size and fail (or load garbage) inside transformers."""
    ints = sorted(k for k, v in tensors.items() if v.get("dtype") not in FLOAT_DTYPES)
    if ints:
        raise ModelLoadError(f"the weights in {path} hold {tensors[ints[0]].get('dtype')} tensors ({ints[0]} and "
                             f"{len(ints) - 1} more): a checkpoint's weights are floating point (BF16, F16 or F32)")
    weights = family.weights
    embedding = weights.embedding
    if embedding not in tensors:
        others = [s.model_type for s in all_specs() if s is not family and s.weights.embedding in tensors]
        raise ModelLoadError(f"the weights in {path} have no {embedding}: they are not a {family.model_type} "
                             "checkpoint's" + (f" but a {others[0]} one's: config.json's model_type is wrong"
                                               if others else ""))
    shape, layers = weights.sizes(config)
    if list(tensors[embedding].get("shape") or []) != shape:
        raise ModelLoadError(f"config.json in {path} makes the embedding {shape} (vocabulary x width), the weights' is "
                             f"{tensors[embedding].get('shape')}: the config and the weights are of different models")
    found = weights.block_indices(tensors)
    if found != set(range(layers)):
        raise ModelLoadError(f"config.json in {path} says {layers} layers, the weights have {len(found)}: the config "
                             "and the weights are of different models")


def needed_bytes(tensors: dict[str, dict], dtype: torch.dtype, quantization: str | None) -> int:
    """The bytes the weights take once loaded in ``dtype`` (4-bit and 8-bit: their two-dimensional
    weights, but the embedding and the head, at half a byte or one byte a value), from the headers."""
    per_value = BYTES_PER_VALUE.get(quantization or "none")
    total = 0.0
    for name, entry in tensors.items():
        shape = entry["shape"]
        quantized = per_value is not None and len(shape) == 2 and name not in FULL_PRECISION
        total += math.prod(shape) * (per_value if quantized else dtype.itemsize)
    return int(total)


def check_memory(path: Path, needed: int, free: int | None, device: torch.device,
                 quantization: str | None = None) -> None:
    """Refuse a model that cannot fit before any of it is allocated (a config of the wrong sizes
    once allocated a default-size 7B model and took the machine down)."""
    if free is not None and needed > free:
        smaller = "" if quantization == "4bit" else "4-bit quantization, "
        raise ModelLoadError(f"the weights in {path} need about {needed / 2**30:.1f} GB on {device.type}, and "
                             f"{free / 2**30:.1f} GB is free: try {smaller}another device, or close other programs")


def _remote_code_note(raw: dict) -> str:
    # auto_map is transformers' hook for code shipped with a checkpoint; ours is never run.
    return "; its auto_map names remote code, and this app runs no remote code" if "auto_map" in raw else ""


def check_family(raw: dict, config_file: Path) -> FamilySpec:
    """The registered family the config is (``family.of_config``: its model_type's, or one that
    claims it); the released configs' auto_map (remote code for the same architecture) is
    ignored, since our own classes implement it."""
    family = of_config(raw)
    if family is not None:
        return family
    raise ModelLoadError(f"unsupported model_type {raw.get('model_type')!r} in {config_file}{_remote_code_note(raw)}; "
                         f"supported natively: {', '.join(s.model_type for s in all_specs())}")


def check_guider_type(raw: dict, name: str, config_file: Path) -> None:
    """A guider's config is of a causal LM built into transformers, not one of our diffusion families."""
    from transformers import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if known(model_type):
        raise ModelLoadError(f"{name} is a diffusion model ({model_type}); a guider, or --autoregressive, "
                             "takes an autoregressive (causal) LM such as Llama or Qwen2, like tiny-guider")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelLoadError(f"guider model_type {model_type!r} in {config_file} is not built into "
                             f"transformers{_remote_code_note(raw)}; use a causal LM such as Llama or Qwen2")


def check_mask_id(raw: dict, config: FamilyConfig, config_file: Path, tokenizer: PreTrainedTokenizerBase,
                  mask_token: str | None = None) -> int:
    """The mask token id from config.json, checked against the vocabulary; for a family whose
    config names none (SDAR, Fast-dLLM v2), ``mask_token``'s id in the tokenizer. The config
    classes' default is the 8B model's id: a config without the key would load and fail every run."""
    if "mask_token_id" not in raw and mask_token is not None:
        mask_id = tokenizer.convert_tokens_to_ids(mask_token)
        if mask_id is None or mask_id == tokenizer.unk_token_id:
            raise ModelLoadError(f"the tokenizer in {config_file.parent} has no {mask_token!r}, this family's mask "
                                 f"token, and {config_file} names no mask_token_id; check the tokenizer files")
    elif "mask_token_id" not in raw:
        raise ModelLoadError(f"{config_file} has no mask_token_id: a diffusion LM needs the id of its mask token; "
                             f"add it to config.json (LLaDA: 126336, Dream: 151666)")
    else:
        mask_id = raw["mask_token_id"]
    if type(mask_id) is not int or not 0 <= mask_id < config.vocab_size:
        raise ModelLoadError(f"mask_token_id {mask_id!r} in {config_file} is not a token id of this model "
                             f"(vocab_size {config.vocab_size})")
    return mask_id


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """The chat template rendered once (within ``render_chat``'s time), then a prompt encoded and
    decoded as a run does, before the weights load: a template that does not render or does not
    end, or tokenizer files that load but do not encode (a model_max_length of text), are told here,
    not at the first prompt."""
    try:
        if tokenizer.chat_template:
            render_chat(tokenizer, [{"role": "user", "content": "Hi"}])
    except DllmError as exc:  # it did not finish
        raise ModelLoadError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - jinja raises many classes; the message is the point
        raise ModelLoadError(f"the chat template in {path} does not render ({cause(exc)}); fix it "
                             "(chat_template.jinja, or chat_template in tokenizer_config.json)") from None
    try:
        tokenizer.decode(encode_prompt(SimpleNamespace(tokenizer=tokenizer), "Hi"))
    except Exception as exc:  # noqa: BLE001 - as above: the tokenizer files' failures come in many classes
        raise ModelLoadError(f"the tokenizer in {path} does not encode a prompt ({cause(exc)}); check its "
                             "tokenizer files") from None
