"""Two settings' runs compared like with like: their answers position by position up to the end of
text (not over the padding after it), their times over repeats by ``ui.parts.timing``'s rank test, and
no speed ratio at all between runs of different answer lengths. Pure functions of trace dicts,
and the table that shows the result."""
from __future__ import annotations

import html
from collections.abc import Sequence

from ..parts.replay import numbers
from ..parts.timing import speedup, spread, spread_text
from ..parts.trace_parts import Trace, answer_length, first_end

TIMED = ("wall_s", "model_s", "content_tokens_per_s", "tokens_per_s")  # the numbers that vary run to run


def answer_ids(trace: Trace) -> list[int | None]:
    """The answer's token ids: the answer positions before the first end-of-text token (all of
    them when none was committed). What follows an end of text is padding, not answer."""
    ids = list(trace.get("final_ids") or [])
    return ids[:first_end(trace, ids)]


def answers_compared(trace_a: Trace, trace_b: Trace) -> dict:
    """``compared`` (answer positions: the longer answer's length), ``agreement`` (the share of
    them holding the same token in both; where one answer has ended, the other's tokens differ;
    two empty answers agree) and ``first_difference`` (the first such position, None when the
    answers are the same tokens and end at the same position)."""
    ids_a, ids_b = answer_ids(trace_a), answer_ids(trace_b)
    compared = max(len(ids_a), len(ids_b))
    same = sum(x == y for x, y in zip(ids_a, ids_b))
    differing = [i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y]
    if len(ids_a) != len(ids_b):
        differing.append(min(len(ids_a), len(ids_b)))
    return {"compared": compared, "agreement": same / compared if compared else 1.0,
            "first_difference": differing[0] if differing else None}


def forward_ran(trace: Trace) -> str:
    """The mode the run's forwards ran in, and why it is not the one asked for when it is not (a
    fallback to eager): a side that asked for compiled and ran eager is timed as eager. "—": a trace
    that does not say."""
    stats = trace.get("stats") or {}
    mode, notice = stats.get("forward_mode"), stats.get("forward_notice")
    return "—" if not mode else f"{mode} (⚠ {notice})" if notice else str(mode)


def compare(trace_a: Trace, trace_b: Trace, repeats_a: Sequence[Trace] = (), repeats_b: Sequence[Trace] = ()) -> dict:
    """How run b compares with run a (e.g. a = no cache, b = cached).

    ``trace_a``/``trace_b`` are the runs shown (their answers, forwards, τ); ``repeats_a``/
    ``repeats_b`` the timed repeats of each side's settings (default: the shown run alone).

    Keys: per side (``_a``/``_b``): ``answer``, ``length`` (answer positions: the generation
    length), ``nfe``, ``tau``, ``content_tau``, ``forward`` (:func:`forward_ran`), ``repeats`` (timed
    runs), ``timing`` (a :func:`~ui.parts.timing.spread` per ``TIMED`` number), ``wall_s`` and
    ``model_s`` (their medians)
    and ``same_tokens`` (every repeat committed the shown run's final tokens: the times are of
    the same work); ``same_length``; ``speed_wall`` and ``speed_model`` (:func:`~ui.parts.timing.speedup`
    of B over A, its verdict "different lengths" and no ratio when ``same_length`` is False);
    ``speedup_wall`` and ``speedup_model`` (their ratios of medians); and
    :func:`answers_compared`'s ``compared``, ``agreement`` and ``first_difference``.
    """
    result, times = {}, {}
    for side, trace, repeats in (("a", trace_a, repeats_a), ("b", trace_b, repeats_b)):
        shown, runs = numbers(trace), [numbers(r) for r in repeats] or [numbers(trace)]
        times[side] = {key: [run[key] for run in runs] for key in TIMED}
        timing = {key: spread(values) for key, values in times[side].items()}
        result.update({f"answer_{side}": trace.get("text", ""), f"length_{side}": answer_length(trace),
                       f"nfe_{side}": shown["nfe"], f"tau_{side}": shown["tau"],
                       f"content_tau_{side}": shown["content_tau"], f"forward_{side}": forward_ran(trace),
                       f"repeats_{side}": len(runs),
                       f"timing_{side}": timing, f"wall_s_{side}": timing["wall_s"]["median"],
                       f"model_s_{side}": timing["model_s"]["median"],
                       f"same_tokens_{side}": all(r.get("final_ids") == trace.get("final_ids") for r in repeats)})
    result["same_length"] = result["length_a"] == result["length_b"]
    for kind in ("wall", "model"):
        if result["same_length"]:
            speed = speedup(times["a"][f"{kind}_s"], times["b"][f"{kind}_s"])
        else:
            speed = {"ratio": None, "p": None, "verdict": "different lengths",
                     "text": f"not compared: A answered in {result['length_a']} positions and B in "
                             f"{result['length_b']}, so their times are of different work"}
        result.update({f"speed_{kind}": speed, f"speedup_{kind}": speed["ratio"]})
    return {**result, **answers_compared(trace_a, trace_b)}


def compare_html(result: dict) -> str:
    """The :func:`compare` numbers as one table: a row per measure, a column per side. Times and
    speeds are medians with their min–max over the timed repeats; the speedup is the ratio of the
    medians with the rank test's verdict (:func:`~ui.parts.timing.speedup`)."""
    def pair(key: str, spec: str) -> tuple[str, str]:
        return tuple("—" if result[f"{key}_{side}"] is None else format(result[f"{key}_{side}"], spec) for side in "ab")

    def timed(key: str, spec: str, unit: str = "") -> tuple[str, str]:
        return tuple(spread_text(result[f"timing_{side}"][key], spec, unit) for side in "ab")

    rows = [
        ("answer", (result["answer_a"], result["answer_b"])),
        ("generation length", pair("length", "d")),
        ("forward mode (ran)", (result["forward_a"], result["forward_b"])),
        ("wall time", timed("wall_s", ".3f", " s")),
        ("model time", timed("model_s", ".3f", " s")),
        ("speed (answer tokens / s, model time)", timed("content_tokens_per_s", ".1f")),
        ("forwards (NFE)", pair("nfe", "d")),
        ("τ (tokens / forward)", pair("tau", ".2f")),
        ("content τ", pair("content_tau", ".2f")),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(a)}</td><td>{html.escape(b)}</td></tr>"
                   for k, (a, b) in rows)
    first, compared = result["first_difference"], result["compared"]
    differed = [side.upper() for side in "ab" if not result[f"same_tokens_{side}"]]
    summary = [
        ("speedup of B (wall)", result["speed_wall"]["text"]),
        ("speedup of B (model time)", result["speed_model"]["text"]),
        ("tokens over the repeats", f"⚠ {' and '.join(differed)} committed different tokens in different repeats: "
                                    "the times are not of the same work" if differed else
                                    "the same in every repeat of each side"),
        ("token agreement", f"{result['agreement']:.1%} of the {compared} answer positions up to the end of text"),
        ("first difference", "none: the same answer" if first is None else f"answer position {first}"),
    ]
    body += "".join(f'<tr><td>{html.escape(k)}</td><td colspan="2"><b>{html.escape(v)}</b></td></tr>' for k, v in summary)
    return f'<table class="dl-compare" style="font-size:15px;"><tr><th></th><th>A</th><th>B</th></tr>{body}</table>'
