"""The page's presets: ``presets/*.json`` beside this package, each validated on load."""
from __future__ import annotations

import json
from pathlib import Path

from dllm_local.errors import DllmError
from dllm_local.settings import Settings
from dllm_local.trace import KV_VIEWS

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
_VIEW_KEYS = {"layer": None, "which": ("k", "v"), "kv_view": KV_VIEWS}


def load_presets(directory: Path = PRESETS_DIR) -> tuple[dict[str, dict], list[str]]:
    """Valid presets by name, and one message per broken file (the others still load)."""
    presets, problems = {}, []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "name" not in data or "settings" not in data:
                raise ValueError("needs 'name' and 'settings'")
            Settings.from_dict(data["settings"])
            _check_view(data.get("view", {}))
            presets[data["name"]] = data
        except (ValueError, DllmError, TypeError) as exc:
            problems.append(f"preset {path.name} was skipped: {exc}")
    return presets, problems


def _check_view(view: object) -> None:
    """A preset's "view": the KV panel it opens on (layer: a layer number or "mean" as text)."""
    if not isinstance(view, dict) or set(view) - set(_VIEW_KEYS):
        raise ValueError(f"'view' takes only {', '.join(_VIEW_KEYS)}")
    for key, allowed in _VIEW_KEYS.items():
        value = view.get(key)
        ok = value is None or (value in allowed if allowed else isinstance(value, str) and (value == "mean" or value.isdigit()))
        if not ok:
            raise ValueError(f"'view' {key} {value!r} is not one of {allowed or 'mean, 0, 1, ...'}")
