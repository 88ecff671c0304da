"""Page latency, measured in a real browser against the engine alone.

    python bench/ui_latency.py [--repeats 3]

Starts the app in-process on a free port, opens it in headless Debian chromium (Playwright),
clicks Run on the default preset and measures (a) click -> first painted step (a committed token
in the grid) and (b) click -> final state drawn; then times the same generation with the engine
alone (no page). Prints medians and the ratio streamed / engine-only.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import app
    import dllm_local
    from dllm_local.costmodel import machine_name
    from dllm_local.settings import Settings
    from playwright.sync_api import sync_playwright

    from ui.controls import controls_from_settings, settings_from_controls
    from ui.page import CSS

    t0 = time.perf_counter()
    page_app, session = app.create(app.parse_args([]))
    page_app.queue(default_concurrency_limit=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = page_app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    ready = time.perf_counter() - t0
    preset = next(p for p in __import__("dllm_local.session", fromlist=["load_presets"]).load_presets()[0].values())
    prompt = preset["prompt"]
    first, total = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(url)
        page.wait_for_selector("#run-btn")
        for _ in range(args.repeats):
            grid_before = page.inner_html("#token-grid")
            status_before = page.inner_text("#status")
            t = time.perf_counter()
            page.click("#run-btn")
            page.wait_for_function("(prev) => { const g = document.querySelector('#token-grid');"
                                   " return g.innerHTML !== prev && g.querySelector('.dl-tok:not(.dl-masked)'); }",
                                   arg=grid_before, timeout=60_000)
            first.append(time.perf_counter() - t)
            page.wait_for_function("(prev) => { const s = document.querySelector('#status').innerText;"
                                   " return s !== prev && s.includes('Done'); }", arg=status_before, timeout=120_000)
            total.append(time.perf_counter() - t)
            page.wait_for_timeout(300)
        browser.close()
    page_app.close()
    # The page runs a preset through its controls (full trace); time the engine on exactly that.
    settings = Settings.from_dict(settings_from_controls(controls_from_settings(preset["settings"]))[0])
    engine = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        dllm_local.generate(session.handle, prompt, settings)
        engine.append(time.perf_counter() - t)
    f, tt, e = statistics.median(first), statistics.median(total), statistics.median(engine)
    print(f"machine: {machine_name()} | preset: {preset['name']} | median of {args.repeats}")
    print(f"app ready (model loaded, server up): {ready:.2f} s")
    print(f"click -> first painted step:         {f * 1e3:.0f} ms")
    print(f"click -> final state drawn:          {tt:.3f} s")
    print(f"engine alone, same settings:         {e:.3f} s")
    print(f"streamed / engine-only:              {tt / e:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
