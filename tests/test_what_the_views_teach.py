"""What the views teach, from real runs of the tiny model: the candidates behind a conflict,
self-verify's sent-back drafts, the verdict on a task answer, the trained-length notice."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dllm_local
from dllm_local import Settings
from dllm_local.models.loading.loader import TINY_MODEL
from dllm_local.settings import length_notice
from dllm_local.tiny.tasks import verdict
from ui.grid import tokens
from ui.parts import replay
from ui import figures
from ui.parts.presets import load_presets

ROOT = Path(__file__).resolve().parents[1]
PRESETS, _ = load_presets()
POKER = "Kate is playing cards. Name a poker hand Kate could hold."


def _preset(word: str) -> tuple[str, Settings]:
    preset = next(p for name, p in PRESETS.items() if word in name.lower())
    return preset["prompt"], Settings.from_dict(preset["settings"])


def test_straight_house_is_written_greedily_in_one_forward_with_no_guarantee(tiny):
    prompt, settings = _preset("straight house")
    result = dllm_local.generate(tiny, prompt, settings)
    assert settings.temperature == 0 and result.text == "straight house" and verdict(prompt, result.text) == "invalid"
    trace = result.trace.to_dict()
    words = next(s for s in trace["steps"] if len(s["committed"]) > 1)
    assert replay.theorem1(words)["verdict"] == "no guarantee"
    # The candidates behind it: each word's own marginal, its argmax from a different hand.
    top = dict(words["top_candidates"])
    first, second = (top[pos] for pos in sorted(top)[:2])
    vocab = trace["vocab"]
    assert vocab[str(first[0][0])].strip() == "straight" and vocab[str(second[0][0])].strip() == "house"
    # Each word's hover names those candidates, though the one step leaves nothing masked to hover.
    shown = tokens.token_grid_html(trace, 0)
    assert re.search(r"token 'straight' · step 0 · confidence 0\.\d\d · top candidates when committed: 'straight' "
                     r"0\.\d\d, 'full'", shown)
    assert first[0][1] > 0.5 > second[0][1]
    # One word at a time: a real hand.
    alone = dllm_local.generate(tiny, prompt, settings.with_(unmask="fixed", unmask_params={}))
    assert verdict(prompt, alone.text) == "valid"


def test_top_candidates_are_the_models_likeliest_tokens(tiny):
    result = dllm_local.generate(tiny, POKER, Settings(gen_length=32, block_size=32, trace="full"))
    for record in result.trace.steps:
        committed = {pos: token for pos, token, _ in record.committed}
        for pos, pairs in record.top_candidates:
            probs = [q for _, q in pairs]
            assert len(pairs) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-3
            if pos in committed:  # greedy: the committed token is the top candidate
                assert committed[pos] == pairs[0][0]
    assert all(str(t) in result.trace.vocab for s in result.trace.steps for _, pairs in s.top_candidates for t, _ in pairs)
    summary = dllm_local.generate(tiny, POKER, Settings(gen_length=32, block_size=32, trace="summary"))
    assert all(not s.top_candidates for s in summary.trace.steps)  # full level only


def test_self_verify_records_what_it_sent_back_and_the_views_draw_it(tiny):
    prompt, settings = _preset("self-verify")
    result = dllm_local.generate(tiny, prompt, settings)
    assert verdict(prompt, result.text) == "valid"
    trace = result.trace.to_dict()
    steps = [i for i, s in enumerate(trace["steps"]) if s["policy"].get("rejected_at")]
    assert steps, "greedy poker at threshold 0.1 drafts 'straight house': self-verify must send a word back"
    i = steps[0]
    record = trace["steps"][i]
    committed = {pos for pos, _, _ in record["committed"]}
    for pos, token, score in record["policy"]["rejected_at"]:
        assert pos not in committed and score < settings.unmask_params["rho"] and str(token) in trace["vocab"]
    page = tokens.token_grid_html(trace, i)
    assert page.count("dl-rejected") == len(record["policy"]["rejected_at"]) and "conflict score" in page
    sent_back = next(t for t in figures.confidence_heatmap(trace).data if t.name == "sent back (self-verify)")
    assert len(sent_back.x) == sum(len(s["policy"].get("rejected_at", [])) for s in trace["steps"])


def test_past_the_trained_length_is_a_notice_not_a_refusal(tiny, tmp_path):
    # A checkpoint that states the longest answer it was trained for (a config.json key of ours).
    folder = tmp_path / "tiny-64"
    shutil.copytree(TINY_MODEL, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "trained_gen_length": 64}))
    assert dllm_local.load(str(folder), device="cpu").trained_length == 64
    assert tiny.trained_length == 512 and length_notice(4096, None) == ""  # None: a model that does not say
    assert length_notice(64, 64) == "" and "past the longest this model was trained for (64)" in length_notice(96, 64)
    out = subprocess.run([sys.executable, "-m", "dllm_local", "generate", "--model", str(folder), "--prompt", POKER,
                          "--gen-length", "96", "--block-size", "32", "--cache", "dual", "--unmask", "threshold"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "notice: Generation length 96 is past" in out.stderr, out.stderr[-500:]
