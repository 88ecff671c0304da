"""The controls' logic, kept apart from the layout so that it is plain, testable Python.

The policy controls come from the policy specs (``registry.all_specs()``: plain dicts, as the
engine describes them to the page): one knob per (kind, parameter name), shown while the chosen
policy of that kind has that parameter. Nothing here knows a policy or a parameter by name.
"""
from __future__ import annotations

from pydantic import TypeAdapter

from dllm_local.policies import registry
from dllm_local.settings import Length, knob
from dllm_local.values import read

from ..block.parts import is_block_model
from ..canvas.controls import canvas_notice, canvas_params, canvas_values
from ..canvas.parts import is_canvas_model
from ..parts.kinds import model_kind

LENGTH = TypeAdapter(Length)  # a length control's value (a slider's float, or an API call's anything)

Specs = dict[str, list[dict]]  # kind ("cache", "unmask") -> its policies' spec dicts
KINDS = ("cache", "unmask")
# The settings the page has a control for, each with its knob's default (``settings.knob``).
SETTING_CONTROLS = ("gen_length", "block_size", "steps", "temperature", "seed", *KINDS, "exact_drift", "forward_mode")
# The page's trace level, whatever the settings' default: its views read every recorded position.
PAGE_TRACE = "full"


def spec_named(specs: Specs, kind: str, name: str) -> dict:
    for spec in specs[kind]:
        if spec["name"] == name:
            return spec
    raise ValueError(f"{kind} policy must be one of {', '.join(s['name'] for s in specs[kind])}, not {name!r}")


def policy_choices(specs: Specs, kind: str) -> list[tuple[str, str]]:
    """(label, name) of every policy of ``kind``: a dropdown shows the label and gives the name."""
    return [(spec["label"], spec["name"]) for spec in specs[kind]]


def cache_choices(specs: Specs, model: dict) -> list[tuple[str, str]]:
    """(label, name) of the cache policies that make sense for ``model``'s kind (the registry's
    ``for_model``): a block model's block cache or none, a masked model's all but the block cache.
    A policy this process's registry does not know (an engine's plugin) is offered to both."""
    allowed = registry.for_model(model_kind(model).policy_kind, registry.CACHE)
    return [(spec["label"], spec["name"]) for spec in specs["cache"]
            if spec["name"] in allowed or spec["name"] not in registry.CACHE]


def takes_cache(specs: Specs, model: dict, cache: str | None) -> bool:
    """Whether ``model``'s kind offers the cache policy ``cache`` (``cache_choices``)."""
    return cache in {name for _, name in cache_choices(specs, model)}


def model_start(model: dict) -> dict:
    """The cache and block size a run of ``model`` starts at: a block model's block cache and the
    block it was trained with; a masked model's defaults."""
    if is_block_model(model):
        start = {"cache": "block", "block_size": int(model.get("block_size") or knob("block_size").default)}
        # Its release's sub-blocks (Fast-dLLM v2), else the whole block at once.
        return {**start, knob_key("cache", "sub_block"): int(model["sub_block"]) if model.get("sub_block") else None}
    return {"cache": knob("cache").default, "block_size": knob("block_size").default}


def preset_label(model: dict) -> str:
    """The preset box's label: it offers the presets for the loaded model's kind (``presets_for``)."""
    return f"Preset (for {model_kind(model).label} models)"


def fit_to_model(values: dict, specs: Specs, model: dict, given: dict | None = None) -> dict:
    """Control ``values`` (a preset's, a trace's) for ``model``: a cache policy its kind refuses
    gives way, with the block size, to what ``model`` starts at; on a block model, the block size
    and cache knobs that ``given`` (the settings the values were read from) leaves unset are the
    model's own (a block preset is for every block model, each with its trained block)."""
    if not takes_cache(specs, model, values["cache"]):
        return {**values, **model_start(model)}
    if given is None or not is_block_model(model):
        return values
    named = {"block_size"} & set(given) | {knob_key("cache", p) for p in given.get("cache_params") or {}}
    return {**values, **{name: v for name, v in model_start(model).items() if name != "cache" and name not in named}}


def kind_values(specs: Specs, model: dict, previous: dict, kept: dict | None = None) -> dict[str, dict]:
    """Updates (by control name) of the cache and block-size controls when ``model`` replaces
    ``previous`` (the engine's info on each): the cache choices of its kind, and, where the kind or
    a block model's block changes, the values it starts at; back on a masked model, the user's own
    (``kept``: what ``kept_aside`` kept when a block model took over), else a masked model's defaults."""
    updates = {"cache": {"choices": cache_choices(specs, model)}}
    changed = is_block_model(model) != is_block_model(previous) or (
        is_block_model(model) and (model.get("name"), model.get("block_size")) != (previous.get("name"), previous.get("block_size")))
    if changed:
        start = model_start(model) if is_block_model(model) else {**model_start(model), **given_back(specs, model, kept)}
        for name, value in start.items():
            updates.setdefault(name, {})["value"] = value
    return updates


# What a block model's own settings displace, given back when a masked model is loaded again.
KEPT_CONTROLS = ("cache", "block_size")


def given_back(specs: Specs, model: dict, kept: dict | None) -> dict:
    """The kept cache and block size that ``model`` takes: none where the cache is one its kind
    refuses (a page started on a block model kept its preset's block cache)."""
    kept = {name: value for name, value in (kept or {}).items() if name in KEPT_CONTROLS}
    return kept if takes_cache(specs, model, kept.get("cache")) else {}


def kept_aside(model: dict, previous: dict, values: dict, kept: dict) -> dict:
    """What ``model`` displaces when it replaces ``previous``, added to ``kept``: the masked-model
    cache and block size (of the control ``values``) that a block model's own stand in for, for
    ``kind_values`` to give back when a masked model is loaded again; and, where the kind changes,
    the preset the box named (``values["preset"]``), under ``preset_key`` of the kind left."""
    kept = dict(kept)
    if model_kind(model).name != model_kind(previous).name:
        kept[preset_key(previous)] = values.get("preset")
    if is_block_model(model) and not is_block_model(previous):
        kept.update({name: values[name] for name in KEPT_CONTROLS})
    return kept


def preset_key(model: dict) -> str:
    """Where ``kept_aside`` keeps the preset named while a model of ``model``'s kind was loaded."""
    return f"preset:{model_kind(model).name}"


def knob_key(kind: str, name: str) -> str:
    """The control name of a policy parameter, e.g. "unmask.threshold"."""
    return f"{kind}.{name}"


def knobs(specs: Specs, kind: str | None = None) -> dict[str, dict]:
    """Every policy parameter (of ``kind``, or of both kinds) as one knob: control name -> the Param
    dict it is built from. Policies of one kind share a knob by parameter name (its first
    declaration sets range and label)."""
    out: dict[str, dict] = {}
    for each in [kind] if kind else KINDS:
        for spec in specs[each]:
            for param in spec["params"]:
                out.setdefault(knob_key(each, param["name"]), param)
    return out


def _chosen(specs: Specs, cache: str, unmask: str) -> dict[str, dict]:
    return {"cache": spec_named(specs, "cache", cache), "unmask": spec_named(specs, "unmask", unmask)}


def toggled_controls(specs: Specs, kind: str) -> list[str]:
    """The controls shown only for some policies of ``kind``: its knobs, and for the unmasking
    policy ``steps`` (the length of a schedule that has one)."""
    return [*(["steps"] if kind == "unmask" else []), *knobs(specs, kind)]


def shown_for(specs: Specs, kind: str, name: str) -> dict[str, bool]:
    """Which of ``toggled_controls(specs, kind)`` the policy ``name`` uses."""
    spec = spec_named(specs, kind, name)
    used = {knob_key(kind, p["name"]) for p in spec["params"]} | ({"steps"} if spec["uses_steps"] else set())
    return {control: control in used for control in toggled_controls(specs, kind)}


def visible_knobs(cache: str, unmask: str, specs: Specs | None = None) -> dict[str, bool]:
    """Which of the policy-dependent controls the chosen policies use."""
    specs = specs or registry.all_specs()
    return {**shown_for(specs, "cache", cache), **shown_for(specs, "unmask", unmask)}


def fit_block(gen_length: int, block_size: int, absolute: bool = False) -> tuple[int, int, str]:
    """Block size must divide the generation length: round the length up, and say so. Blocks at
    ``absolute`` positions (a block-diffusion model's) take any length, as its release does."""
    gen_length, block_size = read(LENGTH, gen_length, "gen_length"), read(LENGTH, block_size, "block_size")
    if absolute or gen_length % block_size == 0:
        return gen_length, block_size, ""
    adjusted = -(-gen_length // block_size) * block_size
    return adjusted, block_size, (f"Generation length adjusted from {gen_length} to {adjusted} so that "
                                  f"block size {block_size} divides it.")


def masked_only(specs: Specs) -> list[str]:
    """The controls that mean nothing for a canvas model (``canvas_controls.REASON``): the
    policies and their knobs, the block, steps, temperature, exact drift and the forward mode (its
    sampler calls transformers' own model, not the forward runner)."""
    return [*KINDS, *knobs(specs), "block_size", "steps", "temperature", "exact_drift", "forward_mode"]


def settings_from_controls(v: dict, specs: Specs | None = None, model: dict | None = None) -> tuple[dict, str]:
    """Control values by control name -> a settings dict and a notice, for ``model`` (the engine's
    info on the loaded model; None: a masked model). Only the chosen policies' knobs are read. The
    values go as the controls give them: ``Settings`` types and checks them, once, with messages
    naming the knob."""
    if model is not None and is_canvas_model(model):
        return canvas_run_settings(v, model)
    specs = specs or registry.all_specs()
    absolute = model is not None and is_block_model(model)  # its blocks sit at absolute positions: any length
    gen_length, block_size, notice = fit_block(v["gen_length"], v["block_size"], absolute)
    unmask = v["unmask"]
    if spec_named(specs, "cache", v["cache"]).get("slides") and spec_named(specs, "unmask", unmask).get("block_by_block"):
        # As a length the block does not divide is rounded: the run goes on, and the notice says how.
        notice = " ".join(filter(None, [notice, f"The {v['cache']} cache slides a window over the undecoded positions, "
                                                f"which {unmask} cannot follow (it decodes block by block): this run "
                                                f"commits by threshold instead."]))
        unmask = "threshold"
    chosen = _chosen(specs, v["cache"], unmask)
    steps = None
    if chosen["unmask"]["uses_steps"] and v.get("steps"):
        blocks = -(-gen_length // block_size)
        steps = max(blocks, read(LENGTH, v["steps"], "steps") // blocks * blocks)
    settings = {
        "gen_length": gen_length, "block_size": block_size, "steps": steps,
        "temperature": v["temperature"], "seed": v["seed"],
        "trace": PAGE_TRACE, "exact_drift": v["exact_drift"], "early_stop": False, "forward_mode": v["forward_mode"],
        **({"absolute_blocks": True} if absolute else {}),  # a masked model's settings read as before
    }
    for kind, spec in chosen.items():
        settings[kind] = spec["name"]
        settings[f"{kind}_params"] = {p["name"]: v[knob_key(kind, p["name"])] for p in spec["params"]}
    return settings, notice


def canvas_run_settings(v: dict, model: dict) -> tuple[dict, str]:
    """A canvas model's settings: its own knobs, the length and the seed. The masked models'
    controls stay at their defaults (a canvas run refuses them changed); the block is the whole
    length, which ``Settings`` asks to divide it."""
    params = canvas_params(v)
    gen_length = read(LENGTH, v["gen_length"], "gen_length")
    canvas_length = read(LENGTH, params.get("canvas_length", model["canvas_length"]), "canvas_length")
    return ({"gen_length": gen_length, "block_size": gen_length, "seed": v["seed"], "trace": PAGE_TRACE,
             "early_stop": False, "canvas_params": params}, canvas_notice(gen_length, canvas_length))


def controls_from_settings(s: dict, specs: Specs | None = None) -> dict:
    """A preset's settings -> control values: its policies' parameters set their knobs; every knob
    it leaves out takes its default (the chosen policy's, where that policy has the parameter)."""
    specs = specs or registry.all_specs()
    out = {name: s.get(name, knob(name).default) for name in SETTING_CONTROLS}
    # No steps is one token per step: as many steps as the length, which the slider then shows.
    out["steps"] = out["steps"] or out["gen_length"]
    out.update({key: param["default"] for key, param in knobs(specs).items()})
    for kind, spec in _chosen(specs, out["cache"], out["unmask"]).items():
        given = s.get(f"{kind}_params") or {}
        out.update({knob_key(kind, p["name"]): given.get(p["name"], p["default"]) for p in spec["params"]})
    return {**out, **canvas_values(s)}


def changed_controls(values: dict, preset: dict, specs: Specs) -> list[str]:
    """The labels of the controls whose ``values`` differ from ``preset``'s (control values both,
    by control name): the settings and the knobs of the policies ``values`` chooses (a knob no
    chosen policy reads, or steps where the schedule has none, changes nothing a run does)."""
    used = visible_knobs(values["cache"], values["unmask"], specs)
    params = knobs(specs)
    names = [name for name in (*SETTING_CONTROLS, *params) if used.get(name, True)]

    return [params[name]["label"] if name in params else knob(name).label for name in names
            if _plain(values.get(name)) != _plain(preset.get(name))]


def _plain(value: object) -> object:
    """A control's value as a run reads it: a slider's 32.0 is 32, an optional knob's text box
    "8" is 8 and left empty is None."""
    if value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    try:
        return float(value)
    except ValueError:  # a policy's name, a choice in words
        return value


def policies_of(settings: dict) -> tuple[str, str]:
    """The cache and unmasking policies ``settings`` names (their knobs' defaults where it does not)."""
    cache, unmask = (settings.get(kind, knob(kind).default) for kind in KINDS)
    return cache, unmask


def sweep_knobs(specs: Specs, settings: dict) -> dict[str, dict]:
    """The numeric parameters of the policies ``settings`` names, by control name: what a sweep can
    vary besides the block size."""
    return {knob_key(kind, p["name"]): p for kind, spec in _chosen(specs, *policies_of(settings)).items()
            for p in spec["params"] if p["type"] in ("int", "float")}


def settings_line(settings: dict) -> str:
    """The settings a run used, in one line: policies (with the unmasking policy's knobs), block,
    length and seed."""
    params = ", ".join(f"{k} {v}" for k, v in sorted(settings.get("unmask_params", {}).items()))
    unmask = f"{settings['unmask']} ({params})" if params else settings["unmask"]
    return f"{settings['cache']} + {unmask} · block {settings['block_size']} · length {settings['gen_length']} · seed {settings['seed']}"
