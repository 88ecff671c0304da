"""Downloads from the page: nothing is fetched before the user confirms a button naming the size;
progress shows in the status line; Cancel ends the download and keeps what it fetched; the next
download resumes and the model loads. The hub is ``fake_hub.FakeHub`` on 127.0.0.1 serving a
checkpoint the test builds (the real one is out of reach in tests); the client is the real
``huggingface_hub``, the page a real Gradio server in a real browser."""
from __future__ import annotations

import os
import time
from fnmatch import fnmatch

import huggingface_hub.constants
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from checkpoints import build_llada
from fake_hub import FakeHub

from dllm_local import hub as dl_hub
from dllm_local.errors import ModelLoadError
from ui.model.downloads import size_text

REPO = "org/tiny-llada"


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
    """The fake hub, and the environment every process of the test reads it through."""
    # One 20 MB weight file: the client writes 10 MB at a time, so progress shows mid-file.
    folder = build_llada(tmp_path_factory.mktemp("hub-repo") / "tiny-llada", shard_size="64MB", d_model=192,
                         mlp_hidden_size=288)
    (folder / "weights.bin").write_bytes(b"\0" * 300_000)  # another weight format: never fetched
    served = FakeHub({REPO: folder})
    # The tests' HF_HUB_OFFLINE=1 (conftest) is lifted here only: every hub request goes to 127.0.0.1.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", served.url)
        patch.setenv("HF_HUB_OFFLINE", "0")
        patch.setenv("HF_HUB_DISABLE_XET", "1")  # the fake hub speaks plain HTTP
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read once, at import
        yield served
    served.close()


@pytest.fixture
def cache(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    fake_hub.bytes_per_second, fake_hub.served = None, 0
    return tmp_path / "hub-cache"


def _wanted_bytes(fake_hub) -> int:
    return sum(f.stat().st_size for name, f in fake_hub.files(REPO).items()
               if any(fnmatch(name, pattern) for pattern in dl_hub.DOWNLOADED))


def _wait(download: dl_hub.Download, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while download.running():
        assert time.monotonic() < end, "the download did not end"
        time.sleep(0.05)


def test_a_download_is_sized_fetched_whole_and_then_on_disk(fake_hub, cache):
    total = _wanted_bytes(fake_hub)
    assert not dl_hub.on_disk(REPO)
    assert dl_hub.download_size(REPO) == total and fake_hub.served == 0  # sizing fetches no file
    download = dl_hub.Download(REPO)
    _wait(download)
    assert download.error() == "" and dl_hub.on_disk(REPO)
    assert download.bytes_on_disk() - download.at_start == total == fake_hub.served  # not the .bin
    assert dl_hub.download_size(REPO) == 0


def test_a_cancelled_download_keeps_what_it_fetched_and_the_next_one_resumes(fake_hub, cache):
    total = _wanted_bytes(fake_hub)
    fake_hub.bytes_per_second = 3e6  # about 7 s for the weights
    download = dl_hub.Download(REPO)
    end = time.monotonic() + 60
    while download.bytes_on_disk() < total // 3:  # the first 10 MB of the weights are written
        assert time.monotonic() < end and download.running(), download.error()
        time.sleep(0.05)
    download.cancel()
    assert not download.running() and download.cancelled and download.error() == ""
    assert not dl_hub.on_disk(REPO)  # the small files came first; the weights did not all come
    left = dl_hub.download_size(REPO)
    assert 0 < left < total
    fake_hub.bytes_per_second = None
    again = dl_hub.Download(REPO)
    _wait(again)
    assert again.error() == "" and dl_hub.on_disk(REPO)
    assert fake_hub.served < 2 * total  # resumed, not fetched again from nothing


def test_a_hub_that_cannot_answer_is_a_message(fake_hub, cache, monkeypatch):
    with pytest.raises(ModelLoadError, match="could not ask the hub how large org/absent is"):
        dl_hub.download_size("org/absent")
    download = dl_hub.Download("org/absent")
    _wait(download)
    assert "absent" in download.error() or "404" in download.error()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ModelLoadError, match=f"could not ask the hub how large {REPO} is"):
        dl_hub.download_size(REPO)


def test_model_box_asks_for_a_download_only_with_allow_downloads(fake_hub, cache):
    from ui.model.access import DownloadNeeded, ModelAccess

    with pytest.raises(ModelLoadError, match="loading hub model 'org/tiny-llada' from the page is off"):
        ModelAccess().check(REPO)
    opened = ModelAccess(allow_downloads=True)
    with pytest.raises(DownloadNeeded) as need:
        opened.check(REPO)
    assert need.value.repo_id == REPO
    for name, (repo, _) in dl_hub.HUB_MODELS.items():
        with pytest.raises(DownloadNeeded) as need:
            opened.check(name)
        assert need.value.repo_id == repo
    _wait(dl_hub.Download(REPO))
    assert opened.check(REPO) == REPO  # on disk now: it loads


# ---------------------------------------------------------------- the page, in a browser

@pytest.fixture
def page_with_downloads(fake_hub, cache):
    import app
    from ui.page import LAUNCH_OPTIONS

    from test_page_under_many_clients import _free_port

    page, session = app.create(app.parse_args(["--allow-downloads"]))  # the engine reads the cache set above
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **LAUNCH_OPTIONS)
    yield url
    page.close()
    session.close()
    page.exports.cleanup()


def _status(b) -> str:
    return b.inner_text("#status")


def test_browser_download_waits_for_the_button_shows_progress_cancels_and_resumes(fake_hub, page_with_downloads):
    from playwright.sync_api import sync_playwright

    total = _wanted_bytes(fake_hub)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        b = browser.new_page(viewport={"width": 1500, "height": 2000})
        b.goto(page_with_downloads)
        b.get_by_text("Model", exact=True).first.click()  # the model accordion
        box = b.get_by_label("Model", exact=True)
        box.fill(REPO)
        box.press("Enter")
        b.get_by_role("button", name="Load model").click()
        button = b.locator("#download-btn")
        button.wait_for(state="visible", timeout=60_000)
        assert button.inner_text().strip() == f"Download {size_text(total)}"
        assert "Nothing is fetched until you press Download" in b.inner_text("#download-note")
        assert fake_hub.served == 0  # asked, sized, not fetched

        fake_hub.bytes_per_second = 1.5e6  # about 13 s for the weights
        button.click()
        b.wait_for_function("() => /Downloading org\\/tiny-llada: .* of .* \\(\\d+%\\)/"
                            ".test(document.querySelector('#status').innerText)", timeout=60_000)
        b.wait_for_function("() => !/\\(0%\\)/.test(document.querySelector('#status').innerText)", timeout=60_000)
        b.click("#cancel-download-btn")
        b.wait_for_function("() => document.querySelector('#status').innerText.includes('cancelled after')",
                            timeout=30_000)
        fetched = fake_hub.served
        assert 0 < fetched < total and not dl_hub.on_disk(REPO)
        time.sleep(1.0)
        assert fake_hub.served == fetched  # Cancel ended it: nothing more arrives
        assert "cancelled" in _status(b)  # and no load followed

        fake_hub.bytes_per_second = None
        assert "resume" in button.inner_text()
        button.click()
        b.wait_for_function("() => document.querySelector('#status').innerText.includes('Loaded org/tiny-llada')",
                            timeout=120_000)
        assert dl_hub.on_disk(REPO) and fake_hub.served < 2 * total
        browser.close()
