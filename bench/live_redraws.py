"""How often the page redraws a run it follows live, measured in a real browser.

    python bench/live_redraws.py [--lengths 128 256 512] [--repeats 1]

Starts the app in-process on a free port, opens it in headless Debian chromium (Playwright) and,
for each generation length, runs the LLaDA baseline one token per step (steps = length: the
longest run a length allows) with Follow live ticked. The browser notes (its own clock) every
grid it paints of the new run and how many steps it shows; the server notes, per redraw, how
long the page took before it asked the engine's stream for more (drawing the views, Gradio's
diff and send) and how long ``draw`` took of that. Then the same generation runs on the engine
alone (``dllm_local.generate``, the engine's thread count). Prints one row per length:

    gen, steps, redraws (grids painted), redraws per second (over the run as the browser saw it),
    median / max step jump between painted grids, engine alone s, page s (click -> final state
    drawn), the browser's busy time (its long tasks) in the run, server ms per redraw (median; the
    grid alone / the plots too), of it draw ms, how many redraws drew the plots, grid KB at the end.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_local.arguments import COUNT, LENGTH  # noqa: E402
from ui_latency import open_page, start_page  # noqa: E402 - the same page, started the same way

# Installed before each click: every grid of the new run the page paints, (time, steps shown),
# on the browser's clock; a mutation observer, so the measurement adds no polling load.
WATCH_GRIDS = """(prev) => {
  const seen = window.__dlGrids = {click: null, painted: [], done: null, busy: 0};
  // The browser's own busy time: every task of 50 ms or more on its main thread.
  new PerformanceObserver((list) => { if (seen.done === null) for (const e of list.getEntries()) seen.busy += e.duration; })
    .observe({type: 'longtask'});
  document.querySelector('#run-btn').addEventListener('click', () => { seen.click = performance.now(); },
                                                      {capture: true, once: true});
  const observer = new MutationObserver(() => {
    const r = document.querySelector('#token-grid .dl-run');
    if (!r || r.dataset.run === prev) return;
    const steps = Number(r.dataset.steps), last = seen.painted[seen.painted.length - 1];
    if (steps >= 1 && (!last || last[1] !== steps)) seen.painted.push([performance.now(), steps]);
    if (r.dataset.done === '1') { seen.done = performance.now(); observer.disconnect(); }
  });
  observer.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""


class ServerClock:
    """Wraps the live run's ``throttled`` and ``draw`` (``ui.run.live``'s names for them) to note
    what each redraw costs the server: the time from handing the page a trace to its asking for
    the next one (drawing the views, Gradio's diff and send), by kind (the grid alone, or the
    plots too), and the time ``draw`` took of it."""

    def __init__(self) -> None:
        import ui.run.live as live_run

        self.redraw_s: dict[bool, list[float]] = {False: [], True: []}  # by "the plots too"
        self.draw_s: dict[bool, list[float]] = {False: [], True: []}
        self.grid_bytes = 0
        throttled, draw = live_run.throttled, live_run.draw
        plots = [False]

        def timed_throttled(events, **kwargs):
            for item in throttled(events, **kwargs):
                handed, plots[0] = time.perf_counter(), False
                yield item
                self.redraw_s[plots[0]].append(time.perf_counter() - handed)

        def timed_draw(*args, **kwargs):
            t = time.perf_counter()
            views = draw(*args, **kwargs)
            plots[0] = plots[0] or "kv" in views
            self.draw_s["kv" in views].append(time.perf_counter() - t)
            self.grid_bytes = len(views["grid"].encode())
            return views

        live_run.throttled, live_run.draw = timed_throttled, timed_draw

    def reset(self) -> None:
        for kind in (False, True):
            self.redraw_s[kind].clear()
            self.draw_s[kind].clear()

    def row(self) -> dict:
        """Median server ms per redraw and of it in ``draw``, grid alone / plots too, and how many of each."""
        return {"server": f"{_median_ms(self.redraw_s[False])} / {_median_ms(self.redraw_s[True])}",
                "draw": f"{_median_ms(self.draw_s[False])} / {_median_ms(self.draw_s[True])}",
                "with_plots": len(self.redraw_s[True])}


def _set_slider(page, elem_id: str, value: int) -> None:
    page.locator(f"#{elem_id} input[type=range]").fill(str(value))
    page.wait_for_function(f"() => document.querySelector('#{elem_id} input[type=number]').value === '{value}'")


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.0f}" if values else "-"


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=LENGTH, nargs="+", default=[128, 256, 512])
    ap.add_argument("--repeats", type=COUNT, default=1, help="page runs per length (the row shows the median run)")
    return ap


def main() -> int:
    args = build_parser().parse_args()
    import dllm_local
    from dllm_local.devices import machine_name
    from dllm_local.serving.engine import engine_threads
    from dllm_local.settings import Settings
    from playwright.sync_api import sync_playwright

    from ui.run.controls import controls_from_settings, settings_from_controls
    from ui.parts.presets import load_presets

    name = "LLaDA baseline"
    preset = load_presets()[0][name]
    clock = ServerClock()
    page_app, session, url = start_page(name)
    engine_threads()  # as the engine process has it
    handle = dllm_local.load("tiny")
    rows = []
    with sync_playwright() as p:
        browser, page = open_page(p, url)
        for length in args.lengths:
            _set_slider(page, "gen-length", length)
            _set_slider(page, "steps", length)
            runs = []
            for _ in range(args.repeats):
                clock.reset()
                previous = page.evaluate("() => document.querySelector('#token-grid .dl-run')?.dataset.run ?? ''")
                page.evaluate(WATCH_GRIDS, previous)
                page.click("#run-btn")
                page.wait_for_function("() => window.__dlGrids.done !== null", polling=500, timeout=1_800_000)
                seen = page.evaluate("() => window.__dlGrids")
                painted = seen["painted"]
                steps = painted[-1][1]
                span = (painted[-1][0] - painted[0][0]) / 1e3
                jumps = [b[1] - a[1] for a, b in zip(painted, painted[1:])] or [0]
                runs.append({"steps": steps, "redraws": len(painted), "per_s": (len(painted) - 1) / span if span else 0,
                             "jump": statistics.median(jumps), "max_jump": max(jumps),
                             "page_s": (seen["done"] - seen["click"]) / 1e3, "browser_s": seen["busy"] / 1e3,
                             "grid_kb": clock.grid_bytes / 1024, **clock.row()})
                page.wait_for_timeout(500)
            run = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
            chosen = dict(preset["settings"], gen_length=length, steps=length)
            settings = Settings.from_dict(settings_from_controls(controls_from_settings(chosen))[0])
            t = time.perf_counter()
            dllm_local.generate(handle, preset["prompt"], settings)
            rows.append({"gen": length, "engine_s": time.perf_counter() - t, **run})
        browser.close()
    page_app.close()
    session.close()
    print(f"machine: {machine_name()} ({os.cpu_count()} cores) | {name}, one token per step, Follow live ticked"
          f" | median of {args.repeats}")
    head = ("gen", "steps", "redraws", "redraws/s", "jump med", "jump max", "engine s", "page s", "browser busy s",
            "server ms/redraw grid / +plots", "draw ms grid / +plots", "with plots", "grid KB")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([str(r["gen"]), str(r["steps"]), str(r["redraws"]), f"{r['per_s']:.1f}", f"{r['jump']:g}",
                          str(r["max_jump"]), f"{r['engine_s']:.1f}", f"{r['page_s']:.1f}", f"{r['browser_s']:.1f}",
                          r["server"], r["draw"], str(r["with_plots"]), f"{r['grid_kb']:.0f}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
