"""Which models the page's model box may load."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dllm_local.errors import ModelLoadError
from dllm_local.hub import HUB_MODELS, on_disk
from dllm_local.serving.session import MODEL_CHOICES


class DownloadNeeded(ModelLoadError):
    """A hub model the page may download, once its user has confirmed: not on this machine yet."""

    def __init__(self, name: str, repo_id: str) -> None:
        super().__init__(f"{name} is not on this machine yet: download it first (the Download button names its size)")
        self.repo_id = repo_id


class ModelAccess:
    """Which models the page's model box may load: the listed short names, folders under
    ``models_dir`` (a folder name there, or a path inside it), and hub ids only when
    ``allow_downloads``. A hub model not on this machine is refused without ``allow_downloads``,
    and with it is a ``DownloadNeeded``: the page downloads it only once its user confirms. The
    command line's ``--model`` is not limited by this."""

    HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

    def __init__(self, models_dir: str | Path | None = None, allow_downloads: bool = False,
                 listed: Iterable[str] = MODEL_CHOICES) -> None:
        self.listed = list(listed)
        self.models_dir = Path(models_dir).expanduser().resolve() if models_dir else None
        self.allow_downloads = allow_downloads

    def check(self, name: str) -> str:
        """What to hand the engine for ``name`` (a listed name, a folder path or a hub id); raise
        ModelLoadError saying what is allowed otherwise."""
        name = (name or "").strip()
        if name in HUB_MODELS and name in self.listed:
            repo, gigabytes = HUB_MODELS[name]
            if not on_disk(repo):  # a download of many GB never starts from a click without consent
                if self.allow_downloads:
                    raise DownloadNeeded(name, repo)
                raise ModelLoadError(f"{name} ({repo}) is not on this machine, and the page downloads a model only "
                                     f"when started with --allow-downloads (it is about {gigabytes:g} GB); or "
                                     f"download it first: hf download {repo}")
        if name in self.listed:
            return name
        if name and self.models_dir is not None:
            candidate = Path(name).expanduser()
            candidate = (candidate if candidate.is_absolute() else self.models_dir / candidate).resolve()
            if candidate.is_relative_to(self.models_dir) and candidate != self.models_dir:
                if candidate.is_dir():
                    return str(candidate)
                if not self.HUB_ID.match(name):
                    raise ModelLoadError(f"there is no model folder {name!r} in {self.models_dir}")
        if self.HUB_ID.match(name) and not Path(name).expanduser().exists():
            if self.allow_downloads:
                if not on_disk(name):
                    raise DownloadNeeded(name, name)
                return name
            raise ModelLoadError(f"loading hub model {name!r} from the page is off; start the page with "
                                 "--allow-downloads to allow it, or pick a listed model")
        where = (f"a model folder in {self.models_dir}" if self.models_dir is not None
                 else "a local folder (start the page with --models-dir DIR to allow the folders in DIR)")
        raise ModelLoadError(f"the page does not load {name!r}: pick one of {', '.join(self.listed)}, or {where}")
