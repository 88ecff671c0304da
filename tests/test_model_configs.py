"""A model folder's files against its family's rules, before anything is built (issue 61, item 4).

Each crafted checkpoint is a copy of a shipped tiny model with one value of one file changed, then
the real loader (``dllm_local.load``) or the real command line (``dllm_local.cli.main``, in this
process): a value a family's rules refuse is a ModelLoadError naming the file and the key; any
other loads, or is a DllmError; nothing else, and nothing that hangs (a FIFO, a deep file, a chat
template that loops). Hypothesis draws the key (any of the shipped config's, or a rule's) and a
hostile value; derandomized and bounded, so CI sees the same examples on every run."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dllm_local
from dllm_local.cli import main as cli_main
from dllm_local.errors import DllmError, ModelLoadError
from dllm_local.models.family import of_config

MODELS = Path(__file__).resolve().parents[1] / "assets" / "models"
def bounded(examples: int) -> settings:
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DEEP = json.loads("[" * 70 + "]" * 70)  # past files.MAX_DEPTH
HOSTILE = st.sampled_from([0, -1, 2**62, 10**400, math.nan, math.inf, 0.5, True, None, "", "8", [8], {"v": 8}, DEEP])
ENDLESS_TEMPLATE = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


def _set(data: dict, key: str, value) -> None:
    *path, last = key.split(".")
    for part in path:
        data = data.setdefault(part, {})
    data[last] = value


def _craft(folder: Path, model: str, file: str = "config.json", **changes) -> Path:
    """A copy of a shipped tiny model in ``folder`` with ``changes`` (dotted keys, ``__`` for the dot) to ``file``."""
    shutil.copytree(MODELS / model, folder)
    data = json.loads((folder / file).read_text())
    for key, value in changes.items():
        _set(data, key.replace("__", "."), value)
    (folder / file).write_text(json.dumps(data))
    return folder


def _within(seconds: float, call):
    """``call()``'s result (or its exception, raised here) in a thread that must end within
    ``seconds``: a loader that hangs fails this test instead of hanging the suite."""
    done = {}
    worker = threading.Thread(target=lambda: done.update(result=_outcome(call)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    kind, value = done["result"]
    if kind == "error":
        raise value
    return value


def _outcome(call):
    try:
        return "value", call()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return "error", exc


# Each value the issue's crafted checkpoints found taking a traceback or passing silently.
FOUND = [
    ("tiny-sdar-moe", "config.json", "num_experts_per_tok", 9),
    ("tiny-sdar-moe", "config.json", "num_experts_per_tok", 0),
    ("tiny-llada2", "config.json", "num_experts_per_tok", 9),
    ("tiny-llada2", "config.json", "num_experts_per_tok", 0),
    ("tiny-llada2", "config.json", "n_group", 0),
    ("tiny-llada2", "config.json", "topk_group", 5),
    ("tiny-llada2", "config.json", "n_group", 3),  # 8 experts in 3 groups
    ("tiny-llada2", "config.json", "num_experts_per_tok", 5),  # more than the 2 searched groups hold
    ("tiny-llada-moe", "config.json", "num_experts_per_tok", 33),
    ("tiny-llada-moe", "config.json", "num_experts_per_tok", 0),
    ("tiny-diffusiongemma", "config.json", "text_config.top_k_experts", 9),
    ("tiny-diffusiongemma", "config.json", "text_config.top_k_experts", 0),
    ("tiny-diffusiongemma", "config.json", "canvas_length", 0),
    ("tiny-diffusiongemma", "config.json", "canvas_length", -3),
    ("tiny-diffusiongemma", "generation_config.json", "max_denoising_steps", 0),
    ("tiny-diffusiongemma", "generation_config.json", "t_max", 0.1),
    ("tiny-diffusiongemma", "generation_config.json", "stability_threshold", -1),
    ("tiny-diffusiongemma", "generation_config.json", "sampler_config.entropy_bound", math.nan),
]


@pytest.mark.parametrize("model, file, key, value", FOUND)
def test_each_value_the_issue_found_is_refused_at_load_naming_the_file_and_the_key(tmp_path, model, file, key, value):
    folder = _craft(tmp_path / "m", model, file, **{key.replace(".", "__"): value})
    with pytest.raises(ModelLoadError) as err:
        dllm_local.load(str(folder))
    assert str(folder / file) in str(err.value) and key.split(".")[-1] in str(err.value), err.value


def _leaf_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            keys += _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


FAMILIES = ("tiny-sdar-moe", "tiny-llada2", "tiny-llada-moe", "tiny-diffusiongemma", "tiny-sdar", "tiny-fast-dllm-v2",
            "tiny")


def _keys(model: str) -> list[str]:
    """Every key of the shipped config.json, and every key its family's rules name."""
    raw = json.loads((MODELS / _folder(model) / "config.json").read_text())
    return sorted(set(_leaf_keys(raw)) | set(of_config(raw).rules.keys))


def _folder(model: str) -> str:
    return "tiny-llada" if model == "tiny" else model


def _loads_or_refuses(folder: Path, key: str, value, file: str = "config.json") -> None:
    """Loading ``folder`` works (and ``info``'s summary is JSON) or is a DllmError; one that a
    family's rule for ``key`` refuses names the file and the key (or the file's depth)."""
    raw = json.loads((folder / "config.json").read_text()) if file == "config.json" else {}
    family = of_config(raw) if raw else None
    rule = family.rules.keys.get(key) if family else None
    try:
        handle = _within(60, lambda: dllm_local.load(str(folder)))
    except DllmError as exc:
        if rule is not None and rule.broken(value):
            assert key in str(exc) or "nests deeper" in str(exc), exc
        return
    assert rule is None or not rule.broken(value), f"{key} {value!r} loaded"
    json.dumps(handle.summary())


@bounded(40)
@given(data=st.data())
def test_a_hostile_value_in_any_key_of_any_family_config_loads_or_is_refused_naming_it(data):
    model = data.draw(st.sampled_from(FAMILIES), label="model")
    key = data.draw(st.sampled_from(_keys(model)), label="key")
    value = data.draw(HOSTILE, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        folder = _craft(Path(tmp) / "m", _folder(model), **{key.replace(".", "__"): value})
        _loads_or_refuses(folder, key, value)


GENERATION_KEYS = ("max_denoising_steps", "t_max", "t_min", "stability_threshold", "confidence_threshold",
                   "sampler_config.entropy_bound", "sampler_config", "eos_token_id", "pad_token_id")


@bounded(12)
@given(key=st.sampled_from(GENERATION_KEYS), value=HOSTILE)
def test_a_hostile_value_in_the_canvas_generation_config_loads_or_is_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _craft(Path(tmp) / "m", "tiny-diffusiongemma", "generation_config.json",
                        **{key.replace(".", "__"): value})
        _loads_or_refuses(folder, key, value, "generation_config.json")


def _deep_json(depth: int) -> str:
    return '{"weight_map": ' + "[" * depth + "]" * depth + "}"


def _text_max_length(folder: Path) -> None:
    file = folder / "tokenizer_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "model_max_length": "8"}))


def _fifo(name: str):
    return lambda folder: ((folder / name).unlink(), os.mkfifo(folder / name))


# Files of a model folder no reader may hang on or overflow: each refused naming the file.
GUARDS = {
    "a 200,000-deep config.json": (lambda f: (f / "config.json").write_text("[" * 200_000 + "]" * 200_000),
                                   "config.json nests deeper than 64 levels"),
    "a 200,000-deep index": (lambda f: (f / "model.safetensors.index.json").write_text(_deep_json(200_000)),
                             "model.safetensors.index.json nests deeper than 64 levels"),
    "a deep tokenizer_config.json": (lambda f: (f / "tokenizer_config.json").write_text(_deep_json(5_000)),
                                     "tokenizer_config.json nests deeper than 64 levels"),
    "a config.json that is a FIFO": (_fifo("config.json"), r"'config.json' in .* is a pipe \(FIFO\), not a file"),
    "a generation config that is a FIFO": (_fifo("generation_config.json"), r"'generation_config.json' in .* is a pipe"),
    "a chat template that loops for ever": (lambda f: (f / "chat_template.jinja").write_text(ENDLESS_TEMPLATE),
                                            "chat template did not finish rendering in 2 s"),
    "a model_max_length of text": (_text_max_length, r"the tokenizer in .* does not encode a prompt \(TypeError"),
}


@pytest.mark.parametrize("case", GUARDS)
def test_a_folder_no_reader_may_hang_on_is_refused_by_info_with_exit_2(tmp_path, capsys, case):
    change, message = GUARDS[case]
    folder = tmp_path / "m"
    shutil.copytree(MODELS / "tiny-llada2", folder)
    change(folder)
    assert _within(30, lambda: cli_main(["info", str(folder)])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err


def test_a_crafted_config_is_exit_2_with_its_key_for_info_and_generate(tmp_path, capsys):
    moe = _craft(tmp_path / "moe", "tiny-llada2", n_group=0)
    canvas = _craft(tmp_path / "canvas", "tiny-diffusiongemma", "generation_config.json", t_max=0.1)
    for argv, key in ((["info", str(moe)], "n_group 0"),
                      (["generate", "--model", str(canvas), "--prompt", "1+1="], "t_max (0.1)")):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and key in err and "Traceback" not in err, err
