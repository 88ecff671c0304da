"""Play's delivered rate against the speed chosen, measured in a real browser.

    python bench/play_rate.py [--steps 12] [--preset "DualCache, blocks of several steps"]

Starts the app in-process in presenter view on a free port, opens it in headless Debian chromium
(Playwright) at a projector's 1280×720 and runs the preset. Then Play runs a few steps at the
speed the page starts on, so that the page measures how fast it draws a step, and for each speed
the Speed menu then offers, Play runs ``--steps`` steps from the first: the browser notes (its own
clock) every grid it paints; the delivered rate is the steps painted over the time between the
first and the last. Prints the page's measured rate (steps/s it draws) and, per speed, the rate
delivered and its ratio to the one chosen; speeds the menu does not offer are listed as such.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # loaded by a test too
from dllm_local.arguments import COUNT  # noqa: E402
from ui_latency import open_page, start_page  # noqa: E402 - the same browser and app, opened the same way

# Every grid painted, (browser time, step shown), from a mutation observer: no polling load.
WATCH_STEPS = """() => {
  const seen = window.__dlSteps = [];
  new MutationObserver(() => {
    const m = document.querySelector('#token-grid').innerText.match(/after step (\\d+) /);
    const step = m ? Number(m[1]) : null;
    if (step !== null && (!seen.length || seen[seen.length - 1][1] !== step)) seen.push([performance.now(), step]);
  }).observe(document.querySelector('#token-grid'), {subtree: true, childList: true, characterData: true});
}"""
STEP = "() => Number(document.querySelector('#scrubber input[type=number]').value)"
PLAYING = "() => window.dlPlay.playing"


def offered(page) -> list[str]:
    """The Speed menu's choices, read from the open menu (a chosen one's tick mark left out); the
    browser tests read it so too."""
    page.click("#speed input")
    names = [o.inner_text().strip().splitlines()[-1].strip() for o in page.locator("[role=option]").all()]
    page.keyboard.press("Escape")
    page.click("#grid-verdicts")  # focus out of the menu: space is Play's again
    return names


def play(page, steps: int) -> list[list[float]]:
    """From the first step, Play until ``steps`` steps have been painted (or the run's last): their times."""
    page.keyboard.press("Home")
    page.wait_for_function(f"() => ({STEP})() === 0 && document.querySelector('#token-grid').innerText"
                           ".includes('after step 0 ')")
    page.evaluate("() => { window.__dlSteps.length = 0; }")
    page.keyboard.press(" ")
    page.wait_for_function(f"(n) => window.__dlSteps.length >= n || !({PLAYING})()", arg=steps, timeout=120_000)
    if page.evaluate(PLAYING):
        page.keyboard.press(" ")
    page.wait_for_function(f"() => !({PLAYING})() && !window.dlPlay.pending")
    return page.evaluate("() => window.__dlSteps.slice()")


def build_parser() -> argparse.ArgumentParser:
    """Its flags, each number through a checked type (dllm_local.arguments): a bad one is told before anything runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=COUNT, default=12, help="steps painted per speed (the run's last ends it sooner)")
    ap.add_argument("--preset", default="DualCache, blocks of several steps")
    return ap


def main() -> int:
    args = build_parser().parse_args()
    from playwright.sync_api import sync_playwright

    from dllm_local.devices import machine_name
    from ui.run.play import SPEEDS

    page_app, session, url = start_page(args.preset, "--present")
    try:
        with sync_playwright() as p:
            browser, page = open_page(p, url, {"width": 1280, "height": 720})
            page.click("#run-btn")
            page.wait_for_function("() => document.querySelector('#token-grid .dl-run[data-done=\"1\"]')",
                                   timeout=240_000)
            page.click("#grid-verdicts")  # focus out of the prompt: space plays
            page.evaluate(WATCH_STEPS)
            play(page, 6)  # the page measures its step time
            rate, menu = page.evaluate("() => window.dlPlay.rate()"), offered(page)
            print(f"{machine_name()}, {os.cpu_count()} CPUs, {args.preset}: the page draws {rate:.2f} steps/s; "
                  f"the Speed menu offers {', '.join(menu)}")
            print(f"{'speed':>12} {'delivered steps/s':>18} {'ratio':>6} {'steps':>6}")
            for name, speed in SPEEDS.items():
                if name not in menu:
                    print(f"{name:>12} {'not offered':>18}")
                    continue
                page.click("#speed input")
                page.get_by_role("option", name=name, exact=True).click()
                page.click("#grid-verdicts")
                times = play(page, args.steps)
                delivered = (len(times) - 1) / (times[-1][0] - times[0][0]) * 1000
                print(f"{name:>12} {delivered:>18.2f} {delivered / speed:>6.2f} {len(times):>6}")
            browser.close()
    finally:
        page_app.close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
