"""Page latency, measured in a real browser against the engine alone.

    python bench/ui_latency.py [--repeats 3] [--preset "LLaDA baseline"]

Starts the app in-process on a free port, opens it in headless Debian chromium (Playwright),
clicks Run on a preset (default: the page's default) and measures, with the browser's own clock,
(a) click -> first painted step (the grid drawn after the first forward) and (b) click -> final
state drawn (the grid and every plot). Between page runs it times the same generation with
the engine alone (no page, no engine process: ``dllm_local.generate`` here, with the engine's
thread count), so machine noise hits both sides alike. Prints medians and the ratio streamed /
engine-only, with every run's pair.
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
from dllm_local.arguments import COUNT  # noqa: E402


# Installed before each click: the page itself notes (browser clock) the click, the first painted
# step of the new run and the moment its final state is drawn, i.e. the grid says the run ended
# and every plot shows all its steps (each plot's first trace has one row, or bar, per step).
# A mutation observer checks after each DOM change, so the measurement adds no polling load.
WATCH_RUN = """(prev) => {
  const times = window.__dlTimes = {click: null, first: null, final: null};
  const grid = () => {
    const r = document.querySelector('#token-grid .dl-run');
    return r && r.dataset.run !== prev ? r : null;
  };
  const plotted = (steps) => ['conf-plot', 'kv-plot', 'cache-plot'].every(id => {
    const t = document.querySelector(`#${id} .js-plotly-plot`)?._fullData?.[0];
    return t && (t.type === 'heatmap' ? t.y : t.x)?.length === steps;
  });
  document.querySelector('#run-btn').addEventListener('click', () => { times.click = performance.now(); },
                                                      {capture: true, once: true});
  const observer = new MutationObserver(() => {
    const r = grid();
    if (!r) return;
    if (times.first === null && Number(r.dataset.steps) >= 1) times.first = performance.now();
    if (r.dataset.done === '1' && plotted(Number(r.dataset.steps))) {
      times.final = performance.now();
      observer.disconnect();
    }
  });
  observer.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""


def start_page(preset: str, *flags: str):
    """The app in-process on a free port, opened on ``preset`` (with the app's ``flags``): (page, session, url)."""
    import app
    from ui.page import LAUNCH_OPTIONS

    page_app, session = app.create(app.parse_args([*flags, "--preset", preset]))
    page_app.queue(default_concurrency_limit=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = page_app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                                **LAUNCH_OPTIONS)
    return page_app, session, url


def open_page(playwright, url: str, viewport: dict | None = None):
    """Debian's chromium, headless, on ``url`` once its Run button is there: (browser, page)."""
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = browser.new_page(viewport=viewport or {"width": 1400, "height": 1800})
    page.goto(url)
    page.wait_for_selector("#run-btn")
    return browser, page


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=COUNT, default=3)
    ap.add_argument("--preset", default=None, help="preset name (default: the page's default preset)")
    return ap


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    import dllm_local
    from dllm_local.devices import machine_name
    from dllm_local.serving.engine import engine_threads
    from dllm_local.settings import Settings
    from playwright.sync_api import sync_playwright

    from ui.run.controls import controls_from_settings, settings_from_controls
    from ui.parts.presets import load_presets

    presets = load_presets()[0]
    name = args.preset or next(iter(presets))
    if name not in presets:
        ap.error(f"no preset {name!r}; choose one of: {', '.join(presets)}")
    preset = presets[name]
    t0 = time.perf_counter()
    page_app, session, url = start_page(name)
    ready = time.perf_counter() - t0
    prompt = preset["prompt"]
    # The page runs a preset through its controls (full trace); time the engine on exactly that.
    settings = Settings.from_dict(settings_from_controls(controls_from_settings(preset["settings"]))[0])
    engine_threads()  # as the engine process has it
    handle = dllm_local.load("tiny")
    dllm_local.generate(handle, prompt, settings)  # warm-up
    first, total, inside, engine = [], [], [], []
    with sync_playwright() as p:
        browser, page = open_page(p, url)
        for _ in range(args.repeats):
            # The live grid carries its run number, the steps drawn and whether the run ended.
            previous = page.evaluate("() => document.querySelector('#token-grid .dl-run')?.dataset.run ?? ''")
            page.evaluate(WATCH_RUN, previous)
            page.click("#run-btn")
            page.wait_for_function("() => window.__dlTimes.final !== null", polling=250, timeout=120_000)
            times = page.evaluate("() => window.__dlTimes")
            first.append((times["first"] - times["click"]) / 1e3)
            total.append((times["final"] - times["click"]) / 1e3)
            # The run's own numbers as the page shows them (engine wall and model time, measured
            # in the engine process while the page drew).
            inside.append(page.inner_text("#numbers").replace("\n", " "))
            page.wait_for_timeout(300)
            t = time.perf_counter()
            dllm_local.generate(handle, prompt, settings)
            engine.append(time.perf_counter() - t)
        browser.close()
    page_app.close()
    session.close()
    f, tt, e = statistics.median(first), statistics.median(total), statistics.median(engine)
    print(f"machine: {machine_name()} | preset: {preset['name']} | median of {args.repeats}")
    print(f"app ready (model loaded, server up): {ready:.2f} s")
    print(f"click -> first painted step:         {f * 1e3:.0f} ms")
    print(f"click -> final state drawn:          {tt:.3f} s")
    print(f"engine alone, same settings:         {e:.3f} s")
    print(f"streamed / engine-only:              {tt / e:.2f}x (per run: "
          f"{', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(total, engine))} s)")
    print(f"the last run's numbers in the page:  {inside[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
