"""The page process never loads torch: what it imports and runs, in fresh interpreters (the CLI's
parser has its own check in test_cli.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_page_side_runs_without_torch():
    """Presets, controls, the fold of a streamed run, every view and the cost model, in a fresh
    interpreter."""
    code = textwrap.dedent("""
        import json, sys
        import ui.run.controls, ui.engine.queue, ui.page, ui.parts.replay, ui.run.tab
        from ui.parts.presets import load_presets
        from dllm_local.settings import Settings
        from dllm_local.trace import fold

        presets, problems = load_presets()
        assert presets and not problems, problems
        for preset in presets.values():
            Settings.from_dict(preset["settings"])
            settings, _ = ui.run.controls.settings_from_controls(ui.run.controls.controls_from_settings(preset["settings"]))
            Settings.from_dict(settings)

        saved = json.load(open("tests/data/trace_small.json"))
        header = {**saved, "steps": [], "final_ids": [], "stats": {}, "text": "", "vocab": {}}
        events = [{"start": header}, *({"step": s, "vocab": {}} for s in saved["steps"]),
                  {"end": {k: v for k, v in saved.items() if k != "steps"}}]
        drawn = 0
        for trace, done in ui.engine.queue.throttled(fold(events), every=0.0, page_share=1.0):
            ui.run.tab.draw(trace, None, "step", 0, "v", "drift")
            drawn += 1
        assert drawn == len(events) and done
        assert json.dumps(trace, sort_keys=True) == json.dumps(saved, sort_keys=True)
        assert ui.parts.replay.numbers(trace)["finished"]

        from dllm_local.devices import DEVICES
        from dllm_local.analysis import costmodel
        t = costmodel.TEACHING_EXAMPLE
        costmodel.concurrency_curve(t.model, DEVICES[t.device], t.g, t.tau, [1, 64])
        costmodel.concurrency_crossovers(t.model, DEVICES[t.device], t.g, t.tau)
        assert "torch" not in sys.modules, "torch was imported"
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_the_views_import_nothing_of_the_engine():
    """Trace in, view out: the replay draws nothing, and the views read only the trace's module
    of the engine package."""
    code = ("import sys; sys.path.insert(0, '.'); import ui.parts.replay; assert 'plotly' not in sys.modules; "
            "import ui.grid.tokens, ui.parts.tables, ui.figures, ui.tune.figures; "
            "engine = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') or m.startswith("
            "('dllm_local.models', 'dllm_local.policies', 'dllm_local.decoding.sampler', 'dllm_local.serving'))]; "
            "assert not engine, engine")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
