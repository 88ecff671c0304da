"""One loader for real and tiny checkpoints: ``dllm_local.load(name_or_path)``.

A Hugging Face id is fetched with huggingface_hub (its progress bar shows) unless it is in the
local cache already; a local folder is read as is. ``trust_remote_code`` is never used: the
families are this project's own classes, chosen by the config's ``model_type``.
"""
from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from ..errors import ModelLoadError
from . import FAMILIES
from ..hub import DOWNLOADED, HUB_MODELS, OPENED_SUFFIXES
from .footprint import logical_parameters, weight_read_bytes

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY_MODEL = ASSETS / "models" / "tiny-llada"
TINY_GUIDER = ASSETS / "models" / "tiny-guider"

# Short names the page and the CLI accept.
ALIASES = {"tiny": str(TINY_MODEL), "tiny-guider": str(TINY_GUIDER),
           **{name: repo for name, (repo, _) in HUB_MODELS.items()}}
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
    # The longest answer region the model was trained on, when its config.json says (the tiny
    # model's "trained_gen_length"); decoding past it is allowed, with a notice.
    trained_length: int | None = None
    # Bytes one forward reads (weights as stored, without the input embedding): the cost model's term.
    weight_read_bytes: int = 0

    def summary(self) -> dict:
        return {
            "name": self.name, "path": str(self.path), "family": self.family, "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""), "quantization": self.quantization or "none",
            "parameters": self.num_parameters, "memory_mb": round(self.memory_bytes / 2**20, 1),
            "weight_read_mb": round(self.weight_read_bytes / 2**20, 1),
            "max_length": self.max_length, "trained_length": self.trained_length, "mask_id": self.mask_id, "stop_ids": list(self.stop_ids),
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

    patterns = list(DOWNLOADED)
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


JSON_MAX_BYTES = 64 * 2**20  # a checkpoint's JSON (config, index, tokenizer): kilobytes to some MB


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
    if f.exists() and not resolved.is_file():
        raise ModelLoadError(f"{what} {name!r} in {path} is not a regular file")
    return f


def check_folder(path: Path) -> None:
    """Every file of the model folder that gets opened (config, tokenizer files, weights; links
    followed) is a regular file under it, or in the hub cache, before any of them is opened."""
    for entry in path.iterdir():
        if entry.name.endswith(OPENED_SUFFIXES) and (entry.is_symlink() or entry.is_file()):
            f = inside(path, entry.name, "file")
            if f.name.endswith(".json") and f.exists() and f.stat().st_size > JSON_MAX_BYTES:
                raise ModelLoadError(f"{f} is {f.stat().st_size / 2**20:.0f} MB, more than a checkpoint's JSON holds")


def check_weights(path: Path) -> dict[str, dict]:
    """The tensors of a checkpoint (name -> its safetensors header entry: dtype, shape), from
    its safetensors files, each checked to be present and complete."""
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
        tensors.update({k: v for k, v in _check_safetensors_complete(f).items() if k != "__metadata__"})
    return tensors


def _check_safetensors_complete(f: Path) -> dict:
    """The file's header (tensor name -> dtype, shape, offsets), once the file is known to hold
    every byte the header names."""
    size = f.stat().st_size
    try:
        with f.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > size:
                raise ValueError
            header = json.loads(fh.read(header_len))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if not all(type(v.get("shape")) is list and all(type(d) is int and d >= 0 for d in v["shape"])
                   for k, v in header.items() if k != "__metadata__"):
            raise ValueError("a tensor's shape is not a list of sizes")
    except (struct.error, ValueError, AttributeError, KeyError, IndexError, TypeError) as exc:
        # A short file, a header that is not JSON, or JSON that is not a tensor table.
        raise ModelLoadError(f"weight file {f.name} is not a readable safetensors file ({size} bytes)") from exc
    expected = 8 + header_len + end
    if size < expected:
        raise ModelLoadError(f"weight file {f.name} is truncated: {size} bytes, expected {expected}; download it again")
    return header


# Each family's input embedding and block names in its weights, and the config sizes they must have.
_LAYOUT = {
    "llada": ("model.transformer.wte.weight", re.compile(r"model\.transformer\.blocks\.(\d+)\."),
              lambda c: ([c.embedding_size or c.vocab_size, c.d_model], c.n_layers)),
    "Dream": ("model.embed_tokens.weight", re.compile(r"model\.layers\.(\d+)\."),
              lambda c: ([c.vocab_size, c.hidden_size], c.num_hidden_layers)),
}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


# Tensors a quantized load keeps in full precision: the families' input embeddings and output heads.
FULL_PRECISION = {"model.transformer.wte.weight", "model.transformer.ff_out.weight", "model.embed_tokens.weight",
                  "lm_head.weight"}


def needed_bytes(tensors: dict[str, dict], dtype: torch.dtype, quantization: str | None) -> int:
    """The bytes the weights take once loaded in ``dtype`` (4-bit and 8-bit: their two-dimensional
    weights, but the embedding and the head, at half a byte or one byte a value), from the headers."""
    per_value = {"4bit": 0.5, "8bit": 1.0}.get(quantization or "none")
    total = 0.0
    for name, entry in tensors.items():
        shape = entry["shape"]
        quantized = per_value is not None and len(shape) == 2 and name not in FULL_PRECISION
        total += math.prod(shape) * (per_value if quantized else dtype.itemsize)
    return int(total)


def free_bytes(device: torch.device) -> int | None:
    """Memory free for the model where it goes: the GPU's, or the machine's (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available


def check_memory(path: Path, needed: int, free: int | None, device: torch.device,
                 quantization: str | None = None) -> None:
    """Refuse a model that cannot fit before any of it is allocated (a config of the wrong sizes
    once allocated a default-size 7B model and took the machine down)."""
    if free is not None and needed > free:
        smaller = "" if quantization == "4bit" else "4-bit quantization, "
        raise ModelLoadError(f"the weights in {path} need about {needed / 2**30:.1f} GB on {device.type}, and "
                             f"{free / 2**30:.1f} GB is free: try {smaller}another device, or close other programs")


def check_tensors(family: str, config: Any, tensors: dict[str, dict], path: Path) -> None:
    """The weights against the config before a model is built: floating point, of this family
    (its embedding's name), with the embedding's shape and the number of blocks the config says.
    A checkpoint of another family, or a config of other sizes, would otherwise allocate a model
    of the config's size and fail (or load garbage) inside transformers."""
    ints = sorted(k for k, v in tensors.items() if v.get("dtype") not in FLOAT_DTYPES)
    if ints:
        raise ModelLoadError(f"the weights in {path} hold {tensors[ints[0]].get('dtype')} tensors ({ints[0]} and "
                             f"{len(ints) - 1} more): a checkpoint's weights are floating point (BF16, F16 or F32)")
    embedding, block, sizes = _LAYOUT[family]
    if embedding not in tensors:
        others = [f for f, (name, _, _) in _LAYOUT.items() if f != family and name in tensors]
        raise ModelLoadError(f"the weights in {path} have no {embedding}: they are not a {family} checkpoint's"
                             + (f" but a {others[0]} one's: config.json's model_type is wrong" if others else ""))
    shape, layers = sizes(config)
    if list(tensors[embedding].get("shape") or []) != shape:
        raise ModelLoadError(f"config.json in {path} makes the embedding {shape} (vocabulary x width), the weights' is "
                             f"{tensors[embedding].get('shape')}: the config and the weights are of different models")
    found = {int(m.group(1)) for m in map(block.match, tensors) if m}
    if found != set(range(layers)):
        raise ModelLoadError(f"config.json in {path} says {layers} layers, the weights have {len(found)}: the config "
                             "and the weights are of different models")


def _quantization_config(quantization: str | None, dtype: torch.dtype):
    """bitsandbytes' config for ``quantization``. It runs on CUDA and, slowly, on the CPU.

    4-bit computes in the model's dtype. 8-bit runs pure int8 matmuls (``llm_int8_threshold=0``):
    the default outlier split (6.0) costs a host sync per Linear per forward to find the outlier
    columns (about 450 per step on LLaDA-8B), which would hide the cache policies' differences."""
    if quantization in (None, "none"):
        return None
    if quantization not in ("8bit", "4bit"):
        raise ModelLoadError(f"quantization must be none, 8bit or 4bit, not {quantization!r}")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(f"{quantization} quantization needs bitsandbytes: pip install bitsandbytes") from exc
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_type="nf4")


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: the device named by the environment variable DLLM_LOCAL_DEVICE when it is set
    (the tests set it to cpu, so they run the same on a CUDA machine), else CUDA when there is one."""
    if str(device) == "auto":
        device = os.environ.get("DLLM_LOCAL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"device {device!r} is not a device name: use auto, cpu, cuda or cuda:N") from exc
    if parsed.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported: use auto, cpu, cuda or cuda:N")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return parsed


def free_device_memory() -> None:
    """Give a released model's memory back: collect the reference cycles its modules hold, then
    hand the blocks CUDA's allocator keeps cached back to the GPU (none where CUDA never started)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def pick_dtype(dtype: str | torch.dtype, device: torch.device, quantization: str | None = None) -> torch.dtype:
    """``"auto"``, a floating torch dtype, or its name ("bfloat16"). Auto: float32 on the CPU;
    on CUDA bfloat16 where the GPU computes in it natively (Ampere and later), else float16 (T4,
    V100 and RTX 20 run bf16 through slow emulated kernels). 8-bit always computes in float16:
    bitsandbytes casts anything else to it (and warns)."""
    if dtype == "auto":
        if quantization == "8bit":
            return torch.float16
        if device.type != "cuda":
            return torch.float32
        return auto_cuda_dtype(torch.cuda.get_device_capability(device))
    value = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ModelLoadError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    return value


def auto_cuda_dtype(capability: tuple[int, int]) -> torch.dtype:
    """bfloat16 on GPUs with native bf16 math (compute capability 8.0 and later), else float16."""
    return torch.bfloat16 if capability >= (8, 0) else torch.float16


def read_json_object(file: Path) -> dict:
    """The JSON object in ``file``; unreadable JSON or another JSON type is a ModelLoadError."""
    try:
        if file.stat().st_size > JSON_MAX_BYTES:
            raise ValueError(f"{file.stat().st_size} bytes, more than a checkpoint's JSON holds")
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise ModelLoadError(f"{file} is not readable JSON ({exc}); download the checkpoint again or fix the file") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{file} must hold a JSON object, not a {type(data).__name__}")
    return data


def _remote_code_note(raw: dict) -> str:
    # auto_map is transformers' hook for code shipped with a checkpoint; ours is never run.
    return "; its auto_map names remote code, and this app runs no remote code" if "auto_map" in raw else ""


def _family(raw: dict, config_file: Path) -> str:
    """The config's model_type when it is one of ours; the released configs' auto_map (remote code
    for the same architecture) is ignored, since our own classes implement it."""
    family = raw.get("model_type")
    if isinstance(family, str) and family in FAMILIES:
        return family
    raise ModelLoadError(f"unsupported model_type {family!r} in {config_file}{_remote_code_note(raw)}; "
                         f"supported natively: {', '.join(FAMILIES)}")


def _mask_id(raw: dict, config: Any, config_file: Path) -> int:
    """The mask token id from config.json, checked against the vocabulary. The config classes'
    default is the 8B model's id: a config without the key would load and fail every run."""
    if "mask_token_id" not in raw:
        raise ModelLoadError(f"{config_file} has no mask_token_id: a diffusion LM needs the id of its mask token; "
                             f"add it to config.json (LLaDA: 126336, Dream: 151666)")
    mask_id = raw["mask_token_id"]
    if type(mask_id) is not int or not 0 <= mask_id < config.vocab_size:
        raise ModelLoadError(f"mask_token_id {mask_id!r} in {config_file} is not a token id of this model "
                             f"(vocab_size {config.vocab_size})")
    return mask_id


def _trained_length(raw: dict) -> int | None:
    value = raw.get("trained_gen_length")
    return value if type(value) is int and value > 0 else None


def _config(raw: dict, family: str, config_file: Path):
    config_cls, _ = FAMILIES[family]
    try:
        return config_cls.from_dict(raw)
    except (ValueError, TypeError, StrictDataclassError) as exc:
        raise ModelLoadError(f"{config_file} is not a valid {family} config: {exc}") from exc


# What a family's tokenizer files are, for a tokenizer_config.json that names a remote-code class
# (Dream's does), which AutoTokenizer refuses without trust_remote_code.
_NATIVE_TOKENIZERS = {"llada": "PreTrainedTokenizerFast", "Dream": "Qwen2Tokenizer"}


def load_tokenizer(path: Path, family: str):
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (ValueError, OSError, AttributeError):
        pass
    native = getattr(transformers, _NATIVE_TOKENIZERS[family])
    try:
        return native.from_pretrained(path)
    except (ValueError, OSError, AttributeError, TypeError) as exc:
        raise ModelLoadError(f"this app runs no remote code; {family} is supported natively, but the tokenizer in "
                             f"{path} does not load as {native.__name__} either ({str(exc).splitlines()[0]}); check its tokenizer files") from exc


def check_chat_template(tokenizer, path: Path) -> None:
    """The chat template rendered once, before the weights load: a template that does not render
    is told here, not at the first prompt."""
    if not tokenizer.chat_template:
        return
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - jinja raises many classes; the message is the point
        raise ModelLoadError(f"the chat template in {path} does not render ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); fix it (chat_template.jinja, or "
                             "chat_template in tokenizer_config.json)") from None


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
    check_folder(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json; is it a model folder?")
    raw = read_json_object(config_file)
    family = _family(raw, config_file)
    config = _config(raw, family, config_file)
    mask_id = _mask_id(raw, config, config_file)
    tensors = check_weights(path)
    check_tensors(family, config, tensors, path)
    tokenizer = load_tokenizer(path, family)
    check_chat_template(tokenizer, path)
    dev = pick_device(device)
    dtype = pick_dtype(dtype, dev, quantization)
    if device_map is None:  # one device: spread over several, the placement is transformers' own
        check_memory(path, needed_bytes(tensors, dtype, quantization), free_bytes(dev), dev, quantization)
    qconfig = _quantization_config(quantization, dtype)
    _, model_cls = FAMILIES[family]
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype}
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = device_map or {"": (dev.index or 0) if dev.type == "cuda" else "cpu"}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    model, info = model_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ModelLoadError(f"weights in {path} do not match the {family} architecture: {bad}")
    if qconfig is None and device_map is None:
        model = model.to(dev)
    model.eval()
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if type(eos_id) is not int:
        raise ModelLoadError(f"{path} names no end-of-text token: set eos_token_id in {config_file}")
    vocab = tokenizer.get_vocab()
    stop_ids = tuple(dict.fromkeys([eos_id] + [vocab[t] for t in _STOP_TOKENS if t in vocab]))
    return ModelHandle(
        name=name_or_path, path=path, family=family, model=model, tokenizer=tokenizer,
        mask_id=mask_id, eos_id=eos_id, stop_ids=stop_ids,
        device=next(model.parameters()).device, dtype=dtype, quantization=None if qconfig is None else quantization,
        num_parameters=logical_parameters(model),  # a 4-bit weight's numel counts packed pairs
        memory_bytes=model.get_memory_footprint(), max_length=config.max_positions,
        trained_length=_trained_length(raw), weight_read_bytes=weight_read_bytes(model),
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
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer

    path = resolve_path(name_or_path)
    check_folder(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json; is it a model folder?")
    raw = read_json_object(config_file)
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILIES:
        raise ModelLoadError(f"{name_or_path} is a diffusion model ({model_type}); a guider, or --autoregressive, "
                             "takes an autoregressive (causal) LM such as Llama or Qwen2, like tiny-guider")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelLoadError(f"guider model_type {model_type!r} in {config_file} is not built into "
                             f"transformers{_remote_code_note(raw)}; use a causal LM such as Llama or Qwen2")
    check_weights(path)
    dev = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, dev), trust_remote_code=False).to(dev).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    return GuiderHandle(name_or_path, model, tokenizer, sum(p.numel() for p in model.parameters()))


def _quiet_bitsandbytes() -> None:
    # bitsandbytes warns about optional GPU kernels when imported on a CPU-only machine, and its
    # import trips torch's deprecation of jit.script_method: neither is the user's to act on.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*is deprecated", category=DeprecationWarning)


# A model this small runs a forward as hundreds of tiny kernels: on the CPU, one thread beats
# several (a thread team costs more to wake than it saves; see the README's "Threads" section).
SMALL_MODEL_PARAMETERS = 50_000_000


def apply_threads(requested: int | None, handle, batched: bool = False) -> None:
    """Set torch's thread count for this command: ``requested`` (--threads), else one thread for
    a small model on the CPU decoding one request at a time, and torch's default (every core)
    for anything else: a batch's forwards are large kernels, which a thread team does speed up."""
    if requested:
        torch.set_num_threads(requested)
    elif (not batched and next(handle.model.parameters()).device.type == "cpu"
          and handle.num_parameters < SMALL_MODEL_PARAMETERS):
        torch.set_num_threads(1)
