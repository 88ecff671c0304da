"""The hub models this project lists by short name, whether one is on this machine already, and
downloads the page starts only once a user has confirmed them: sized first, fetched by a child
process whose progress is read from the cache folder, cancellable. Torch-free: the page decides
before the engine loads anything.

Run as ``python -m dllm_local.hub REPO_ID`` it downloads REPO_ID's files into the Hugging Face
cache (what ``Download`` starts)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import ModelLoadError
from .files import FileRefused, read_json

# Short name -> (hub id, gigabytes of bf16 weights a download brings: said when downloads are off,
# so the page names a size without asking the hub).
HUB_MODELS = {
    "llada-8b-instruct": ("GSAI-ML/LLaDA-8B-Instruct", 16.0),
    "llada-1.5": ("GSAI-ML/LLaDA-1.5", 16.0),
    "dream-7b": ("Dream-org/Dream-v0-Instruct-7B", 15.2),
    "diffusiongemma-26b": ("google/diffusiongemma-26B-A4B-it", 51.6),  # a 26B mixture of experts, 4B active
    # Block diffusion (bf16 sizes from their parameter counts).
    "sdar-1.7b": ("JetLM/SDAR-1.7B-Chat", 4.1),
    "sdar-4b": ("JetLM/SDAR-4B-Chat", 8.0),
    "sdar-8b": ("JetLM/SDAR-8B-Chat", 16.4),
    "sdar-30b-a3b": ("JetLM/SDAR-30B-A3B-Chat", 61.1),  # a mixture of experts, 3B active
    "trado-4b": ("Gen-Verse/TraDo-4B-Instruct", 8.0),
    "trado-8b": ("Gen-Verse/TraDo-8B-Instruct", 16.4),
    "llada2-mini": ("inclusionAI/LLaDA2.0-mini", 32.5),  # 16B, 1.4B active
    "llada2-flash": ("inclusionAI/LLaDA2.0-flash", 206.0),  # 100B, 6.1B active
    "llada2.1-mini": ("inclusionAI/LLaDA2.1-mini", 32.5),
    "llada2.1-flash": ("inclusionAI/LLaDA2.1-flash", 206.0),
    "fast-dllm-v2-1.5b": ("Efficient-Large-Model/Fast_dLLM_v2_1.5B", 3.1),
    "fast-dllm-v2-7b": ("Efficient-Large-Model/Fast_dLLM_v2_7B", 15.2),
    # Bidirectional mixture of experts in the LLaDA format: 7B, 1.4B active.
    "llada-moe-7b-base": ("inclusionAI/LLaDA-MoE-7B-A1B-Base", 14.7),
    "llada-moe-7b-instruct": ("inclusionAI/LLaDA-MoE-7B-A1B-Instruct", 14.7),
}
# The tiny block-diffusion models in assets/models: tiny-block, the tiny model fine-tuned as SDAR
# (tiny_checkpoints/fine_tune_block.py), which answers the tiny tasks; then a random checkpoint of
# each family (and LLaDA-MoE) in its released format (tiny_checkpoints/random_<family>.py), which
# shows the mechanics, not good answers.
TINY_FAMILIES = ("tiny-block", "tiny-sdar", "tiny-sdar-moe", "tiny-llada2", "tiny-fast-dllm-v2", "tiny-llada-moe")
# The files of a model folder the loader, the tokenizer or transformers may open: all a download
# fetches (a repository's other weight formats are left on the hub).
OPENED_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken")
JSON_MAX_BYTES = 64 * 2**20  # a model folder's JSON (config, index, tokenizer): kilobytes to some MB
DOWNLOADED = tuple(f"*{suffix}" for suffix in OPENED_SUFFIXES)


def cache_dir() -> Path:
    """The Hugging Face hub cache, as the environment says now (``HF_HUB_CACHE``, ``HF_HOME``)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(constants.HF_HUB_CACHE)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def on_disk(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds all of ``repo_id``'s weights (every shard its
    index names), not just the small files a cancelled download fetched first."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> str | None:
        found = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir())
        return found if isinstance(found, str) else None

    if cached("config.json") is None:
        return False
    index = cached("model.safetensors.index.json")
    if index is None:
        return cached("model.safetensors") is not None
    try:  # read within bounds (a regular file, its depth): a deep one is a RecursionError to json
        shards = set(read_json(index, JSON_MAX_BYTES)["weight_map"].values())
    except (FileRefused, KeyError, AttributeError, TypeError):
        return False
    return all(cached(shard) is not None for shard in shards)


def download_size(repo_id: str) -> int:
    """Bytes a download of ``repo_id`` still has to fetch (its files the loader reads, less those in
    the cache), as the hub lists them; ModelLoadError when the hub cannot be asked."""
    from huggingface_hub import snapshot_download

    try:
        files = snapshot_download(repo_id, allow_patterns=list(DOWNLOADED), dry_run=True, endpoint=_endpoint(),
                                  cache_dir=cache_dir())
    except Exception as exc:  # noqa: BLE001 - offline, unknown repository, gated: the message is the same
        raise ModelLoadError(f"could not ask the hub how large {repo_id} is ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    return sum(f.file_size or 0 for f in files if f.will_download)


class Download:
    """``repo_id`` fetched into the hub cache by a child process. Its progress is the bytes in the
    repository's cache folder; ``cancel`` ends the child. What it fetched stays in the cache, and
    the next download of the repository resumes from it."""

    def __init__(self, repo_id: str) -> None:
        from huggingface_hub.file_download import repo_folder_name

        self.repo_id = repo_id
        self.blobs = cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
        self.at_start = self.bytes_on_disk()
        self.cancelled = False
        # The child's messages go to a file: a pipe nobody reads while it runs could fill and stall it.
        self._log = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "dllm_local.hub", repo_id], env=env,
                                        cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=self._log)

    def bytes_on_disk(self) -> int:
        """Bytes in the repository's cache folder, the files being written included."""
        try:
            return sum(f.stat().st_size for f in self.blobs.iterdir() if f.is_file())
        except OSError:  # not made yet, or a file renamed while it was read
            return 0

    def running(self) -> bool:
        return self.process.poll() is None

    def cancel(self) -> None:
        if self.running():
            self.cancelled = True
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def error(self) -> str:
        """Why the child failed, in its last line; empty while it runs, after success or a cancel."""
        if self.running() or self.cancelled or self.process.returncode == 0:
            return ""
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else f"the download ended with code {self.process.returncode}"


def _download(repo_id: str) -> int:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id, allow_patterns=list(DOWNLOADED), endpoint=_endpoint(), cache_dir=cache_dir())
    except Exception as exc:  # noqa: BLE001 - told to the page, which shows the last line
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_download(sys.argv[1]))
