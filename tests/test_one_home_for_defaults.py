"""One home for limits and defaults: the command line reads each knob's default, range, choices
and help from ``settings.knob``, the sweep's default grid is ``limits``' one, and no other engine
module writes a knob's default as a literal. (The page's half is checked beside the page.)"""
from __future__ import annotations

import argparse
import ast
from dataclasses import fields
from pathlib import Path

import pytest

from dllm_local.cli import build_parser
from dllm_local.canvas.settings import CANVAS_KNOBS, canvas_knob
from dllm_local.cli.settings_flags import CANVAS_DEST, LONG_GEN_LENGTH, parse_params, settings_from_args
from dllm_local.cli.sweep import sweep_axes
from dllm_local.limits import SWEEP_BLOCK_SIZES, SWEEP_GEN_LENGTH, SWEEP_THRESHOLDS
from dllm_local.settings import Settings, knob

ROOT = Path(__file__).resolve().parents[1]
KNOBS = [f.name for f in fields(Settings) if f.name != "canvas_params"]  # that one's knobs: a flag each, below
PARAMS_FLAGS = {"cache_params": "cache_param", "unmask_params": "unmask_param"}  # given as KEY=VALUE pairs


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _actions(command: str) -> dict[str, argparse.Action]:
    return {action.dest: action for action in _commands()[command]._actions}


def _settings(command: str, *argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args([command, *argv]))


@pytest.mark.parametrize("name", KNOBS)
def test_each_settings_flag_is_its_knob(name):
    k, action = knob(name), _actions("generate")[PARAMS_FLAGS.get(name, name)]
    if name in PARAMS_FLAGS:
        assert parse_params(action.default) == k.default
    elif name in ("unmask", "block_size", "cache"):  # unset: a parameter flag may choose the policy, the
        assert action.default is None and str(k.default) in action.help  # model its block and cache
    else:
        assert action.default == k.default
    assert k.help.replace("%", "%%") in action.help
    if k.low is not None and k.high is not None:
        assert f"{k.low}..{k.high}" in action.help
    assert tuple(action.choices or ()) == k.choices


@pytest.mark.parametrize("name", CANVAS_KNOBS)
def test_each_canvas_knob_is_a_flag_with_its_help_and_the_checkpoints_default(name):
    action = _actions("generate")[CANVAS_DEST + name]
    label, help_ = canvas_knob(name)
    assert action.option_strings == [f"--{name.replace('_', '-')}"] and action.default is argparse.SUPPRESS
    assert help_ in action.help and label in action.help
    assert _settings("generate", "--prompt", "hi", action.option_strings[0], "3").canvas_params == {name: 3}


def test_a_command_without_settings_flags_gets_the_knobs_defaults():
    defaults = {name: knob(name).default for name in KNOBS}
    assert _settings("generate", "--prompt", "hi") == Settings(**defaults) == Settings()
    assert _settings("eval") == Settings()
    for command in ("bench", "lm-eval"):  # longer answers, written once: LONG_GEN_LENGTH
        argv = ["--tasks", "gsm8k"] if command == "lm-eval" else []
        assert _settings(command, *argv) == Settings(gen_length=LONG_GEN_LENGTH)
    # The sweep's cache is the model's kind's to decide when it runs (sweep.MASKED_CACHE for a masked model).
    assert _settings("sweep") == Settings(unmask="threshold", gen_length=SWEEP_GEN_LENGTH)


def test_the_sweeps_default_grid_is_the_one_in_limits():
    args = build_parser().parse_args(["sweep"])
    assert sweep_axes(args, settings_from_args(args)) == {"threshold": list(SWEEP_THRESHOLDS),
                                                         "block_size": list(SWEEP_BLOCK_SIZES)}
    # a policy without a threshold sweeps block sizes only
    args = build_parser().parse_args(["sweep", "--unmask", "fixed"])
    assert sweep_axes(args, settings_from_args(args)) == {"block_size": list(SWEEP_BLOCK_SIZES)}


# --- no literal copies --------------------------------------------------------------------------
HOMES = {"dllm_local/settings.py", "dllm_local/limits.py"}
# (file, knob) -> why that literal is not the knob's default, though it is equal to it.
SAME_VALUE_ALLOWED = {
    ("dllm_local/experiments/side_by_side.py", "cache"): "the baseline row names LLaDA's plain decoding, whatever the default",
    ("dllm_local/experiments/side_by_side.py", "unmask"): "the baseline row names LLaDA's plain decoding, whatever the default",
    ("dllm_local/tiny_checkpoints/fine_tune_block.py", "seed"): "the fine-tuning seed, not the sampler's",
    ("dllm_local/tiny/tokenizer.py", "seed"): "the tokenizer's training seed, not the sampler's",
    ("dllm_local/tiny_checkpoints/train.py", "seed"): "the training seed, not the sampler's",
    ("dllm_local/trace.py", "attention_backend"): "a trace written before the backends ran SDPA, whatever the default",
}


def _named_values(tree: ast.AST):
    """(line, name, value node) for each value the source gives a name: keyword arguments, string
    keys of dict literals, parameter defaults, assignments and class fields, ``--flag`` defaults."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg:
            yield node.value.lineno, node.arg, node.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield value.lineno, key.value, value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults),
                     *((arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)]
            yield from ((d.lineno, arg.arg, d) for arg, d in pairs)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, (ast.Name, ast.Attribute)):
                    yield node.lineno, target.id if isinstance(target, ast.Name) else target.attr, node.value
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and str(node.args[0].value).startswith("--")):
            flag = str(node.args[0].value)[2:].replace("-", "_")
            yield from ((k.value.lineno, flag, k.value) for k in node.keywords if k.arg == "default")


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _copies(source: str, defaults: dict, grids: list) -> list[tuple[int, str]]:
    """(line, what) for each literal in ``source`` equal to the default of the knob it is named
    after, or to one of ``grids``."""
    tree, found = ast.parse(source), []
    for line, name, node in _named_values(tree):
        ok, value = _literal(node)
        if ok and name in defaults and type(value) is not bool and value == defaults[name]:
            found.append((line, name))
    for node in ast.walk(tree):
        ok, value = _literal(node) if isinstance(node, (ast.Tuple, ast.List, ast.Constant)) else (False, None)
        if ok and any(value == grid for grid in grids):
            found.append((node.lineno, "the sweep's grid"))
    return found


# Empty values (None, False, {}) say "nothing given" as often as "the default": only the rest count.
DEFAULTS = {name: knob(name).default for name in KNOBS
            if knob(name).default not in (None, {}) and type(knob(name).default) is not bool}
GRIDS = [grid for values in (SWEEP_THRESHOLDS, SWEEP_BLOCK_SIZES)
         for grid in (values, list(values), ",".join(map(str, values)))]


def test_no_engine_module_writes_a_knobs_default_or_the_sweeps_grid():
    found = [(path.relative_to(ROOT).as_posix(), line, name)
             for path in sorted((ROOT / "dllm_local").rglob("*.py")) if path.relative_to(ROOT).as_posix() not in HOMES
             for line, name in _copies(path.read_text(encoding="utf-8"), DEFAULTS, GRIDS)]
    copies = [f"{rel}:{line}: {name}" for rel, line, name in found if (rel, name) not in SAME_VALUE_ALLOWED]
    stale = sorted(set(SAME_VALUE_ALLOWED) - {(rel, name) for rel, _, name in found})
    assert not copies, "literal copies of settings.py's defaults or limits.py's grid:\n  " + "\n  ".join(copies)
    assert not stale, f"SAME_VALUE_ALLOWED entries that match nothing any more: {stale}"


def test_the_check_finds_each_kind_of_copy():
    source = """
ap.add_argument("--gen-length", type=int, default=128)
run(Settings(block_size=32, seed=7))
def decode(prompt, temperature=0.0): ...
TRACE = {"trace": "summary"}
THRESHOLDS = "0.5,0.7,0.8,0.9"
"""
    assert sorted(_copies(source, DEFAULTS, GRIDS)) == [
        (2, "gen_length"), (3, "block_size"), (4, "temperature"), (5, "trace"), (6, "the sweep's grid")]
