"""Export for slides: the grid's SVG holds one chip per grid box with its label and colour and the
grid's verdict lines below; the zip round-trips and refuses what is not a PNG or SVG; in a real
browser, a Gradio button running SLIDES_JS returns a PNG and an SVG of the grid and of each plot."""
from __future__ import annotations

import base64
import html
import json
import re
import socket
import struct
import zipfile
import zlib
from xml.etree import ElementTree

import pytest

import dllm_local
from dllm_local.settings import Settings
from ui.run import slides_zip as zipping
from ui.lessons.acceptance import acceptance_verdict
from ui.grid.tokens import token_grid_html, token_label
from ui.lessons.verdicts import MARKS, grid_verdicts
from ui.parts.presets import load_presets
from ui.parts.replay import is_end_token, state_at
from ui.run.slides import PLOT_IDS, SLIDES_JS, grid_svg
from ui.run.slides_zip import slides_zip

PRESETS, _ = load_presets()
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def traces(tiny) -> dict[str, dict]:
    return {name: dllm_local.generate(tiny, PRESETS[name]["prompt"], Settings.from_dict(PRESETS[name]["settings"]))
            .trace.to_dict() for name in ("Revise: draft wide, verify narrow (WINO)", "Flash-dLLM as released")}


def _png(width: int = 3, height: int = 2) -> bytes:
    """A real (tiny, white) PNG file."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\xff\xff" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _url(media: str, data: bytes) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def _grid_fills(grid: str) -> dict[int, str]:
    """Each grid box's background colour, by answer position."""
    return {int(pos): re.search(r"background:([^;]+);", style).group(1)
            for pos, style in re.findall(r'<span class="dl-tok[^"]*"[^>]* data-pos="(\d+)"[^>]*style="([^"]*)"', grid)}


def test_the_grid_svg_has_one_chip_per_box_with_its_label_and_colour_and_the_verdicts_below(traces):
    for trace in traces.values():
        for step in range(-1, len(trace["steps"])):
            svg = grid_svg(trace, step)
            root = ElementTree.fromstring(svg)
            assert root.tag == f"{SVG}svg" and "foreignObject" not in svg
            assert all(text.get("font-family") for text in root.iter(f"{SVG}text"))
            ids, fills = state_at(trace, step)["ids"], _grid_fills(token_grid_html(trace, step))
            covered = []
            for chip in root.iter(f"{SVG}g"):
                labels = [t.text for t in chip.iter(f"{SVG}text") if t.get("class") == "label"]
                assert len(labels) == 1
                first, _, last = chip.get("data-pos").partition("–")
                positions = range(int(first), int(last or first) + 1)
                covered += positions
                if len(positions) > 1:  # a folded run of ends of text, as the grid folds them
                    assert all(is_end_token(trace, ids[p]) for p in positions)
                    assert labels[0].startswith(f"× {len(positions)} end of text")
                    continue
                p = positions[0]
                assert labels[0] == (token_label(trace, ids[p]) if ids[p] is not None else "▢")
                assert chip.find(f"{SVG}rect").get("fill") == fills[p]
            assert covered == list(range(trace["gen_length"]))
            width = float(root.get("width"))
            assert all(float(r.get("x")) + float(r.get("width")) <= width for r in root.iter(f"{SVG}rect") if r.get("x"))
            told = {}
            for line in root.iter(f"{SVG}text"):
                if line.get("class") == "verdict":
                    told.setdefault(line.get("data-status"), []).append(line.text)
            expected = [v for v in [*grid_verdicts(trace, step), acceptance_verdict(trace, step)] if v] if step >= 0 \
                else []
            for verdict in expected:
                text = f"{MARKS[verdict.status]} {verdict.claim}: {verdict.status} — {verdict.detail}"
                assert any(text in " ".join(lines) for lines in [told.get(verdict.status, [])])
            assert sum(len(lines) for lines in told.values()) >= len(expected)


def test_the_grid_svg_colours_by_confidence_as_the_grid_does(traces):
    trace = traces["Revise: draft wide, verify narrow (WINO)"]
    root = ElementTree.fromstring(grid_svg(trace, 3, color_by="confidence"))
    fills = _grid_fills(token_grid_html(trace, 3, color_by="confidence"))
    chips = {int(g.get("data-pos")): g.find(f"{SVG}rect").get("fill") for g in root.iter(f"{SVG}g")
             if "–" not in g.get("data-pos")}
    assert chips and all(fill == fills[p] for p, fill in chips.items())
    with pytest.raises(ValueError):
        grid_svg(trace, 0, color_by="rainbow")


def test_the_zip_round_trips_and_refuses_anything_but_png_and_svg(traces, tmp_path, monkeypatch):
    grid = grid_svg(traces["Flash-dLLM as released"], 1)
    plot_svg = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'
    images = {"grid.png": _url("image/png", _png()), "kv-plot.svg": _url("image/svg+xml", plot_svg.encode()),
              "cache-plot.svg": "data:image/svg+xml," + re.sub(r"[<>\" ]", lambda m: f"%{ord(m[0]):02X}", plot_svg),
              "grid.svg": _url("image/svg+xml", b"<svg xmlns='http://www.w3.org/2000/svg'/>")}
    path = slides_zip(json.dumps(images), grid, tmp_path / "out")
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == ["cache-plot.svg", "grid.png", "grid.svg", "kv-plot.svg"]
        assert archive.read("grid.svg").decode() == grid  # the server's own grid, not the page's copy
        assert archive.read("grid.png") == _png()
        assert archive.read("kv-plot.svg").decode() == archive.read("cache-plot.svg").decode() == plot_svg
    bad = {"not json": "{", "a list": "[]", "a path": {"../x.png": images["grid.png"]},
           "another kind": {"x.exe": images["grid.png"]}, "html": {"x.png": _url("text/html", b"<b>")},
           "an SVG named .png": {"x.png": images["kv-plot.svg"]}, "not a PNG": {"x.png": _url("image/png", b"GIF89a")},
           "bad base64": {"x.png": "data:image/png;base64,@@@"}, "not a string": {"x.png": 3},
           "entities": {"x.svg": _url("image/svg+xml", b'<!DOCTYPE svg [<!ENTITY a "aa">]><svg>&a;</svg>')},
           "not SVG": {"x.svg": _url("image/svg+xml", b"<html/>")},
           "not XML": {"x.svg": _url("image/svg+xml", b"<svg")}}
    empty = tmp_path / "refused"
    for why, value in bad.items():
        with pytest.raises(ValueError):
            slides_zip(value if isinstance(value, str) else json.dumps(value), grid, empty)
        assert not empty.exists(), why
    with pytest.raises(ValueError):
        slides_zip("{}", "<p>not an svg</p>", empty)
    monkeypatch.setattr(zipping, "MAX_SLIDES_BYTES", len(grid) + 100)
    with pytest.raises(ValueError, match="MiB"):
        slides_zip(json.dumps({"big.png": _url("image/png", _png(200, 200) + b"\0" * 200)}), grid, empty)
    assert not empty.exists()


# ---------------------------------------------------------------- in a real browser

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_click_returns_a_png_and_an_svg_of_the_grid_and_of_each_plot(traces, tmp_path):
    import gradio as gr
    from playwright.sync_api import sync_playwright

    from ui import figures as run_figures

    trace = traces["Flash-dLLM as released"]
    figures = {"conf-plot": run_figures.confidence_heatmap(trace), "kv-plot": run_figures.kv_heatmap(trace),
               "cache-plot": run_figures.cache_panel(trace)}
    grid = grid_svg(trace, len(trace["steps"]) - 1)
    with gr.Blocks() as page:
        for elem_id in PLOT_IDS:
            gr.Plot(figures[elem_id], elem_id=elem_id)
        svg_box = gr.Textbox(grid, elem_id="svg-box", visible=False)
        out_box = gr.Textbox(elem_id="out-box", lines=2, max_lines=2, interactive=True)
        button = gr.Button("Export for slides", elem_id="slides-btn")
        button.click(None, [svg_box], [out_box], js=SLIDES_JS)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            pg = browser.new_page(viewport={"width": 1280, "height": 2400})
            pg.goto(url)
            pg.wait_for_function("document.querySelectorAll('.js-plotly-plot svg.main-svg').length >= 3", timeout=60_000)
            exports = {}
            # Through plotly.js where the page has it, else through the drawn layers; the second pass hides it.
            for way in ("page", "layers"):
                if way == "layers":
                    pg.evaluate("window.Plotly = undefined")
                pg.fill("#out-box textarea", "")
                pg.click("#slides-btn")
                pg.wait_for_function("document.querySelector('#out-box textarea').value.length > 0", timeout=60_000)
                exports[way] = json.loads(pg.input_value("#out-box textarea"))
            browser.close()
    finally:
        page.close()
    for way, images in exports.items():
        assert sorted(images) == sorted(f"{name}.{kind}" for name in ("grid", *PLOT_IDS) for kind in ("png", "svg")), way
        for name in ("grid", *PLOT_IDS):
            text = base64.b64decode(images[f"{name}.svg"].split(",", 1)[1]).decode()
            svg = ElementTree.fromstring(text)
            assert svg.tag == f"{SVG}svg", (way, name)
            # it stands alone: each clip path and gradient it points at is its own, not the page's
            ids = {element.get("id") for element in svg.iter()}
            assert all(ref in ids for ref in re.findall(r"url\((?:['\"]|&quot;)?#([^'\")&]+)", text)), (way, name)
            assert not re.search(r"url\((['\"]|&quot;)?[a-z]+:", text), (way, name)
            width, height = _png_size(base64.b64decode(images[f"{name}.png"].split(",", 1)[1]))
            assert (width, height) == (round(2 * float(svg.get("width"))), round(2 * float(svg.get("height")))), name
            if name != "grid":  # the plot's own texts: its title is in the SVG
                words = " ".join(t.text or "" for t in svg.iter(f"{SVG}text")) + " ".join(
                    t.text or "" for t in svg.iter(f"{SVG}tspan"))
                assert html.unescape(figures[name].layout.title.text.split("<")[0])[:20] in words, (way, name)
        assert images["grid.svg"] == "data:image/svg+xml;base64," + base64.b64encode(grid.encode()).decode()
        with zipfile.ZipFile(slides_zip(json.dumps(images), grid, tmp_path / way)) as archive:
            assert len(archive.namelist()) == 8
