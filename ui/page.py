"""The playground page: Gradio Blocks over a ``dllm_local.serving.session.Session``. No torch here.

``build`` lays out the header and the three tabs, each a module of its own with its layout and
its callbacks (``run.tab``, ``compare.tab``, ``tune.tab``), then wires them. The tabs share the
session through one ``EngineQueue``: every request that uses the model waits in one queue.
"""
from __future__ import annotations

import gradio as gr
from starlette.middleware import Middleware

from dllm_local.trace import MAX_TRACE_BYTES

from .compare.tab import CompareTab
from .engine.queue import EngineQueue
from .parts.exports import ExportFolder
from .parts.presets import fits, presets_for
from .lab.classroom import Lab, LabTab, batching_line
from .lab.guard import SignedInRoutes
from .login import SignIn
from .model.access import ModelAccess
from .model.box import model_line
from .run.play import PLAY_JS
from .run.presenter import CSS as PRESENTER_CSS, KEYS_JS
from .run.tab import RunTab
from .tune.tab import TuneTab

# Gradio's own cache of files handed to browsers: swept every hour of anything older than an hour.
DELETE_CACHE = (3600, 3600)
CSS = """
.tok-grid {line-height: 2.1em}
#status {min-height: 1.5em}
.caption, .caption p {color: #444; font-size: 15px !important; margin-top: 0}
.policy-info, .policy-info p {color: #444; font-size: 15px !important; padding: 4px 12px}
#status, #status p {font-size: 16px !important}
#tune-concurrency-line, #tune-concurrency-line p {font-size: 18px !important}
.dl-knobs .block:has(:disabled):not(:has(.block)) {opacity: 0.5}
.dl-verdict {font-size: 16px; margin: 2px 0; padding: 3px 8px; border-left: 5px solid #999}
.dl-verdict[data-status="holds"] {border-color: #1a7f37; background: #eef8f0}
.dl-verdict[data-status="does not hold"] {border-color: #c62828; background: #fdeeee}
/* A slider's end labels: Gradio's subdued grey reads at 1.9:1 on the light theme; #666 at 5.7:1 (WCAG 1.4.3). */
body:not(.dark) .min_value, body:not(.dark) .max_value {color: #666 !important}
/* A menu's text stops short of its arrow (a long choice ends in "…", never under the arrow). */
input[role="combobox"] {text-overflow: ellipsis; padding-right: 4px}
"""

# Gradio's queue line ("queue: 2/3 | 1.2/4.0s") read as words: every run ahead (the one going and
# those waiting before yours) counts. Then the presenter's keys and token clicks.
JS = """
() => {
  const words = (node) => {
    const m = node.nodeValue && node.nodeValue.match(/queue: (\\d+)\\/\\d+ \\|/);
    if (!m) return;
    const ahead = Number(m[1]);
    node.nodeValue = node.nodeValue.replace(m[0], `waiting: ${ahead} run${ahead === 1 ? "" : "s"} ahead of yours |`);
  };
  const walk = (root) => {
    if (root.nodeType === Node.TEXT_NODE) return words(root);
    const it = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = it.nextNode(); n; n = it.nextNode()) words(n);
  };
  new MutationObserver((changes) => {
    for (const c of changes) {
      if (c.type === "characterData") words(c.target);
      else c.addedNodes.forEach(walk);
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
""" + KEYS_JS + PLAY_JS + "}\n"
# The largest file the page takes is a trace to import: Gradio refuses a larger upload before it
# lands in its temporary folder.
# No run history: Gradio would copy every streamed update (the grid, megabytes of plot data) into
# the browser's storage, which kept the browser busy most of a long live run.
LAUNCH_OPTIONS = {"css": CSS + PRESENTER_CSS, "js": JS, "footer_links": [], "max_file_size": MAX_TRACE_BYTES,
                  "show_error": True, "run_history": False}


def launch_options(sign_in: SignIn | None = None) -> dict:
    """``launch``'s options for this page; with sign-in, also its guarded check (``ui.login``) and
    the guard that closes Gradio's unchecked routes and ties each tab to its user (``lab.guard``)."""
    if sign_in is None:
        return LAUNCH_OPTIONS
    options = sign_in.launch_options()
    options["app_kwargs"]["middleware"].append(Middleware(SignedInRoutes))
    return {**LAUNCH_OPTIONS, **options, "auth_message": "Sign in with the name and password your lecturer gave you."}


def build(session, presets: dict, preset_problems: list[str], default_preset: str | None = None,
          models: ModelAccess | None = None, exports: ExportFolder | None = None, present: bool = False,
          lab: Lab | None = None) -> gr.Blocks:
    """The page over ``session``: the policy controls come from the engine's policy specs.
    ``models``: which models the page may load (default: the listed ones only); ``exports``: where
    export files go (default: a new folder, deleted at exit); ``present``: open in presenter view. The page keeps ``exports`` and, for
    an API client, ``control_names``: the order in which an imported trace's controls come back.
    ``lab``: the limits and roles of a class sharing the page (default: none, no sign-in)."""
    # The Run tab offers the presets for the loaded model; Compare and Tune, which set masked
    # models' policies side by side, the masked models' presets (a block model fits them).
    offered = presets_for(presets, session.info())
    default_preset = default_preset if default_preset in offered else next(iter(offered), None)
    masked = {name: p for name, p in presets.items() if fits(p, {"kind": "masked"})}
    tune_preset = default_preset if default_preset in masked else next(iter(masked), None)
    specs = session.policy_specs()
    exports = exports or ExportFolder()
    with gr.Blocks(title="dllm-local", delete_cache=DELETE_CACHE) as page:
        engine = EngineQueue(session, page, lab)
        gr.Markdown("# dllm-local\nAccelerated diffusion-LLM decoding, live, step by step. "
                    "Timings are model time measured with device synchronisation; page work is counted apart.",
                    elem_id="page-head")
        line = gr.Markdown(model_line(session.info()), elem_id="model-line")
        gr.Markdown(batching_line(session.batch_mode), elem_id="batch-mode")
        if preset_problems:
            gr.Markdown("\n".join(f"- ⚠ {p}" for p in preset_problems), elem_id="preset-problems")
        with gr.Tabs() as tabs:
            with gr.Tab("Run", id="run"):
                run = RunTab(engine, presets, default_preset, specs, models or ModelAccess(), exports, line, present)
            with gr.Tab("Compare", id="compare"):
                compare = CompareTab(engine, masked, run)
            with gr.Tab("Tune", id="tune"):
                tune = TuneTab(engine, masked, tune_preset, run, tabs)
            # The lecturer's (anyone's on a page without sign-in). Signed in, it stays hidden until the
            # page's load shows it to a lecturer: this Gradio shows a hidden tab on an update but never
            # hides a shown one.
            with gr.Tab("Lab", id="lab", visible=not engine.lab.signed_in) as lab_tab:
                lab_view = LabTab(engine)
        for tab in (run, compare, tune):
            tab.wire()
        lab_view.wire(lab_tab)
        page.load(run.show_model, [run.preset], [line, *run.kind_boxes()], queue=False, api_visibility="private")
        if engine.lab.signed_in:
            page.load(lab_view.tab_shown, None, [lab_tab], queue=False, api_visibility="private")
    page.exports, page.control_names = exports, list(run.controls)
    return page
