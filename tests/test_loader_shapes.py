"""The loader owns its errors, shapes included (issue 45): a config whose sizes do not fit together,
weights of other shapes than the config's model, or a safetensors header whose offsets do not tile
its file, is a ModelLoadError naming the file and the rule, before transformers sees the checkpoint."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from checkpoints import build_dream, build_llada
from safetensors.torch import load_file, save_file

import dllm_local
from dllm_local.errors import ModelLoadError

WEIGHTS = "model.safetensors"  # a two-block LLaDA in one file (10 MB shards)
K_PROJ = "model.transformer.blocks.0.k_proj.weight"  # [32, 64]: two key/value heads of 16 of the width 64


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {"llada": build_llada(root / "llada", n_layers=2, n_kv_heads=2, shard_size="10MB"),
            "dream": build_dream(root / "dream")}


def _config(**changes):
    def edit(path: Path) -> None:
        config = path / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))
    return edit


def _tensors(change):
    """Rewrite the weights through safetensors itself: a valid file of other tensors."""
    def edit(path: Path) -> None:
        tensors = load_file(path / WEIGHTS)
        change(tensors)
        save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})
    return edit


def _header(change):
    """Rewrite the header (``change(header, data) -> data``), the tensors' bytes kept as they are:
    a file safetensors itself would refuse."""
    def edit(path: Path) -> None:
        raw = (path / WEIGHTS).read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + length])
        data = change(header, raw[8 + length:])
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        (path / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text + data)
    return edit


def _transpose(tensors):
    for name in [n for n in tensors if n.endswith("k_proj.weight")]:
        tensors[name] = tensors[name].T.contiguous()


def _offsets(name, shift):
    def change(header, data):
        start, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [start + shift, end + shift]
        return data
    return change


def _share_offsets(header, data):
    # Two tensors of one size on the same bytes: each fits its shape, the pair overlaps.
    header["model.transformer.blocks.1.attn_norm.weight"]["data_offsets"] = \
        header["model.transformer.blocks.0.attn_norm.weight"]["data_offsets"]
    return data


def _wider(header, data):
    header[K_PROJ]["shape"] = [32, 65]
    return data


def _gap(header, data):
    for entry in header.values():
        if isinstance(entry, dict) and "data_offsets" in entry:
            entry["data_offsets"] = [offset + 8 for offset in entry["data_offsets"]]
    return bytes(8) + data


CASES = {
    "heads that do not divide the width": (
        "llada", _config(n_heads=5, n_kv_heads=5), "config.json", r"n_heads 5 does not divide d_model 64: each "
                                                                   r"attention head takes an equal share"),
    "key/value heads that do not divide the heads": (
        "llada", _config(n_kv_heads=3), "config.json", r"n_kv_heads 3 does not divide n_heads 4"),
    "Dream's heads that do not divide its width": (
        "dream", _config(num_attention_heads=6, num_key_value_heads=2), "config.json",
        r"num_attention_heads 6 does not divide hidden_size 64"),
    "no heads": ("dream", _config(num_key_value_heads=0), "config.json",
                 r"num_key_value_heads 0 must be a whole number from 1 to"),
    "a vocabulary larger than the embedding": (
        "llada", _config(vocab_size=800), "config.json", r"vocab_size 800 is larger than embedding_size 768: every "
                                                         r"token id needs a row of the embedding"),
    "a transposed weight": (
        "llada", _tensors(_transpose), WEIGHTS, rf"{K_PROJ} is \[64, 32\], config.json makes it \[32, 64\] \(and 1 "
                                                r"more\): the weights are not this config's"),
    "a config of another feed-forward width": (
        "llada", _config(mlp_hidden_size=128), WEIGHTS, r"blocks.0.ff_proj.weight is \[96, 64\], config.json makes it "
                                                        r"\[128, 64\] \(and 5 more\)"),
    "a tensor the model has and the weights lack": (
        "llada", _tensors(lambda t: t.pop("model.transformer.blocks.1.ff_norm.weight")), "config.json",
        r"have no model.transformer.blocks.1.ff_norm.weight, which the llada model of config.json has"),
    "a tensor the model has no place for": (
        "llada", _tensors(lambda t: t.update(extra=t[K_PROJ].clone())), WEIGHTS, r"extra has no place in the llada model"),
    "a size the config's rules refuse before the model is built": (
        "llada", _config(mlp_hidden_size=-1), "config.json", r"mlp_hidden_size -1 must be a whole number from 1 to"),
    "data_offsets past the end of the file": (
        "llada", _header(_offsets(K_PROJ, 10**6)), WEIGHTS, r"is truncated: its data is \d+ bytes, "
                                                            rf"{K_PROJ}'s data_offsets end at \d+"),
    "data_offsets of another size than the shape": (
        "llada", _header(_wider), WEIGHTS, rf"{K_PROJ}'s data_offsets \[\d+, \d+\] hold 4096 bytes, its shape and "
                                           r"dtype need 4160"),
    "overlapping tensors": (
        "llada", _header(_share_offsets), WEIGHTS, r"data_offsets start at \d+, .*'s end at \d+: tensors overlap"),
    "a gap before the first tensor": (
        "llada", _header(_gap), WEIGHTS, r"data_offsets start at 8, the data begins at 0: tensors leave a gap"),
    "bytes after the last tensor": (
        "llada", _header(lambda header, data: data + bytes(16)), WEIGHTS,
        r"has 16 bytes after its last tensor: safetensors data ends where its last tensor does"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_broken_rule_is_a_load_error_naming_the_file_and_the_rule(bases, tmp_path, case):
    base, edit, file, rule = CASES[case]
    path = tmp_path / "m"
    shutil.copytree(bases[base], path)
    edit(path)
    with pytest.raises(ModelLoadError, match=rule) as err:
        dllm_local.load(str(path))
    message = str(err.value)
    assert file in message
    assert len(message.replace(str(path), "")) < 300, message


@pytest.mark.parametrize("base", ["llada", "dream"])
def test_a_valid_checkpoint_still_loads(bases, base):
    handle = dllm_local.load(str(bases[base]))
    assert handle.family == {"llada": "llada", "dream": "Dream"}[base]
