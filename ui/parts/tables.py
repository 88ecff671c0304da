"""The numbers as HTML: the run's cards, the comparison table and the cost model's projection."""
from __future__ import annotations

import html
from typing import Any

from .replay import Trace


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "—"
    return format(value, spec)



ONE_RUN = "one run: timing varies run to run — Compare repeats"


def _verifying(nums: dict) -> int:
    """The forwards beyond one main forward per step: a verifying policy's (self-verify, Flash-Verify)."""
    steps = int(nums.get("steps") or 0)  # a trace kept without its steps says nothing of them
    return max(0, int(nums.get("nfe") or 0) - steps) if steps else 0


def forwards_unit(nums: dict) -> str:
    """What NFE counts, in words, with the verification forwards named apart when there are any, and
    a block-diffusion run's K/V store forwards beside it: "forwards", "forwards (6 main + 4
    verifying)", "forwards + 5 K/V store forwards"."""
    verifying, stores = _verifying(nums), int(nums.get("store_forwards") or 0)
    unit = f"forwards ({nums['steps']} main + {verifying} verifying)" if verifying else "forwards"
    return unit + (f" + {stores} K/V store forward{'' if stores == 1 else 's'}" if stores else "")


def numbers_html(nums: dict, timing: dict[str, dict] | None = None) -> str:
    """Compact cards of :func:`numbers`, each with its unit. The times and speeds are one run's,
    and say so, unless ``timing`` has their spread over repeats (``compare``'s ``timing_a``: a
    :func:`~ui.parts.timing.spread` per number): then they show its median and min–max."""
    repeated = {key: s for key, s in (timing or {}).items() if s["n"] >= 2}

    def timed(key: str, spec: str, unit: str, scale: float = 1.0) -> tuple[str, str]:
        """A timed card's value and unit: the median and range over repeats, else one run's value."""
        s = repeated.get(key)
        if s is None:
            value = nums.get(key)
            return _fmt(None if value is None else value * scale, spec), unit
        low, high = (format(s[end] * scale, spec) for end in ("min", "max"))
        return format(s["median"] * scale, spec), f"{unit}; median of {s['n']} repeats, {low}–{high}"

    speed_value, speed_unit = timed("content_tokens_per_s", ".1f", "answer tokens / s (model time)")
    cards = [
        ("speed", speed_value, speed_unit if "content_tokens_per_s" in repeated else f"{speed_unit}; {ONE_RUN}"),
        ("all tokens", *timed("tokens_per_s", ".1f", "tokens / s, end-of-text padding included")),
        ("NFE", _fmt(nums.get("nfe"), "d"), forwards_unit(nums)),
        ("committed", f"{_fmt(nums.get('committed'), 'd')}/{_fmt(nums.get('gen_length'), 'd')}", "tokens"),
        ("τ", _fmt(nums.get("tau"), ".2f"), "tokens / forward"),
        ("content τ", _fmt(nums.get("content_tau"), ".2f"), "content tokens / forward"),
        ("model", *timed("model_s", ".0f", "ms", 1e3)),
        ("wall", *timed("wall_s", ".2f", "s" if nums.get("finished") else "s (model + other, so far)")),
        ("outside model", _fmt(nums.get("other_share"), ".0%"), "of time"),
        ("mean G", _fmt(nums.get("mean_g"), ".1f"),
         "positions / step's main forward" if _verifying(nums) else "positions / forward"),
        ("cache hits", _fmt(nums.get("hit_rate"), ".0%"), "cumulative"),
    ]
    if nums.get("guider_forwards") != 0:  # None: an older trace, part way through, does not say
        cards.insert(3, ("guider", _fmt(nums.get("guider_forwards"), "d"), "forwards of the guider, not in NFE"))
    if nums.get("revisions"):
        cards.insert(4, ("revisions", _fmt(nums["revisions"], "d"), "tokens taken back"))
    if nums.get("exact_s"):
        cards.append(("exact-drift diagnostic", _fmt(nums["exact_s"] * 1e3, ".0f"), "ms, kept out of model time (in wall)"))
    card = ("display:inline-block;margin:3px;padding:4px 8px;border:1px solid #ddd;border-radius:6px;"
            "min-width:6.5em;vertical-align:top;background:#fafafa;")
    body = "".join(
        f'<div class="dl-card" style="{card}"><div style="font-size:14px;color:#555;">{html.escape(label)}</div>'
        f'<div style="font-size:22px;font-weight:600;">{html.escape(value)}</div>'
        f'<div style="font-size:14px;color:#666;">{html.escape(unit)}</div></div>'
        for label, value, unit in cards
    )
    return f'<div class="dl-numbers">{body}</div>'



def cost_table_html(rows: list[dict], model: str, device: str, trace: Trace) -> str:
    """The projection of :func:`dllm_local.analysis.costmodel.project` as a table, with its
    formula written out for this run, and this machine's measured step apart. A mixture of experts
    shows the experts each row's forward reads per layer and their share of the read; a canvas run,
    its encoder's passes over finished canvases per decoder pass; a block run, its K/V stores."""
    run = rows[0]
    moe = run.get("experts_total") is not None  # a dense target's rows, or rows made before experts, have none
    encoder = (run.get("encoder_ms") or 0) > 0
    stores = encoder and not (trace.get("stats") or {}).get("encoder_forwards")  # a block run's K/V stores
    head = ("<tr><th>strategy</th><th>G (positions / forward)</th><th>τ (answer tokens / forward)</th>"
            + ("<th>experts read / layer</th><th>expert read</th>" if moe else "")
            + "<th>step floor</th>" + (f"<th>{'K/V stores' if stores else 'encoder'} (per forward)</th>" if encoder else "")
            + "<th>bound</th><th>answer tokens / s</th><th>speedup vs AR</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['strategy'])}</td><td>{r['g']:.0f}</td><td>{r['tau']:.2f}</td>"
        + (f"<td>{r['experts_read']:.1f} of {r['experts_total']}</td><td>{r['expert_read_ms']:.2f} ms</td>" if moe else "")
        + f"<td>{r['floor_ms']:.2f} ms</td>" + (f"<td>{r['encoder_ms']:.2f} ms</td>" if encoder else "")
        + f"<td>{r['bound']}</td><td>{r['tokens_per_s']:.0f}</td><td><b>{r['speedup_vs_ar']:.2f}×</b></td></tr>"
        for r in rows
    )
    stats = trace.get("stats") or {}
    # Model time includes the guider's forwards: the time per forward counts them too, and says so.
    guider = int(stats.get("guider_forwards") or 0)
    measured = stats["model_s"] / max(1, stats["nfe"] + guider) * 1e3 if stats.get("nfe") else None
    model_name = (trace.get("model") or {}).get("name", "the loaded model")
    read = (f"weight read = dense weights + each layer's expected distinct experts, E × (1 − (1 − k/E)^G) "
            f"({run['experts_read']:.1f} of {run['experts_total']} here, {run['expert_read_ms']:.2f} ms of the read); "
            f"the arithmetic counts the k routed experts. " if moe else "")
    canvas = "" if not encoder else (
        f" Plus the K/V stores: {run['encoder_forwards']} forward(s) writing finished blocks into the cache, "
        f"{run['encoder_ms']:.2f} ms per denoising forward; tokens/s = τ / (floor + stores)." if stores else
        f" Plus the encoder: {run['encoder_forwards']} pass(es) writing finished canvases into its cache, "
        f"{run['encoder_ms']:.2f} ms per decoder pass; tokens/s = τ / (floor + encoder).")
    formula = (f"{read}step floor = max(weight read / bandwidth, G × 2 × params / FLOP rate) = "
               f"max({run['read_ms']:.2f} ms, {run['g']:.0f} × 2 × params / FLOP rate = {run['compute_ms']:.2f} ms) "
               f"= {run['floor_ms']:.2f} ms; tokens/s = τ / floor; speedup = this over the autoregressive row "
               f"(one token per weight read at batch 1).{canvas}")
    note = ("" if measured is None else
            f"Measured here: {html.escape(str(model_name))} took {measured:.2f} ms per forward of model time "
            + (f"(its {stats['nfe']} forwards and the guider's {guider} together) " if guider else "")
            + "on this machine; the projection above uses only this run's G and τ.")
    style = 'style="font-size:15px;color:#333;"'
    return (f'<div {style}><b>This run projected onto {html.escape(model)} on {html.escape(device)}</b>, batch 1, '
            f"bf16.</div><table class=\"dl-cost\" {style}>{head}{body}</table>"
            f'<div class="dl-formula" {style}>{html.escape(formula)}</div><div {style}>{note}</div>')
