"""Each model family's presets and verdicts (issue 60): the preset menu offers the presets for the
loaded model's kind and family, each family preset runs on its family's tiny model in a real
browser, and every verdict beside the views agrees with the run's exported trace, told once; a
random checkpoint's answer is said to be not graded, by the same rule for every family."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import dllm_local
from dllm_local.settings import Settings
from dllm_local.tiny.tasks import recognise, score
from ui.lessons import verdicts as lessons
from ui.parts.presets import load_presets, presets_for
from ui.parts.replay import prompt_of

from test_diffusion_gemma_page import pg  # noqa: F401 - a tall page on the tiny model's server, downloads accepted
from test_page import _choose, _load_model, _shown_run, _wait_run_ended, browser, export_trace, server  # noqa: F401

PRESETS, _ = load_presets()
SHOTS = os.environ.get("DLLM_SCREENSHOTS")  # a folder: a screenshot of each family preset's run there
ARITHMETIC = "Mia has 4 boxes of 5 shells and 3 loose shells. How many in all?"
BLOCK = "Block diffusion: block cache + threshold"
# Each family preset on a tiny model of a family it is for.
FAMILY_RUNS = [("tiny-block", BLOCK), ("tiny-sdar", BLOCK), ("tiny-llada2", "LLaDA 2.1: token-to-token editing"),
               ("tiny-fast-dllm-v2", "Fast-dLLM v2: sub-blocks with their cache"),
               ("tiny-diffusiongemma", "DiffusionGemma: canvases and their stopping rule")]


@pytest.mark.parametrize("name", ["tiny-sdar", "tiny-llada2", "tiny-llada-moe", "tiny-fast-dllm-v2",
                                  "tiny-diffusiongemma"])
def test_every_random_family_checkpoint_says_so_for_the_tiny_arithmetic_prompt(name):
    handle = dllm_local.load(name, device="cpu", dtype="float32")
    masked = dllm_local.kinds.get(handle.kind).has_mask
    settings = {"gen_length": 32, **({"block_size": handle.block_size or 32} if masked else {})}
    trace = dllm_local.generate(handle, ARITHMETIC, Settings.from_dict(settings)).trace.to_dict()
    assert prompt_of(trace) == ARITHMETIC  # each family's chat template read back
    verdict = next(v for v in lessons.grid_verdicts(trace, len(trace["steps"]) - 1) if v.lesson == "answer")
    assert verdict.status == lessons.UNMEASURABLE and f"{name} is a random checkpoint" in verdict.text


def test_every_preset_is_for_some_model_and_each_kind_has_its_own():
    kinds = {"masked": {"kind": "masked", "family": "llada"}, "block": {"kind": "block", "family": "sdar"},
             "canvas": {"kind": "canvas", "family": "diffusion_gemma"}}
    offered = {kind: presets_for(PRESETS, model) for kind, model in kinds.items()}
    assert all(offered.values()) and not set(offered["masked"]) & set(offered["block"])
    assert BLOCK in offered["block"] and "LLaDA 2.1: token-to-token editing" not in offered["block"]  # LLaDA2's own
    assert "LLaDA 2.1: token-to-token editing" in presets_for(PRESETS, {"kind": "block", "family": "llada2_moe"})
    assert {n for n in PRESETS if any(n in names for names in offered.values())} | {
        n for n in PRESETS if PRESETS[n].get("fits", {}).get("families")} == set(PRESETS)


def _offered(pg) -> list[str]:
    pg.click("#preset input")
    options = [o.replace("✓", "").strip() for o in pg.get_by_role("option").all_inner_texts()]
    pg.keyboard.press("Escape")
    return options


def _claims(pg) -> list[str]:
    """The claim of every verdict line on the page, beside whichever view."""
    return pg.eval_on_selector_all(".dl-verdict b", "els => els.map(e => e.innerText.split(':')[0])")


def _told(pg, box: str) -> str:
    return pg.inner_text(box)


@pytest.mark.parametrize("model,name", FAMILY_RUNS)
def test_each_family_preset_runs_and_its_verdicts_agree_with_its_trace(pg, model, name, tmp_path):
    _load_model(pg, model)
    preset = PRESETS[name]
    _choose(pg, "#preset", name)
    pg.wait_for_function("(d) => document.querySelector('#preset-info').innerText.includes(d)",
                         arg=preset["description"][:40])
    before = _shown_run(pg)
    pg.click("#run-btn")
    status = _wait_run_ended(pg, before, timeout=300_000)
    assert "Done" in status, status
    trace = json.loads(export_trace(pg, tmp_path / "trace.json").read_text())
    info = trace["model"]
    assert _offered(pg) == presets_for(PRESETS, info) and name in presets_for(PRESETS, info)
    settings = trace["settings"]
    for key, value in preset["settings"].items():
        if key != "trace":
            assert settings[key] == value if not isinstance(value, dict) else value.items() <= settings[key].items()
    if info["kind"] == "block":  # the model's own block, which the preset leaves to it
        assert settings["block_size"] == info["block_size"]
    if SHOTS:
        pg.screenshot(path=str(Path(SHOTS) / f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{model}.png"),
                      full_page=True)
    grid, kv, cache = (_told(pg, box) for box in ("#grid-verdicts", "#kv-verdicts", "#cache-verdicts"))
    claims = _claims(pg)
    assert len(claims) == len(set(claims)), f"a verdict told twice: {claims}"
    steps = trace["steps"]

    # The answer: graded on a model trained on the tiny tasks, never on a random one.
    if info["trained_tasks"]:
        right = score(recognise(ARITHMETIC), trace["text"])
        assert f"The answer is right: {'holds' if right else 'does not hold'} — {'right' if right else 'wrong'}" in grid
    else:
        assert f"The answer is right: not measurable in this run — {model} is a random checkpoint" in grid

    if info["kind"] == "block":  # the stored blocks, from the trace's store spans
        spans = [s["stored"] for s in steps if s.get("stored")]
        stored = {p for a, b in spans for p in range(a, b)}
        since = {p: i for i, s in enumerate(steps) if s.get("stored") for p in range(*s["stored"])}
        again = sorted({p for i, s in enumerate(steps) for p in s.get("recomputed") or [] if since.get(p, i + 1) <= i})
        assert f"Finished blocks' K/V are exact: holds — {len(stored)} positions" in kv
        assert f"in {len(spans)} span(s)" in kv and "yet recomputed" not in kv
        # Fast-dLLM v2's shifted head runs each block's last position again as a query: said, not hidden.
        assert (f"positions {again[:8]} ran again, each only as the query" in kv) == bool(again)
        assert bool(again) == bool(info.get("shifted_head"))
    if settings.get("unmask") == "edit":
        edits = sum(len(s.get("edited") or []) for s in steps)
        assert (f"Editing rewrote committed tokens: holds — {edits} edit" in grid if edits else
                "Editing rewrote committed tokens: does not hold — no committed token's draft changed" in grid)
    if info["kind"] == "canvas":
        canvases: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            canvases.setdefault(s["canvas"]["canvas"], []).append(i)
        most = settings["canvas_params"].get("max_denoising_steps") or info["canvas_defaults"]["max_denoising_steps"]
        for c, rows in canvases.items():
            finished = steps[rows[-1]]["canvas"]["finished"]
            said = (f"canvas {c + 1} stopped early at step {len(rows)} of {most}" if finished and len(rows) < most else
                    f"canvas {c + 1} met its stopping rule only at its last step" if finished else
                    f"canvas {c + 1} ran all {len(rows)} steps")
            assert said in grid, grid
        # The encoder's cache: beside the Cache panel alone.
        assert "The encoder's cache is exact: holds" in cache and "encoder" not in kv + grid
