"""The sampler's knobs as flags (shared by generate, eval, bench, sweep and lm-eval): each knob's
default, range and help from ``settings.knob``, the policies and their parameters from the registry."""
from __future__ import annotations

import argparse

from .. import kinds
from ..canvas.settings import CANVAS_KNOBS, canvas_knob
from ..errors import DllmError, SettingsError
from ..files import FileRefused, parse_json
from ..policies import registry
from ..settings import Knob, Settings, knob

# Each policy parameter's shorthand flag stores its value under this prefix (``--floor`` -> ``param_floor``).
PARAM_DEST = "param_"
CANVAS_DEST = "canvas_"  # and each canvas knob's (``--entropy-bound`` -> ``canvas_entropy_bound``)
# bench and lm-eval answer real questions (GSM8K's take a few hundred tokens): a longer answer region.
LONG_GEN_LENGTH = 256


def add_settings_args(ap: argparse.ArgumentParser, long_answers: bool = False) -> None:
    for name, kind in (("gen_length", int), ("steps", int), ("temperature", float), ("seed", int)):
        _knob_flag(ap, name, type=kind)
    # Unset, these two are the model's to decide (``model_defaults``): their defaults are told, not set.
    _knob_flag(ap, "block_size", more="a block-diffusion model's default: its own block", unset=True, type=int)
    _knob_flag(ap, "cache", more=f"a block-diffusion model's default: block; {_policy_help('cache')}", unset=True)
    cache_params = knob("cache_params")
    ap.add_argument("--cache-param", action="append", default=[], metavar="KEY=VALUE",
                    help=_escaped(cache_params.help) + ", as KEY=VALUE, e.g. refresh_every=4, floor=0.5")
    unmask = knob("unmask")
    ap.add_argument("--unmask", default=None, choices=unmask.choices,
                    help=f"{_escaped(unmask.help)} (default: the policy a given parameter flag is named after, such "
                         f"as --threshold, else {unmask.default}); {_policy_help('unmask')}")
    ap.add_argument("--unmask-param", action="append", default=[], metavar="KEY=VALUE",
                    help=_escaped(knob("unmask_params").help) + ", as KEY=VALUE, e.g. rho=0.5, rule=topk")
    _knob_flag(ap, "trace")
    _knob_flag(ap, "exact_drift", action="store_true")
    _knob_flag(ap, "early_stop", action="store_true")
    _knob_flag(ap, "absolute_blocks", action="store_true")
    _knob_flag(ap, "forward_mode")
    _knob_flag(ap, "attention_backend")
    ap.add_argument("--guider", default=None, help="guider model for a policy that needs one (default: tiny-guider)")
    _add_param_shorthands(ap)
    _add_canvas_flags(ap)
    if long_answers:
        ap.set_defaults(gen_length=LONG_GEN_LENGTH)


def _knob_flag(ap: argparse.ArgumentParser, name: str, more: str = "", unset: bool = False, **options) -> None:
    """``--NAME`` for a knob: its default, choices, range and help as ``knob`` gives them
    (``unset``: the flag's value stays None when not given, its default said in the help)."""
    k = knob(name)
    help_ = f"{_escaped(k.help)} ({_rule(k)}default: {_escaped(str(k.default))})" + (f"; {_escaped(more)}" if more else "")
    ap.add_argument(f"--{name.replace('_', '-')}", default=None if unset else k.default, help=help_, **options,
                    **({"choices": k.choices} if k.choices else {}))


def model_defaults(args: argparse.Namespace, decoding: dict) -> None:
    """The knobs left unset that the model's kind decides (``decoding``: the handle's ``decoding()``,
    or ``loader.decoding_facts`` where the model loads later): a block-diffusion model decodes its
    own block with its exact block cache; a canvas model decodes whole canvases, so any length is
    accepted (its block is the answer)."""
    kinds.get(decoding["kind"]).defaults(args, decoding)


def _rule(k: Knob) -> str:
    if k.low is not None and k.high is not None:
        return f"{k.low}..{k.high}; "
    return f">= {k.low}; " if k.low is not None else ""


def _escaped(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def _policy_help(kind: str) -> str:
    table = registry.CACHE if kind == "cache" else registry.UNMASK
    return _escaped("; ".join(f"{spec.name}: {spec.label}" + (f" [{', '.join(p.name for p in spec.params)}]"
                                                              if spec.params else "") for spec in table.values()))


def policy_params() -> dict[str, list[tuple[registry.PolicySpec, registry.Param]]]:
    """Every parameter of every registered policy by name, with the policies that take it."""
    by_name: dict[str, list[tuple[registry.PolicySpec, registry.Param]]] = {}
    for table in (registry.CACHE, registry.UNMASK):
        for spec in table.values():
            for param in spec.params:
                by_name.setdefault(param.name, []).append((spec, param))
    return by_name


def _param_value(takers: list[tuple[registry.PolicySpec, registry.Param]]):
    """An argparse type: the text as the value of a parameter of any policy that takes it."""
    def parse(text: str):
        for spec, param in takers:
            try:
                return param.coerce(text, spec.name)
            except SettingsError:
                continue
        rules = " or ".join(dict.fromkeys(param.rule() for _, param in takers))
        raise argparse.ArgumentTypeError(f"must be {rules}, not {text!r}")
    return parse


def _owners(specs: list[registry.PolicySpec]) -> str:
    """"cache drift_refresh; unmask guided": the policies, by kind."""
    return "; ".join(f"{kind} {', '.join(s.name for s in specs if s.kind == kind)}"
                     for kind in dict.fromkeys(s.kind for s in specs))


def _add_param_shorthands(ap: argparse.ArgumentParser) -> None:
    """``--NAME`` for each parameter of each registered policy (plugins included): it sets the
    parameter of whichever chosen policy takes it. A name that is already a flag is left to
    --cache-param / --unmask-param."""
    params = policy_params()
    choosers = [f"--{name}" for name in params if name in registry.UNMASK]
    group = ap.add_argument_group(
        "policy parameters", "shorthands for --cache-param / --unmask-param KEY=VALUE; each sets the parameter of the "
        f"chosen policy that takes it. {' or '.join(choosers)} without --unmask also chooses that unmasking policy.")
    for name, takers in params.items():
        # Policies that share a parameter's meaning share its line: "(in (0, 1]; unmask threshold, self_verify)".
        meanings: dict[tuple, list[registry.PolicySpec]] = {}
        for spec, param in takers:
            meanings.setdefault((param.label, param.help, param.rule()), []).append(spec)
        help_ = " | ".join(f"{label}: {text} ({rule}; {_owners(specs)})"
                           for (label, text, rule), specs in meanings.items())
        try:
            group.add_argument(f"--{name.replace('_', '-')}", dest=PARAM_DEST + name, type=_param_value(takers),
                               default=argparse.SUPPRESS, metavar=name.upper(), help=_escaped(help_))
        except argparse.ArgumentError:
            continue


def _add_canvas_flags(ap: argparse.ArgumentParser) -> None:
    """``--NAME`` for each canvas knob (``Settings.canvas_params``), read by its schema in Settings."""
    group = ap.add_argument_group("canvas models (DiffusionGemma)", "its own knobs; each not given is the "
                                  "checkpoint's generation_config.json value")
    for name in CANVAS_KNOBS:
        label, help_ = canvas_knob(name)
        group.add_argument(f"--{name.replace('_', '-')}", dest=CANVAS_DEST + name, default=argparse.SUPPRESS,
                           metavar=name.upper(), help=_escaped(f"{label}: {help_}"))


def parse_params(pairs: list[str]) -> dict:
    """``["floor=0.5", "rule=topk"]`` -> ``{"floor": 0.5, "rule": "topk"}`` (a value that is not JSON stays text)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise DllmError(f"parameter {pair!r} is not KEY=VALUE")
        try:
            out[key] = parse_json(value)
        except FileRefused:  # not JSON (or nested past reason): the schema reads it as text
            out[key] = value
    return out


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {dest[len(PARAM_DEST):]: value for dest, value in vars(args).items() if dest.startswith(PARAM_DEST)}
    canvas = {dest[len(CANVAS_DEST):]: value for dest, value in vars(args).items() if dest.startswith(CANVAS_DEST)}
    # A parameter named after its policy, given alone, chooses it: `--threshold 0.9` is threshold decoding.
    unmask = args.unmask or next((name for name in registry.UNMASK if name in given), knob("unmask").default)
    cache_params, unmask_params = parse_params(args.cache_param), parse_params(args.unmask_param)
    cache = args.cache or knob("cache").default
    block_size = args.block_size or knob("block_size").default
    chosen = ((registry.get("cache", cache), cache_params), (registry.get("unmask", unmask), unmask_params))
    for name, value in given.items():
        takers = [params for spec, params in chosen if name in spec.defaults]
        if not takers:
            owners = ", ".join(spec.name for spec, _ in policy_params()[name])
            raise SettingsError(f"--{name.replace('_', '-')} is a parameter of {owners}; the chosen policies "
                                f"(cache {cache}, unmask {unmask}) do not take it")
        for params in takers:
            params[name] = value
    return Settings(
        gen_length=args.gen_length, block_size=block_size, steps=args.steps, temperature=args.temperature,
        seed=args.seed, cache=cache, cache_params=cache_params,
        unmask=unmask, unmask_params=unmask_params, trace=args.trace, exact_drift=args.exact_drift,
        early_stop=args.early_stop, forward_mode=args.forward_mode, attention_backend=args.attention_backend,
        canvas_params=canvas, absolute_blocks=args.absolute_blocks,
    )
