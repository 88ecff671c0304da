"""The page's presets: ``presets/*.json`` beside this package, each read through one schema
(pydantic): every field's type, size and range, and the settings through ``Settings`` itself.
A file that fails is skipped with a message naming the field and the rule; the others load."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from dllm_local.errors import schema_message
from dllm_local.settings import loadable
from dllm_local.trace import KV_VIEWS

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
PRESET_MAX_BYTES = 64 * 2**10  # a preset is a few kB of text


class View(BaseModel):
    """The KV panel a preset opens on."""
    model_config = ConfigDict(extra="forbid", strict=True)

    layer: str | None = Field(None, pattern=r"^(mean|\d{1,4})$", description='a layer number, or "mean", as text')
    which: Literal["k", "v"] | None = None
    kv_view: str | None = None

    @field_validator("kv_view")
    @classmethod
    def _known_view(cls, value: str | None) -> str | None:
        if value is not None and value not in KV_VIEWS:
            raise ValueError(f"must be one of {', '.join(KV_VIEWS)}")
        return value


class Preset(BaseModel):
    """One preset file."""
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=120)
    description: str = Field(max_length=4000)
    prompt: str | None = Field(None, min_length=1, max_length=20_000)
    settings: Annotated[dict, AfterValidator(loadable)]
    view: View = View()


def read_preset(path: Path) -> dict:
    """The preset in ``path`` as a plain dict, once the schema has passed it; raises ValueError."""
    if not path.is_file():
        raise ValueError("it is not a file")
    if path.stat().st_size > PRESET_MAX_BYTES:
        raise ValueError(f"it is over {PRESET_MAX_BYTES // 2**10} kB; a preset is a few kB")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"it is not JSON text ({type(exc).__name__})") from None
    try:
        return Preset.model_validate(data).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise ValueError(schema_message(exc, data, subject="the preset")) from None


def load_presets(directory: Path = PRESETS_DIR) -> tuple[dict[str, dict], list[str]]:
    """Valid presets by name, and one message per broken file (the others still load)."""
    presets, problems = {}, []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            preset = read_preset(path)
        except (ValueError, OSError) as exc:
            problems.append(f"preset {path.name} was skipped: {exc}")
            continue
        presets[preset["name"]] = preset
    return presets, problems
