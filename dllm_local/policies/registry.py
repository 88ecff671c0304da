"""What policies exist and what knobs they take: one torch-free registry.

A ``PolicySpec`` names a policy, says what it does in one line, lists its parameters (type,
range, default, label, help) and its needs, and points at the class that implements it. Settings
validate against the specs, and the page, the CLI, the sweep and the bench build their choices
from them, so none of those imports torch or knows a policy by name. Adding a policy is its own
file (the behaviour) plus one ``register`` call here; a policy outside the package registers from
a module of its own, loaded by ``load_plugins`` (an entry point or ``--policies``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module, metadata
from typing import Annotated, Any, Callable, Iterable

from pydantic import Field, TypeAdapter

from ..devices import DEVICES
from ..errors import SettingsError, listed
from ..limits import MAX_GEN_LENGTH
from ..trace import AnswerPosition, Rejected, SequencePosition, declare_policy_fields
from ..values import FLAG, TYPE_WORDS, WORD, Count, Flag, Number, Text, integer, number, one_of, optional, read


@dataclass(frozen=True)
class Param:
    name: str
    type: type  # int, float, str or bool
    default: Any
    label: str
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the range excludes ``low``
    high_open: bool = False
    choices: tuple = ()
    optional: bool = False  # None is allowed (``help`` says what it means)
    slider: tuple[float, float, float] | None = None  # the page's range and step, within low..high
    headline: bool = False  # shown in a strategy's name ("threshold 0.9")
    schema: TypeAdapter = field(init=False, repr=False, compare=False)  # what ``coerce`` reads a value through

    def __post_init__(self) -> None:
        # The registry's one bound: a number from outside (a slider, Compare's changes box, an API
        # call, a sweep axis) is checked against both ends, so no value can hold the engine forever.
        if self.type in (int, float) and not self.choices and (self.low is None or self.high is None):
            raise SettingsError(f"parameter {self.name!r}: a number parameter needs both bounds, low and high")
        if self.choices:
            kind = one_of(self.choices)
        elif self.type in (int, float):
            kind = (integer if self.type is int else number)(self.low, self.high, self.low_open, self.high_open)
        else:
            kind = FLAG if self.type is bool else WORD
        object.__setattr__(self, "schema", TypeAdapter(optional(kind) if self.optional else kind))

    def rule(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return TYPE_WORDS[self.type]

    def coerce(self, value: Any, owner: str) -> Any:
        """``value`` as this parameter's type, in range; text is parsed. Raises naming the knob."""
        return read(self.schema, value, self.name, owner)

    def to_dict(self) -> dict:
        return {"name": self.name, "type": self.type.__name__, "default": self.default, "label": self.label,
                "help": self.help, "rule": self.rule(), "choices": list(self.choices), "optional": self.optional,
                "slider": list(self.slider) if self.slider else None, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class PolicySpec:
    kind: str  # "cache" or "unmask"
    name: str
    label: str
    description: str
    impl: str | type  # "module:Class" (imported on first use, so specs never import torch) or the class
    params: tuple[Param, ...] = ()
    needs_guider: bool = False  # guided decoding: the run needs the autoregressive guider
    # A cache policy whose decoding slides a window over the undecoded positions (policies/window.py).
    slides: bool = False
    # An unmasking policy that decodes block by block (a schedule per block, state kept per block).
    block_by_block: bool = False
    # An unmasking policy whose extra forward repeats positions: only a model whose every layer but
    # attention works position by position (``packs_requests``: LLaDA, not Dream's shifted head).
    position_wise_model: bool = False
    uses_steps: bool = False  # the settings' ``steps`` (LLaDA's schedule length) applies
    # The model kinds the policy makes sense for: "masked" (bidirectional), "block" (block diffusion).
    model_kinds: tuple[str, ...] = ("masked", "block")
    # A cross-parameter rule: a message when ``params`` break it, else None.
    check: Callable[[dict], str | None] | None = None
    # What the policy adds to each step record's ``policy``: name -> type (a trace field type),
    # declared to the trace's schema when the spec is registered.
    trace_fields: dict[str, Any] = field(default_factory=dict)
    defaults: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", {p.name: p.default for p in self.params})

    def validate(self, params: Any) -> dict:
        """Every parameter with its default filled in, typed and in range; raises SettingsError."""
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise SettingsError(f"{self.name}: parameters must be a mapping of name to value, not {params!r}")
        known = {p.name: p for p in self.params}
        unknown = sorted(set(map(str, params)) - set(known))
        if unknown:
            raise SettingsError(f"{self.name}: {listed(unknown, 'unknown parameter')}; "
                                f"known: {', '.join(known) or 'none'}")
        out = {name: p.coerce(params[name], self.name) if name in params else p.default for name, p in known.items()}
        problem = self.check(out) if self.check else None
        if problem:
            raise SettingsError(f"{self.name}: {problem}")
        return out

    def behaviour(self) -> type:
        if isinstance(self.impl, str):
            module, _, cls = self.impl.partition(":")
            try:
                return getattr(import_module(module), cls)
            except Exception as exc:  # noqa: BLE001 - a plugin's module may raise anything: said in one line
                raise SettingsError(f"policy {self.name}: its behaviour {self.impl} cannot be loaded: "
                                    f"{type(exc).__name__}: {exc}") from None
        return self.impl

    def build(self, params: dict | None = None):
        """A fresh policy object (one per run: policies keep per-run state)."""
        return self.behaviour()(self, self.validate(params))

    def short(self, params: dict | None = None) -> str:
        """``name`` with its headline knobs: "threshold 0.9"."""
        values = {**self.defaults, **(params or {})}
        return " ".join([self.name, *(f"{values[p.name]:g}" if isinstance(values[p.name], float) else str(values[p.name])
                                      for p in self.params if p.headline)])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "label": self.label, "description": self.description,
                "params": [p.to_dict() for p in self.params], "needs_guider": self.needs_guider,
                "uses_steps": self.uses_steps, "slides": self.slides, "block_by_block": self.block_by_block,
                "model_kinds": list(self.model_kinds)}


CACHE: dict[str, PolicySpec] = {}
UNMASK: dict[str, PolicySpec] = {}
_KINDS = {"cache": CACHE, "unmask": UNMASK}


def register(spec: PolicySpec) -> PolicySpec:
    """Add a policy (a spec with the same name replaces the old one)."""
    declare_policy_fields(spec.trace_fields)
    _KINDS[spec.kind][spec.name] = spec
    return spec


def for_model(kind: str, table: dict[str, PolicySpec]) -> dict[str, PolicySpec]:
    """The policies of ``table`` (``CACHE`` or ``UNMASK``) that make sense for a model of ``kind``
    ("masked" or "block"), in registration order."""
    return {name: spec for name, spec in table.items() if kind in spec.model_kinds}


def pair_problem(cache: PolicySpec, unmask: PolicySpec) -> str | None:
    """Why the cache policy ``cache`` and the unmasking policy ``unmask`` cannot decode together, or None."""
    if cache.slides and unmask.block_by_block:
        sliding = [u.name for u in UNMASK.values() if not u.block_by_block]
        return (f"the {cache.name} cache slides a window over the undecoded positions, and the {unmask.name} "
                f"unmasking policy decodes block by block; with {cache.name}, use {', '.join(sliding)}")
    return None


def unregister(kind: str, name: str) -> None:
    _KINDS[kind].pop(name, None)


def get(kind: str, name: str) -> PolicySpec:
    table = _KINDS[kind]
    if name not in table:
        raise SettingsError(f"{kind} policy must be one of {', '.join(table)}, not {name!r}")
    return table[name]


def all_specs() -> dict[str, list[dict]]:
    """Every registered policy as plain dicts, for a process that has no registry of its own to ask."""
    return {kind: [s.to_dict() for s in table.values()] for kind, table in _KINDS.items()}


# ---------------------------------------------------------------- policies outside the package
ENTRY_POINT_GROUP = "dllm_local.policies"
_PLUGINS: list[str] = []  # the modules load_plugins imported, in order


def load_plugins(modules: Iterable[str] = ()) -> list[str]:
    """Import every module named by an installed package's ``dllm_local.policies`` entry point,
    then ``modules`` (``--policies a,b``, split at the commas); each registers its specs when imported. A spec names its
    behaviour as "module:Class", imported on first use, so loading stays torch-free when the plugin
    module is. Returns every plugin module loaded so far: a process that starts the engine hands
    them on (the engine process imports them too). A module that is missing or fails to import
    raises SettingsError in one line."""
    wanted = [(f"the entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP})", ep.module)
              for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    wanted += [(f"--policies {name}", name.strip()) for name in modules if name.strip()]
    for where, name in wanted:
        try:
            import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):  # not one it imports
                raise SettingsError(f"{where}: no module named {name!r} (it must be importable from here: the "
                                    f"current folder, PYTHONPATH or an installed package)") from None
            raise SettingsError(f"{where}: importing {name!r} failed: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - whatever the module raised, said in one line
            raise SettingsError(f"{where}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None
        if name not in _PLUGINS:
            _PLUGINS.append(name)
    return list(_PLUGINS)


# ---------------------------------------------------------------- the built-in policies
def _refresh_every(help_: str = "also refresh every N steps inside a block (0: only at block starts)") -> Param:
    return Param("refresh_every", int, 0, "Refresh every N steps", help_, low=0, high=MAX_GEN_LENGTH, slider=(0, 32, 1))


_CACHE_IMPL = "dllm_local.policies.cache"
# Cache policies that approximate a bidirectional model's changing K/V: on a block-diffusion model,
# whose finished blocks never change, the block cache is exact and these have nothing to add.
_BIDIRECTIONAL = ("masked",)
_UNMASK_IMPL = "dllm_local.policies.unmask"

register(PolicySpec(
    "cache", "none", "No cache", "Recompute every position at every step: the plain full-recompute baseline.",
    f"{_CACHE_IMPL}:NoCache"))
register(PolicySpec(
    "cache", "block", "Block cache (block diffusion)",
    "Write the prompt's blocks and each finished block's K/V once, then recompute only the current block: "
    "exact, since block-causal attention never lets a block read a later one.",
    f"{_CACHE_IMPL}:BlockCache",
    (
        Param("sub_block", int, None, "Sub-block size", "decode each block in sub-blocks of this many positions, "
              "left to right, an early stop ending the block (Fast-dLLM v2: 8); None: the whole block at once",
              low=1, high=MAX_GEN_LENGTH, optional=True, slider=(1, 32, 1)),
        Param("sub_block_cache", bool, False, "Sub-block cache", "with sub-blocks: once its block has had a forward, "
              "a sub-block whose first position is decided recomputes only itself (Fast-dLLM v2's sub-block cache, "
              "an approximation)"),
    ),
    model_kinds=("block",)))
register(PolicySpec(
    "cache", "prefix", "PrefixCache (Fast-dLLM)",
    "Refresh the whole cache at each block start; then recompute the block and everything after it.",
    f"{_CACHE_IMPL}:PrefixCache", (_refresh_every(),), model_kinds=_BIDIRECTIONAL))
register(PolicySpec(
    "cache", "dual", "DualCache (Fast-dLLM)",
    "Refresh the whole cache at each block start; then recompute only the current block.",
    f"{_CACHE_IMPL}:DualCache", (_refresh_every(),), model_kinds=_BIDIRECTIONAL))
register(PolicySpec(
    "cache", "freecache", "FreeCache (FlashDLM)",
    "One full forward, then finished blocks stay frozen: the active window shrinks, no refresh.",
    f"{_CACHE_IMPL}:FreeCache", model_kinds=_BIDIRECTIONAL))
register(PolicySpec(
    "cache", "adaptive", "Adaptive I/O-aware cache (the write-up's Flash-Cache)",
    "As the write-up describes Flash-Cache: recompute where cache confidence (prediction certainty and age) is "
    "low or recomputing beats reading; a budget evicts the least confident positions.",
    f"{_CACHE_IMPL}:AdaptiveCache",
    (
        Param("alpha", float, 0.7, "Certainty weight (alpha)", "weight of 1 - H/H_max in the cache confidence", low=0,
              high=100),
        Param("beta", float, 0.3, "Recency weight (beta)", "weight of exp(-lambda * age) in the cache confidence", low=0,
              high=100),
        Param("lam", float, None, "Decay per step (lambda)", "None: 3 / the generation's step budget", low=0, high=100,
              optional=True),
        Param("floor", float, 0.5, "Confidence floor", "positions at or under it are recomputed", low=0, high=1,
              slider=(0.0, 1.0, 0.05)),
        Param("budget", float, None, "Cache budget (positions)",
              "at most this many positions cached (a fraction < 1 of the sequence); None: no limit",
              low=0, high=65536, low_open=True, optional=True, slider=(0, 512, 8)),  # past any sequence
        _refresh_every(),
        Param("device_profile", str, "auto", "Device profile", "the I/O cost model's device: measured, or a named GPU",
              choices=("auto", *DEVICES)),
    ),
    model_kinds=_BIDIRECTIONAL,
    trace_fields={"device": Text | None, "reuse_wins": Flag | None, "evicted": Count, "quota": Count}))

_THRESHOLD = Param("threshold", float, 0.9, "Confidence threshold (tau)",
                   "commit every masked position with confidence >= tau (1: the most confident and any the "
                   "model is certain of, probability 1 in float64)",
                   low=0, high=1, low_open=True, slider=(0.05, 1.0, 0.05), headline=True)

register(PolicySpec(
    "unmask", "fixed", "Fixed schedule (LLaDA)",
    "The block's masks spread evenly over its steps, most confident first (or in random order).",
    f"{_UNMASK_IMPL}:Fixed",
    (Param("remasking", str, "low_confidence", "Order", "most confident first (low confidence), or random order",
           choices=("low_confidence", "random")),),
    uses_steps=True, block_by_block=True))
register(PolicySpec(
    "unmask", "threshold", "Confidence threshold (Fast-dLLM)",
    "Commit every masked position of the block with confidence >= tau, always at least the most confident.",
    f"{_UNMASK_IMPL}:Threshold", (_THRESHOLD,)))
register(PolicySpec(
    "unmask", "factor", "Factor rule (Fast-dLLM)",
    "Commit the n most confident positions, n the largest with (n + 1)(1 - c_n) < f.",
    f"{_UNMASK_IMPL}:Factor",
    (Param("factor", float, 1.0, "Factor (f)", "larger commits more per step", low=0, high=100, low_open=True,
           slider=(0.1, 4.0, 0.1), headline=True),)))
register(PolicySpec(
    "unmask", "guided", "Guided diffusion (FlashDLM)",
    "A small autoregressive guider reads the draft; commit the longest prefix it agrees with, at least one token.",
    f"{_UNMASK_IMPL}:Guided",
    (
        Param("rule", str, "exact", "Guider rule", "exact: its argmax; topk: in its top-k; relative: top-k and "
              "p >= ratio * p_top1", choices=("exact", "topk", "relative"), headline=True),
        # A top-k far past any guider's useful k is still bounded.
        Param("top_k", int, 5, "Guider top-k", "for the topk and relative rules", low=1, high=1000,
              slider=(1, 20, 1)),
        Param("ratio", float, 0.5, "Guider ratio", "for the relative rule", low=0, high=1, low_open=True,
              slider=(0.05, 1.0, 0.05)),
    ),
    needs_guider=True, trace_fields={"guider_accepted": Annotated[Count, Field(le=MAX_GEN_LENGTH)]}))
register(PolicySpec(
    "unmask", "self_verify", "Self-verifying parallel decoding (the write-up's Flash-Verify)",
    "As the write-up describes Flash-Verify: threshold candidates, capped as the block fills; close candidates "
    "whose joint probability is much lower than the product of marginals go back to mask and are decided one "
    "at a time.",
    f"{_UNMASK_IMPL}:SelfVerify",
    (
        _THRESHOLD,
        Param("rho", float, 0.5, "Conflict cut-off (rho)", "P(b | others) / P(b) under rho sends b back to mask",
              low=0, high=100, low_open=True, slider=(0.05, 1.0, 0.05)),
        Param("window", int, 4, "Conflict window", "candidates closer than this are verified together", low=1,
              high=MAX_GEN_LENGTH,
              slider=(1, 8, 1)),
        Param("cap_max", int, 16, "Tokens per step, empty block", "the cap when the block is empty", low=1,
              high=MAX_GEN_LENGTH),
        Param("cap_min", int, 2, "Tokens per step, full block", "the cap as the block fills", low=1,
              high=MAX_GEN_LENGTH),
    ),
    check=lambda p: None if p["cap_min"] <= p["cap_max"] else f"cap_min ({p['cap_min']}) must be <= cap_max ({p['cap_max']})",
    block_by_block=True,
    trace_fields={"verified": Count, "rejected": Count, "min_conflict_score": Number, "rejected_at": list[Rejected]}))
register(PolicySpec(
    "unmask", "revise", "Draft wide, verify narrow (WINO)",
    "Commit every position at or above the draft threshold; in the same forward, send back to mask any "
    "token this block committed earlier whose probability now falls under the verify threshold.",
    "dllm_local.policies.revise:Revise",
    (
        Param("draft_threshold", float, 0.5, "Draft threshold", "commit every masked position at or above it",
              low=0, high=1, low_open=True, slider=(0.05, 1.0, 0.05), headline=True),
        Param("verify_threshold", float, 0.9, "Verify threshold",
              "a committed token whose probability falls under it goes back to mask (0: never)",
              low=0, high=1, slider=(0.0, 1.0, 0.05), headline=True),
        Param("max_revisions", int, 1, "Revisions per position", "how often one position may be taken back",
              low=0, high=16, slider=(0, 4, 1)),
    ),
    block_by_block=True, trace_fields={"revoked": Count}))
register(PolicySpec(
    "unmask", "edit", "Token-to-token editing (LLaDA 2.1)",
    "Commit the block's masks by the threshold; in the same forward, rewrite any token this block committed "
    "earlier whose draft is now another token above the edit threshold; a full block is re-read until a "
    "forward edits nothing.",
    "dllm_local.policies.edit:Edit",
    (
        Param("threshold", float, 0.7, "Confidence threshold (tau)", "commit every masked position above it, "
              "always the most confident", low=0, high=1, low_open=True, slider=(0.05, 1.0, 0.05), headline=True),
        Param("edit_threshold", float, 0.5, "Edit threshold", "rewrite a committed token whose draft is another "
              "token with probability above it (0: whenever the draft differs)", low=0, high=1,
              slider=(0.0, 1.0, 0.05), headline=True),
        Param("max_post_steps", int, 16, "Forwards after the block fills", "at most this many more forwards "
              "re-read a block with no mask, ending at the first that edits nothing", low=0, high=64,
              slider=(0, 16, 1)),
    ),
    block_by_block=True, trace_fields={"edited": Count}))
register(PolicySpec(
    "cache", "drift_refresh", "Drift-triggered refresh (Elastic-Cache)",
    "Reuse like DualCache; refresh the whole cache when the block's attention, at a probe layer over its "
    "most-attended positions, drifts from what it was at the last refresh.",
    "dllm_local.policies.drift_refresh:DriftRefresh",
    (
        Param("gamma", float, 0.9, "Drift threshold (gamma)",
              "refresh when the attention cosine falls under it (1: every step; 0: only at block starts)",
              low=0, high=1, slider=(0.0, 1.0, 0.01), headline=True),
        Param("probe_layer", int, None, "Probe layer", "the layer whose attention is watched; None: the middle one",
              low=0, high=1023, optional=True),  # past the model's own layers: refused when a run starts
        Param("top_k", int, 8, "Most-attended positions", "how many positions the drift is measured over", low=1,
              high=MAX_GEN_LENGTH,
              slider=(1, 64, 1)),
    ),
    model_kinds=_BIDIRECTIONAL, trace_fields={"drift": Number | None, "refresh_next": Flag}))
register(PolicySpec(
    "cache", "flash", "Flash-Cache (Flash-dLLM as released)",
    "As VILA-Lab/Flash-dLLM's generator does it: a window sliding over the next block of undecoded positions; "
    "after one full forward, recompute only the window, the newest and most-attended decoded positions and the "
    "next masks; the span padded with end-of-text; the first end-of-text ends the answer.",
    "dllm_local.policies.flash_dllm:FlashCache",
    (
        Param("track_num", int, 4, "Tracked blocks (track_num)",
              "decoded positions recomputed each step, in blocks: the newest commits, then the most attended "
              "(-1: recompute everything)", low=-1, high=64, slider=(-1, 8, 1), headline=True),
        Param("mask_num", int, 4, "Mask blocks (mask_num)",
              "the window and the next mask_num - 1 blocks of masks are recomputed each step", low=1, high=64,
              slider=(1, 8, 1)),
        Param("pad_to", int, 128, "Pad the span to", "attention covers prompt + answer padded with end-of-text "
              "up to the next multiple of this, which counts against the model's length (0: no padding)",
              low=0, high=1024, slider=(0, 256, 16)),
    ),
    slides=True, model_kinds=_BIDIRECTIONAL,
    trace_fields={"window": list[AnswerPosition], "tracked": list[SequencePosition], "length": Count}))
register(PolicySpec(
    "unmask", "flash_verify", "Flash-Verify (Flash-dLLM as released)",
    "As VILA-Lab/Flash-dLLM's generator does it: commit by the threshold, then verify up to block/2 more drafts "
    "in one extra forward that reads the cache; accept the longest prefix whose running product of "
    "P(draft | masked) stays >= gamma.",
    "dllm_local.policies.flash_dllm:FlashVerify",
    (
        _THRESHOLD,
        Param("gamma", float, 0.8, "Acceptance (gamma)",
              "accept drafts while the product of their verified probabilities stays >= gamma",
              low=0, high=1, low_open=True, slider=(0.05, 1.0, 0.05), headline=True),
    ),
    position_wise_model=True,
    trace_fields={"verify_candidates": Count, "verify_accepted": Count, "accepted_at": list[Rejected]}))
