"""The worked example of docs/development.md that is part of the package, not a script, run as the
recipe says: a model family.

Its blocks say where they go in their ``readme-test: skip`` note: the family's file as
``dllm_local/models/mini.py``, a line at the end of ``dllm_local/models/__init__.py``, and a script
to run once the family is registered. In a fresh process, ``dllm_local.models`` is imported from
the package's own files with that line added and the new file beside them (a temporary folder on
the package's path: nothing is written into the repository); the package alone must register the
family, and the script must load a checkpoint saved with ``save_pretrained`` and print what the
recipe shows. Then every cache and unmasking policy decodes with it, one request and batched.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from test_readme import ROOT, Block, assert_prints, readme_blocks

DOC = ROOT / "docs" / "development.md"
# "tests/test_recipes.py runs it as PATH", "... at the end of PATH", "... once the family above is registered"
ROLE = re.compile(r"tests/test_recipes\.py runs it (as|at the end of|once the family above is registered)\s*(\S*)")
RUNNER = r'''
import importlib.util, sys
from pathlib import Path

import dllm_local

folder, models = Path(sys.argv[1]), Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("dllm_local.models", folder / "__init__.py",
                                              submodule_search_locations=[str(models), str(folder)])
package = importlib.util.module_from_spec(spec)
sys.modules["dllm_local.models"] = dllm_local.models = package
spec.loader.exec_module(package)

from transformers import AutoConfig

from dllm_local.models import family

if not family.known("mini"):
    sys.exit(f"importing dllm_local.models does not register mini; it knows {[s.model_type for s in family.all_specs()]}")
assert type(AutoConfig.for_model("mini")).__name__ == "MiniConfig", "mini is not registered with the Auto classes"
exec(compile((folder / "script.py").read_text(), "the recipe's script", "exec"), {"__name__": "__main__"})
'''
# Run after the recipe's script, in its namespace (``handle``, ``dllm_local``, ``Settings``).
CHECKS = r'''
from dllm_local.policies import registry

runs = 0
for cache in registry.for_model("masked", registry.CACHE):
    for unmask, spec in registry.for_model("masked", registry.UNMASK).items():
        if spec.needs_guider or registry.pair_problem(registry.get("cache", cache), spec):
            continue
        settings = Settings(gen_length=16, block_size=8, cache=cache, unmask=unmask)
        assert len(dllm_local.generate(handle, "What is 2 + 3?", settings).token_ids) == 16, (cache, unmask)
        runs += 1
batch = dllm_local.generate_batch(handle, ["What is 2 + 3?", "Hello! How are you?"], Settings(gen_length=16, block_size=8))
assert [len(r.token_ids) for r in batch] == [16, 16]
print(runs, "runs decoded")
'''


def recipe_blocks() -> dict[str, Block]:
    """The family recipe's blocks by role: "file" (its path in the note), "init" and "script"."""
    found: dict[str, Block] = {}
    for block in readme_blocks(DOC.read_text(), "docs/development.md"):
        match = ROLE.search(block.skip or "")
        if match:
            role = {"as": "file", "at the end of": "init"}.get(match.group(1), "script")
            assert role not in found, f"{block.where}: a second {role} block of the family recipe"
            found[role] = block
    assert set(found) == {"file", "init", "script"}, f"the family recipe's blocks in {DOC.name}: {sorted(found)}"
    assert ROLE.search(found["file"].skip).group(2) == "dllm_local/models/mini.py"
    assert ROLE.search(found["init"].skip).group(2) == "dllm_local/models/__init__.py"
    return found


def follow(tmp_path: Path, blocks: dict[str, Block], checks: str = "") -> subprocess.CompletedProcess:
    """The recipe followed in a fresh process: the package's __init__ with the init block at its
    end, the family's file beside the package's own, then the script (and ``checks`` after it)."""
    init = (ROOT / "dllm_local" / "models" / "__init__.py").read_text()
    (tmp_path / "__init__.py").write_text(init.rstrip("\n") + "\n" + blocks["init"].text + "\n")
    (tmp_path / "mini.py").write_text(blocks["file"].text + "\n")
    (tmp_path / "script.py").write_text(blocks["script"].text + "\n" + checks)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path), str(ROOT / "dllm_local" / "models")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_the_family_recipe_registers_loads_and_decodes_as_written(tmp_path):
    blocks = recipe_blocks()
    done = follow(tmp_path, blocks, CHECKS)
    assert done.returncode == 0, f"the family recipe of {DOC.name} failed:\n{done.stderr[-4000:]}"
    assert blocks["script"].output, "the recipe's script shows what it prints"
    assert_prints([line.strip() for line in blocks["script"].output.splitlines() if line.strip()], done.stdout,
                  blocks["script"].where)
    runs = int(re.search(r"(\d+) runs decoded", done.stdout).group(1))
    assert runs > 10, done.stdout


def test_the_recipe_without_its_init_line_leaves_the_family_unregistered(tmp_path):
    # What the test above stands on: a recipe that forgets the import is caught.
    blocks = recipe_blocks()
    blocks["init"] = Block("python", 0, "", None)
    done = follow(tmp_path, blocks)
    assert done.returncode != 0 and "does not register mini" in done.stderr, done.stderr[-2000:]


# --- the kind recipe: worked example (e) --------------------------------------------------------
KIND_NOTE = re.compile(r"tests/test_recipes\.py decodes with it as (\S+)")
KIND_RUNNER = r'''
import dataclasses, importlib.util, sys
from pathlib import Path

import dllm_local
from dllm_local import Settings, kinds
from dllm_local.decoding.run_blocks import run_blocks
from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.policies import registry

path = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location(f"dllm_local.kinds.{path.stem}", path)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)  # its file registers it
kind = kinds.get(path.stem)
handle = dataclasses.replace(dllm_local.load(TINY_MODEL), kind=kind.name)  # a family declaring kind=...

settings = Settings(gen_length=16, block_size=8, cache="none")
blocks = run_blocks(handle, settings, 13)
assert (blocks.blocks_from, blocks.count, blocks.layout.block_size) == (8, 3, 8), blocks  # absolute: the prompt ends in block 1
answers = {}
for cache in registry.for_model(kind.policy_kind, registry.CACHE):
    result = dllm_local.generate(handle, "What is 2 + 3?", Settings(gen_length=16, block_size=8, cache=cache))
    assert len(result.token_ids) == 16, cache
    answers[cache] = result.token_ids
assert len(set(map(tuple, answers.values()))) == 1, answers  # finished blocks' K/V are exact: every cache agrees
print(sorted(answers), "decoded alike")
'''


def test_the_kind_recipe_registers_and_decodes_as_written(tmp_path):
    notes = [(KIND_NOTE.search(b.skip or ""), b) for b in readme_blocks(DOC.read_text(), "docs/development.md")]
    found = [(m.group(1), b) for m, b in notes if m]
    assert len(found) == 1, f"the kind recipe's file block in {DOC.name}: {[p for p, _ in found]}"
    where, block = found[0]
    file = tmp_path / Path(where).name
    file.write_text(block.text + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", KIND_RUNNER, str(file)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the kind recipe of {DOC.name} failed:\n{done.stderr[-4000:]}"
    assert "decoded alike" in done.stdout and "'none'" in done.stdout, done.stdout


# --- the policy recipes: worked examples (a) and (b) ---------------------------------------------
POLICY_NOTE = re.compile(r"tests/test_recipes\.py registers it (as|at the end of) (\S+)")
POLICY_RUNNER = r'''
import importlib.util, json, sys
from pathlib import Path

import dllm_local
from dllm_local import Settings
from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.policies import registry

for behaviour, spec_text in json.loads(sys.argv[1]):
    path = Path(behaviour)
    spec = importlib.util.spec_from_file_location(f"dllm_local.policies.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    exec(spec_text, vars(registry))  # "one call at the end of registry.py", in its namespace

handle = dllm_local.load(TINY_MODEL)
prompt = "What is 2 + 3?"
# Refreshing the whole cache at every step is no cache at all: the same tokens, every step refreshed.
plain = dllm_local.generate(handle, prompt, Settings(gen_length=16, block_size=8, cache="none"))
every = dllm_local.generate(handle, prompt, Settings(gen_length=16, block_size=8, cache="alternate",
                                                     cache_params={"every": 1}))
assert every.token_ids == plain.token_ids, (every.token_ids, plain.token_ids)
assert all(s.policy["refreshed"] for s in every.trace.steps), "every=1 refreshes at every step"
third = dllm_local.generate(handle, prompt, Settings(gen_length=16, block_size=8, cache="alternate",
                                                     cache_params={"every": 3}, unmask="top_k",
                                                     unmask_params={"k": 2}))
assert [s.policy["refreshed"] for s in third.trace.steps] == [s.step_in_block % 3 == 0 for s in third.trace.steps]
assert all(len(s.committed) <= 2 and "top_k_floor" in s.policy for s in third.trace.steps)
assert len(third.token_ids) == 16
print("alternate and top_k decoded as written")
'''


def test_the_policy_recipes_register_and_decode_as_written(tmp_path):
    """Examples (a) and (b): each behaviour file as the module its note names, its spec's one call
    run at the end of ``registry.py``; then the CLI's and page's settings reach them by name."""
    found = [(m.groups(), b) for b in readme_blocks(DOC.read_text(), "docs/development.md")
             if (m := POLICY_NOTE.search(b.skip or ""))]
    assert [role for (role, _), _ in found] == ["as", "at the end of", "as", "at the end of"], found
    pairs = []
    for ((_, where), behaviour), ((_, registry_file), spec) in zip(found[::2], found[1::2]):
        assert registry_file == "dllm_local/policies/registry.py", registry_file
        file = tmp_path / Path(where).name
        file.write_text(behaviour.text + "\n")
        pairs.append((str(file), spec.text))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", POLICY_RUNNER, json.dumps(pairs)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the policy recipes of {DOC.name} failed:\n{done.stderr[-4000:]}"
    assert "decoded as written" in done.stdout
