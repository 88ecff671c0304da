"""Downloading a hub model from the page (only when it was started with ``--allow-downloads``):
Load on a model that is not on this machine offers a button naming the download's size; nothing
is fetched before it is pressed. The download then shows its progress in the status line and
Cancel ends it; once it is complete, the model loads as any other."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from dllm_local import hub
from dllm_local.errors import ModelLoadError

from ..engine.queue import ENGINE, client_of, error_text
from ..lab.classroom import Lab
from ..parts.inputs import Choice, checked
from .access import DownloadNeeded, ModelAccess

POLL_S = 0.5  # how often the status line's progress is redrawn
DOWNLOAD = {"concurrency_limit": 1, "concurrency_id": "download", "queue": True}  # one at a time, beside the engine


def size_text(n: float) -> str:
    """Bytes as the hub states them (decimal units)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def progress_text(repo_id: str, done: int, total: int, seconds: float) -> str:
    rate = done / seconds if seconds > 0 else 0.0
    left = f" · about {(total - done) / rate / 60:.0f} min left" if rate > 0 and done < total else ""
    share = f" ({100 * done / total:.0f}%)" if total else ""
    return (f"Downloading {repo_id}: {size_text(done)} of {size_text(total)}{share} · "
            f"{size_text(rate)}/s{left}")


class DownloadBox:
    """The confirm-and-download box under the model box: hidden until a Load needs a download."""

    def __init__(self, models: ModelAccess, status: gr.Markdown, lab: Lab) -> None:
        self.models, self.status, self.lab = models, status, lab  # status: the tab's line, where progress shows
        self.going: dict[str, hub.Download] = {}  # by client: the download each tab started
        with gr.Group(visible=False, elem_id="download-box") as self.box:
            self.note = gr.Markdown(elem_id="download-note")
            with gr.Row():
                self.button = gr.Button("Download", variant="primary", elem_id="download-btn")
                self.cancel_btn = gr.Button("Cancel download", elem_id="cancel-download-btn")

    def offer(self, need: DownloadNeeded) -> dict:
        """What Load shows for a model that is not on this machine: its size, asked of the hub,
        on the button that starts the download."""
        status = self.status
        try:
            size = hub.download_size(need.repo_id)
        except ModelLoadError as exc:
            return {status: f"⚠ {exc}", self.box: gr.update(visible=False)}
        return {status: f"{need.repo_id} is not on this machine: press Download ({size_text(size)}) to fetch it, "
                        "then it loads.",
                self.note: f"**{need.repo_id}**: {size_text(size)} to fetch from the Hugging Face hub into the cache "
                           f"folder {hub.cache_dir()}. Nothing is fetched until you press Download.",
                self.button: gr.update(value=f"Download {size_text(size)}", interactive=True),
                self.box: gr.update(visible=True)}

    def wire(self, model_pick: gr.Dropdown, then: Callable, then_inputs: list, then_outputs: list,
             **then_options: Any) -> None:
        """Download (then ``then``, which loads the model once it is on disk, with ``then_options``
        such as Gradio's ``inputs_kwargs``) and Cancel."""
        event = self.button.click(self.download, [model_pick], [self.status, self.note, self.button, self.box],
                                  api_name="download_model", **DOWNLOAD)
        event.then(then, then_inputs, then_outputs, api_visibility="private", **ENGINE, **then_options)
        self.cancel_btn.click(self.cancel, None, [self.note], queue=False, api_name="cancel_download")

    @checked
    def download(self, request: gr.Request, name: Choice) -> Iterator[dict]:
        client, status = client_of(request), self.status
        try:  # checked here, where it runs: the button is the lecturer's, but its API is anyone's
            self.lab.require_lecturer(self.lab.who(request), "Downloading a model", "it fills this machine's disk")
            self.models.check(name)
            yield {status: f"{name} is on this machine already.", self.box: gr.update(visible=False)}
            return
        except DownloadNeeded as need:
            repo_id = need.repo_id
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the page stays up
            yield {status: f"⚠ {error_text(exc)}"}
            return
        if client in self.going:
            yield {status: "This tab's download is still going."}
            return
        try:
            total = hub.download_size(repo_id)  # what is still missing: a resumed download fetches less
        except ModelLoadError as exc:
            yield {status: f"⚠ {exc}"}
            return
        download = self.going[client] = hub.Download(repo_id)
        start = time.monotonic()
        try:
            while download.running():
                done = min(max(download.bytes_on_disk() - download.at_start, 0), total)
                shown = progress_text(repo_id, done, total, time.monotonic() - start)
                yield {status: shown, self.note: shown, self.button: gr.update(interactive=False)}
                time.sleep(POLL_S)
            done = min(max(download.bytes_on_disk() - download.at_start, 0), total)
            if download.cancelled:
                ended = (f"Download of {repo_id} cancelled after {size_text(done)} of {size_text(total)}: what it "
                         "fetched stays in the Hugging Face cache, and Download resumes from there.")
                yield {status: ended, self.note: ended,
                       self.button: gr.update(value="Download (resume)", interactive=True)}
            elif download.error():
                yield {status: f"⚠ The download of {repo_id} failed: {download.error()}",
                       self.button: gr.update(interactive=True)}
            else:
                yield {status: f"Downloaded {repo_id} ({size_text(total)} in {time.monotonic() - start:.0f} s); "
                               "loading it…", self.box: gr.update(visible=False)}
        finally:
            download.cancel()  # the tab left mid-download: the child does not outlive its request
            self.going.pop(client, None)

    def cancel(self, request: gr.Request) -> str:
        download = self.going.get(client_of(request))
        if download is None:
            return "No download of this tab is going."
        download.cancel()
        return "Download cancelled."
