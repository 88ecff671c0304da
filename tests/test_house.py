"""House rules of the code, read statically with ``ast``: one-way layers, no import cycles, no
capability probes, small files, a one-line job per module.

Nothing here imports the project: every check parses the sources of ``app.py``, ``dllm_local/``
and ``ui/``, so a file mid-edit is reported, not crashed on.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "dllm_local", "ui")  # the project's top-level names; any other import is a library's

# --- the layers -------------------------------------------------------------------------------
# Rank 0 is the top. An arrow may run down or sideways (same rank; cycles are a rule of their own),
# never up. A module takes the rank of its longest entry below (its own name, else its package's);
# the root package "dllm_local" matches only itself, so a new top-level module has to be placed here.
LAYERS = {
    "app": 0,                                   # the page server's entry point
    "dllm_local.__main__": 0,                   # ``python -m dllm_local``: hands over to the CLI package
    "dllm_local.cli": 0,                        # the CLI's entry point, a module per command: drives experiments, decoding, loader
    "ui": 1,                                    # the page (torch-free)
    "dllm_local.serving": 2,                    # session and engine process: the engine runs sweeps, so above experiments
    "dllm_local": 3,                            # the root __init__: the public API, re-exporting batch, sampler, loader
    "dllm_local.experiments": 3,                # bench, sweep, eval, cluster: built on batch and sampler
    "dllm_local.tiny_checkpoints": 3,           # writers of the tiny checkpoints: they build models
    "dllm_local.decoding": 4,                   # the decoding core's package docstring
    "dllm_local.decoding.batch": 4,             # BatchRun: several Runs over one packed forward
    "dllm_local.decoding.sampler": 5,           # Run: the decoding loop
    "dllm_local.decoding.model_calls": 5,       # the model calls a run's policies make (StepCalls)
    "dllm_local.canvas.run": 5,                 # CanvasRun: a canvas model's loop over transformers' step functions
    "dllm_local.decoding.run_blocks": 6,        # where a run's blocks sit by the model's kind
    "dllm_local.decoding.recorder": 6,          # one Step per step -> the trace
    "dllm_local.decoding.quotas": 6,            # a batch's cache budget shared as quotas
    "dllm_local.canvas.watch": 6,               # hooks that read a canvas model's decoder for the trace
    "dllm_local.policies": 7,                   # cache and unmasking behaviour, the decoding state they read
    "dllm_local.runner": 7,                     # every forward of a model: timing, buckets, eager / compiled / graphs
    "dllm_local.models": 8,                     # families, KV cache, loader
    "dllm_local.models.attention": 8,           # a forward's attention: the model's layout, the cache writes, the observers
    "dllm_local.models.observers": 8,           # instruments of the forward: counts, KV drift, an attention probe
    "dllm_local.models.protocol": 8,            # DiffusionLM: what every family offers the engine
    # leaves: specs and records, read by every layer above and by the page
    "dllm_local.policies.registry": 9,          # torch-free specs; behaviours named "module:Class", imported on use
    "dllm_local.kinds": 9,                      # model kinds: one torch-free spec each, its run class named "module:Class"
    "dllm_local.analysis": 9,                   # cost model, frontier, report rows: torch-free, the page reads them
    "dllm_local.settings": 9,
    "dllm_local.trace": 9,
    "dllm_local.canvas": 9,                     # the canvas package's docstring, and its two leaves below
    "dllm_local.canvas.trace": 9,               # a canvas step's record, part of the trace's schema
    "dllm_local.canvas.settings": 9,            # a canvas model's knobs, part of the settings' schema
    "dllm_local.result": 9,                     # a finished run's result: its trace
    "dllm_local.prompts": 9,
    "dllm_local.softmax": 9,
    "dllm_local.hub": 9,
    "dllm_local.tiny": 9,                       # tasks and scorers, the tiny tokenizer
    "dllm_local.arguments": 9,                  # argparse types of every command line: app.py, the CLI, bench/
    # foundations: what the leaves themselves are made of
    "dllm_local.errors": 10,
    "dllm_local.values": 10,
    "dllm_local.files": 10,                     # every file a user names, read with a bound
    "dllm_local.offline": 10,                   # no outbound traffic unless a download was asked for
    "dllm_local.limits": 10,                    # the bounds and defaults several layers share; imports nothing of the project
    "dllm_local.devices": 10,
}
ROOT_ONLY = {"dllm_local", "dllm_local.decoding", "dllm_local.canvas"}  # entries that match only the module itself, not its submodules


def rank(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYERS and (name not in ROOT_ONLY or n == len(parts)):
            return LAYERS[name]
    return None


# --- the import graph -------------------------------------------------------------------------
# Every import statement counts: at module level, inside functions (lazy imports still run in the
# same process and still couple the modules) and inside ``if TYPE_CHECKING:`` blocks. TYPE_CHECKING
# imports DO count as arrows (an annotation naming a class of a layer above is a dependency on it,
# and the cycle they hide is real for readers and type checkers); the messages tag them
# "[TYPE_CHECKING]" (and lazy ones "[in function]") so they can be told apart. Not counted: the
# implicit import of parent packages, and imports by string (importlib.import_module, the registry's
# "module:Class" behaviours, the root package's lazy re-exports).


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    path: str
    line: int
    kind: str  # "", "in function" or "TYPE_CHECKING"

    def where(self) -> str:
        tag = f" [{self.kind}]" if self.kind else ""
        return f"{self.path}:{self.line}{tag}"


@dataclass
class Graph:
    files: dict[str, Path] = field(default_factory=dict)  # module -> file
    arrows: list[Arrow] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)  # project imports naming no module
    unparsable: list[str] = field(default_factory=list)

    def edges(self) -> dict[str, dict[str, list[Arrow]]]:
        out: dict[str, dict[str, list[Arrow]]] = {m: {} for m in self.files}
        for a in self.arrows:
            if a.target != a.source:
                out[a.source].setdefault(a.target, []).append(a)
        return out


def source_files() -> list[Path]:
    files = [ROOT / "app.py"]
    for package in ("dllm_local", "ui"):
        files += sorted((ROOT / package).rglob("*.py"))
    return [f for f in files if f.is_file()]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def parsed(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """(node, kind) for every Import / ImportFrom, kind telling where it sits."""
    def visit(node: ast.AST, kind: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit_stmt(stmt, "TYPE_CHECKING")
                for stmt in child.orelse:
                    yield from visit_stmt(stmt, kind)
                continue
            inner = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "":
                inner = "in function"
            yield from visit(child, inner)

    def visit_stmt(stmt: ast.stmt, kind: str):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt, kind
        yield from visit(stmt, kind)

    yield from visit(tree, "")


@cache
def graph() -> Graph:
    g = Graph()
    paths = source_files()
    for path in paths:
        g.files[module_name(path)] = path
    modules = set(g.files)

    def known(name: str) -> str | None:
        """The module an import of ``name`` loads last: itself, else its longest existing prefix
        (``from pkg import NAME`` of a non-module NAME is an arrow to ``pkg``)."""
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for path in paths:
        source = module_name(path)
        tree = parsed(path)
        if tree is None:
            g.unparsable.append(rel(path))
            continue
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node, kind in _imports(tree):
            targets: list[tuple[str, str]] = []  # (wanted, resolved-or-"")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        found = alias.name if alias.name in modules else ""
                        targets.append((alias.name, found))
            else:
                if node.level:
                    parts = package.split(".") if package else []
                    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    if child in modules:
                        targets.append((child, child))
                    else:  # a name inside the module ``base`` (which must exist)
                        targets.append((base, base if base in modules else ""))
            for wanted, found in targets:
                if not found:
                    g.dangling.append(f"{rel(path)}:{node.lineno}: {source} imports {wanted}, "
                                      f"which is no module of the project (nearest: {known(wanted)})")
                    continue
                arrow = Arrow(source, found, rel(path), node.lineno, kind)
                if arrow not in g.arrows:  # ``from .m import a, b`` is one arrow
                    g.arrows.append(arrow)
    return g


def test_every_file_parses_and_every_project_import_names_a_module():
    g = graph()
    problems = [f"{p}: does not parse" for p in g.unparsable] + g.dangling
    assert not problems, "broken files or imports:\n  " + "\n  ".join(problems)


def _strongly_connected(edges: dict[str, dict[str, list[Arrow]]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _shortest_cycle(edges: dict[str, dict[str, list[Arrow]]], start: str, members: set[str]) -> list[str]:
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node]):
            if nxt not in members:
                continue
            if nxt == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(came[chain[-1]])
                return [*reversed(chain), start]
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    return []


def _chain(edges: dict[str, dict[str, list[Arrow]]], cycle: list[str]) -> str:
    text = cycle[0]
    for a, b in zip(cycle, cycle[1:]):
        text += f"\n      -> {b}   ({', '.join(x.where() for x in edges[a][b])})"
    return text


def test_no_import_cycles():
    """Each cycle as a chain of arrows with where each arrow is written; per strongly connected
    set of modules, the shortest cycle through each of its modules."""
    edges = graph().edges()
    chains: list[str] = []
    for component in _strongly_connected(edges):
        members = set(component)
        seen: set[frozenset] = set()
        for start in component:
            cycle = _shortest_cycle(edges, start, members)
            key = frozenset(zip(cycle, cycle[1:]))
            if cycle and key not in seen:
                seen.add(key)
                chains.append(_chain(edges, cycle))
    assert not chains, f"{len(chains)} import cycle(s):\n  " + "\n  ".join(chains)


def test_no_arrow_runs_up_the_layers():
    g = graph()
    unplaced = sorted(m for m in g.files if rank(m) is None)
    upward = []
    for a in sorted(g.arrows, key=lambda a: (a.path, a.line)):
        low, high = rank(a.source), rank(a.target)
        if low is not None and high is not None and high < low:
            upward.append(f"{a.source} ({low}) -> {a.target} ({high})   {a.where()}")
    message = []
    if unplaced:
        message.append("modules with no layer in LAYERS: " + ", ".join(unplaced))
    if upward:
        message.append(f"{len(upward)} upward arrow(s):\n  " + "\n  ".join(upward))
    assert not message, "\n".join(message)


# --- capability probes ------------------------------------------------------------------------
# Every hasattr(...) and every 3-argument getattr(...) in dllm_local/ and ui/ is flagged unless
# listed here: (file, attribute name) -> why the attribute is optional on that object. A name that
# is not a string literal is keyed by its source text. An entry nothing matches any more fails too.
PROBES_ALLOWED = {
    ("dllm_local/models/llada.py", "init_std"): "optional field of a transformers config",
    ("dllm_local/tiny_checkpoints/train.py", "trained_gen_length"): "our own optional key in a transformers config",
    ("dllm_local/tiny_checkpoints/train.py", "trained_tasks"): "our own optional key in a transformers config",
    ("dllm_local/models/layers.py", "_hf_hook"): "accelerate sets the hook only on dispatched modules",
    ("dllm_local/models/layers.py", "execution_device"): "an accelerate hook's field, absent on some hooks",
    ("dllm_local/models/loading/footprint.py", "quant_state"): "bitsandbytes Params4bit's state (bnb is optional)",
    ("dllm_local/models/loading/footprint.py", "SCB"): "bitsandbytes Int8Params' scales (bnb is optional)",
    ("dllm_local/models/loading/placement.py", "dtype"): "a dtype name looked up in the torch module",
    ("ui/lab/classroom.py", "session_hash"): "gradio's Request, or None outside Gradio",
}


def _probes():
    for path in source_files():
        if rel(path) == "app.py":
            continue
        tree = parsed(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3):
                if len(node.args) < 2:
                    continue
                name = node.args[1]
                key = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else ast.unparse(name)
                yield rel(path), node.lineno, key, ast.unparse(node)


def against_allow_list(found: list, allowed: dict, offence: str, list_name: str, show=lambda key, text: text) -> None:
    """``found`` (file, line, key, text) held to ``allowed`` ((file, key) -> why): an unlisted find
    is an offence, a listed entry that matches nothing is stale."""
    offenders = [f"{p}:{line}: {show(key, text)}" for p, line, key, text in found if (p, key) not in allowed]
    used = {(p, key) for p, _, key, _ in found}
    stale = [f"{p}: {key!r}" for p, key in sorted(allowed) if (p, key) not in used]
    message = []
    if offenders:
        message.append(f"{len(offenders)} {offence}:\n  " + "\n  ".join(offenders))
    if stale:
        message.append(f"{list_name} entries that match nothing any more (remove them):\n  " + "\n  ".join(stale))
    assert not message, "\n".join(message)


def test_no_capability_probes():
    against_allow_list(sorted(_probes()), PROBES_ALLOWED, "capability probe(s) (ask the type, not the object)",
                       "PROBES_ALLOWED")


# --- file size --------------------------------------------------------------------------------
MAX_LINES = 300
# file -> (the most lines it may have, why it may pass MAX_LINES). The cap stops it growing.
LONG_FILES_ALLOWED = {
    "dllm_local/trace.py": (395, "the trace file's schema: each validator beside the field it bounds, and the "
                                 "policy fields the specs declare into it; one module for one input boundary"),
    "dllm_local/policies/registry.py": (425, "the spec types and the built-in policies' Param tables "
                                             "(declarative data: one register call per policy)"),
    "dllm_local/decoding/sampler.py": (370, "the decoding loop on one screen, its eight stages, a branch's one change "
                                   "between two of them, block diffusion's store forward, the run's cache "
                                   "taken from and given back to the runner, the plan and commit found "
                                   "without asking the device, and the head's rows a step reads "
                                   "(split, the loop would be read across files)"),
}


def test_no_file_over_300_lines():
    too_long, stale = [], []
    counts = {}
    for path in source_files():
        if rel(path) == "app.py":
            continue
        counts[rel(path)] = lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        cap = LONG_FILES_ALLOWED.get(rel(path), (MAX_LINES, ""))[0]
        if lines > cap:
            too_long.append(f"{rel(path)}: {lines} lines (max {cap})")
    for name, (cap, _) in sorted(LONG_FILES_ALLOWED.items()):
        if counts.get(name, 0) <= MAX_LINES:
            stale.append(f"{name}: {counts.get(name, 'missing')} lines, no longer needs an exception")
    message = []
    if too_long:
        message.append(f"{len(too_long)} file(s) too long:\n  " + "\n  ".join(too_long))
    if stale:
        message.append("LONG_FILES_ALLOWED entries to remove:\n  " + "\n  ".join(stale))
    assert not message, "\n".join(message)


# --- docstrings -------------------------------------------------------------------------------
def test_every_module_says_its_job_in_a_first_docstring_line():
    missing = []
    for path in source_files():
        tree = parsed(path)
        if tree is None:
            continue
        doc = ast.get_docstring(tree, clean=True)
        first = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
        if not first:
            missing.append(rel(path))
    assert not missing, f"{len(missing)} module(s) without a docstring's first line:\n  " + "\n  ".join(missing)


# --- the map in docs/development.md -----------------------------------------------------------
# The guide's layer table and its list of folders are the map a new engineer reads first; these
# tests hold them to LAYERS and to the tree, so a module placed, moved or ranked anew shows there.
GUIDE = ROOT / "docs" / "development.md"
TABLE_ROW = re.compile(r"^\s*(\d+)\s*\|\s*([^|]+?)\s*\|")


def guide_section(heading: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def documented_layers() -> dict[str, int]:
    """The guide's layer table: ``rank | names | what``, names under ``dllm_local`` written short."""
    block = guide_section("The rooms and their doors").split("```")[1]
    out = {}
    for line in block.splitlines():
        row = TABLE_ROW.match(line)
        for name in row.group(2).split(",") if row else ():
            name = name.strip()
            full = name if name in ("app", "ui", "dllm_local") or name.startswith("ui.") else f"dllm_local.{name}"
            out[full] = int(row.group(1))
    return out


def test_the_guides_layer_table_is_the_house_table():
    documented = documented_layers()
    missing = sorted(set(LAYERS) - set(documented))
    extra = sorted(set(documented) - set(LAYERS))
    moved = sorted(f"{m}: guide {documented[m]}, LAYERS {LAYERS[m]}" for m in set(LAYERS) & set(documented)
                   if documented[m] != LAYERS[m])
    assert not (missing or extra or moved), (f"docs/development.md's layer table differs from LAYERS: missing {missing}, "
                                             f"not in LAYERS {extra}, ranked differently {moved}")


def packages() -> list[str]:
    return sorted(str(p.parent.relative_to(ROOT)) for top in ("dllm_local", "ui") for p in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def test_the_guides_folder_list_names_every_folder_and_only_real_paths():
    section = guide_section("The files, one line each")
    listed = set(re.findall(r"^\s*- `([\w/]+)/`", section, re.M))
    missing = [p for p in packages() if p not in listed]
    gone = sorted(p for p in listed if not (ROOT / p).is_dir())
    assert not missing and not gone, f"folders not in the guide's list: {missing}; listed but absent: {gone}"
    text = GUIDE.read_text()
    named = set(re.findall(r"`((?:dllm_local|ui|tests|bench|docs|presets|assets)/[\w/.-]+)`", text))
    absent = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists()
                    and not p.endswith(("/mini.py", "/commits.py", "/alternate.py", "/top_k.py", "/causal_blocks.py")))  # the worked examples' new files
    assert not absent, f"paths the guide names that do not exist: {absent}"


MAX_MODULES = 15  # modules at one level of a folder: past it, the prefixes are folders in disguise


def test_no_folder_holds_more_than_fifteen_modules():
    crowded = []
    for package in packages():
        modules = [p for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            crowded.append(f"{package}: {len(modules)} modules")
    assert not crowded, f"folders over {MAX_MODULES} modules (make a sub-folder per concern): {crowded}"


def test_each_page_folder_imports_only_the_folders_its_docstring_names():
    """Each ``ui/`` folder's ``__init__`` says which other folders of the page it may import; the
    arrows are held to it (the layer table places ``ui`` as one rank; this is its inside)."""
    g = graph()
    folder_of = {m: ".".join(m.split(".")[:2]) for m in g.files if m.startswith("ui.") and m.count(".") >= 1}
    allowed = {}
    for folder in sorted(set(folder_of.values())):
        init = ROOT / Path(*folder.split(".")) / "__init__.py"
        if not init.exists():
            continue  # a module at ui's top level (page, signin): above every folder
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = re.search(r"May import (.*?)(?:;|$)", " ".join(doc.split()))
        assert said, f"{init.relative_to(ROOT)}: its docstring must say what it may import ('May import ...')"
        allowed[folder] = set(re.findall(r"``(ui\.\w+)``", said.group(1)))
    strays = sorted(f"{a.source} -> {a.target}   {a.where()}" for a in g.arrows
                    if folder_of.get(a.source) in allowed and a.target in folder_of
                    and folder_of[a.target] != folder_of[a.source]
                    and folder_of[a.target] not in allowed[folder_of[a.source]])
    assert not strays, "page folders importing a folder their __init__ does not name:\n  " + "\n  ".join(strays)


# --- kind and family names --------------------------------------------------------------------
# What differs by a model's kind is read from its ``ModelKind`` (``dllm_local/kinds/``), what
# differs by family from its ``FamilySpec``: a kind's name is compared only in its own kind's file
# (and the kinds' registry), a family's ``model_type`` only in its family's file. Flagged: a
# comparison with such a name as a string constant (``==``, ``!=``, ``in`` a tuple, set or list
# of them) and a dict read as a table by them (``_is_table``). (file, name) -> why it stays.
KIND_FILES = {"masked": "dllm_local/kinds/masked.py", "block": "dllm_local/kinds/block.py",
              "canvas": "dllm_local/kinds/canvas.py"}
FAMILY_FILES = {"llada": "dllm_local/models/llada.py", "Dream": "dllm_local/models/dream.py",
                "lladamoe": "dllm_local/models/llada_moe.py", "sdar": "dllm_local/models/sdar.py",
                "sdar_moe": "dllm_local/models/sdar.py", "llada2_moe": "dllm_local/models/llada2.py",
                "Fast_dLLM_Qwen": "dllm_local/models/fast_dllm_v2.py",
                "diffusion_gemma": "dllm_local/models/diffusion_gemma.py"}
COST_TARGETS = ("the cost panel's table of each family's released checkpoint by model_type (the page cannot "
                "import the torch-side FamilySpec, and the engine's model info does not carry it)")
NAMES_ALLOWED: dict[tuple[str, str], str] = {
    ("dllm_local/experiments/side_by_side.py", "block"): "the bench's strategy set named block (a set's name, "
                                                         "which the block kind's bench_set names), not a kind",
    ("ui/canvas/controls.py", "sdar"): COST_TARGETS,
    ("ui/canvas/controls.py", "sdar_moe"): COST_TARGETS,
    ("ui/canvas/controls.py", "llada2_moe"): COST_TARGETS,
    ("ui/canvas/controls.py", "lladamoe"): COST_TARGETS,
    ("ui/canvas/controls.py", "Fast_dLLM_Qwen"): COST_TARGETS,
}


def _names_in(node: ast.expr, in_op: bool) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if in_op and isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _is_table(node: ast.Dict) -> bool:
    """A dict read as a table by kind or family: every key such a name, or every value a function
    named (a dispatch table). A record that has a key "canvas" is none."""
    owners = {**KIND_FILES, **FAMILY_FILES}
    keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
    return bool(keys) and (all(k in owners for k in keys)
                           or all(isinstance(v, (ast.Name, ast.Attribute, ast.Lambda)) for v in node.values))


def _compared_names():
    owners = {**KIND_FILES, **FAMILY_FILES}
    for path in source_files():
        tree = parsed(path)
        if tree is None or rel(path) in ("dllm_local/kinds/spec.py", "dllm_local/kinds/__init__.py"):
            continue
        for node in ast.walk(tree):
            found = []
            if isinstance(node, ast.Compare):
                in_op = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
                for operand in [node.left, *node.comparators]:
                    found += _names_in(operand, in_op)
            elif isinstance(node, ast.Dict) and _is_table(node):
                found = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            for name in found:
                if name in owners and owners[name] != rel(path):
                    yield rel(path), node.lineno, name, ast.unparse(node)[:100]


def test_no_kind_or_family_name_compared_outside_its_own_file():
    against_allow_list(sorted(_compared_names()), NAMES_ALLOWED,
                       "kind or family name(s) compared outside their own file (read the kind's ModelKind, the "
                       "family's FamilySpec)", "NAMES_ALLOWED", show=lambda name, text: f"{name!r} in {text}")
