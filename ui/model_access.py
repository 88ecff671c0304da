"""Which models the page's model box may load."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dllm_local.errors import ModelLoadError
from dllm_local.serving.session import MODEL_CHOICES


class ModelAccess:
    """Which models the page's model box may load: the listed short names, folders under
    ``models_dir`` (a folder name there, or a path inside it), and hub ids only when
    ``allow_downloads``. The command line's ``--model`` is not limited by this."""

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
                return name
            raise ModelLoadError(f"loading hub model {name!r} from the page is off; start the page with "
                                 "--allow-downloads to allow it, or pick a listed model")
        where = (f"a model folder in {self.models_dir}" if self.models_dir is not None
                 else "a local folder (start the page with --models-dir DIR to allow the folders in DIR)")
        raise ModelLoadError(f"the page does not load {name!r}: pick one of {', '.join(self.listed)}, or {where}")
