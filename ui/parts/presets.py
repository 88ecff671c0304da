"""The page's presets: ``presets/*.json`` beside this package, each read through one schema
(pydantic): every field's type, size and range, and the settings through ``Settings`` itself.
A file that fails is skipped with a message naming the field and the rule; the others load."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from dllm_local.errors import schema_message, shown
from dllm_local.files import read_json
from dllm_local.settings import loadable
from dllm_local.trace import KV_VIEWS
from dllm_local.values import Text

from .kinds import model_kind

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
PRESET_MAX_BYTES = 64 * 2**10  # a preset is a few kB of text
CURRENT_RUN = "Current Run settings"  # Compare's entry for the Run tab's own settings
RESERVED_NAMES = (CURRENT_RUN,)  # the page's own entries in the lists presets go in
RESERVED = {name.casefold() for name in RESERVED_NAMES}


class View(BaseModel):
    """The KV panel a preset opens on."""
    model_config = ConfigDict(extra="forbid", strict=True)

    layer: Text | None = Field(None, pattern=r"^(mean|\d{1,4})$", description='a layer number, or "mean", as text')
    which: Literal["k", "v"] | None = None
    kv_view: Text | None = None

    @field_validator("kv_view")
    @classmethod
    def _known_view(cls, value: str | None) -> str | None:
        if value is not None and value not in KV_VIEWS:
            raise ValueError(f"must be one of {', '.join(KV_VIEWS)}")
        return value


class Fits(BaseModel):
    """The models a preset is for: a kind (its settings mean something for that kind's decoding
    only) and, where they are one family's own (LLaDA 2.1's editing), those families."""
    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["masked", "block", "canvas"] = "masked"
    families: list[Text] | None = Field(None, min_length=1, max_length=16)


class Preset(BaseModel):
    """One preset file."""
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Text = Field(min_length=1, max_length=120)
    description: Text = Field(max_length=4000)
    prompt: Text | None = Field(None, min_length=1, max_length=20_000)
    settings: Annotated[dict, AfterValidator(loadable)]
    view: View = View()
    fits: Fits = Fits()


def fits(preset: dict, model: dict) -> bool:
    """Whether ``preset`` is for ``model`` (the engine's info on the loaded model): its kind, and
    its family where the preset names families."""
    wanted = {**Fits().model_dump(), **preset.get("fits", {})}
    return (model_kind(model).name == wanted["kind"]
            and (wanted["families"] is None or model.get("family") in wanted["families"]))


def presets_for(presets: dict[str, dict], model: dict) -> list[str]:
    """The names of the presets for ``model``, in the presets' order: what the menu offers."""
    return [name for name, preset in presets.items() if fits(preset, model)]


def read_preset(path: Path) -> dict:
    """The preset in ``path`` as a plain dict, once the schema has passed it; raises ValueError."""
    data = read_json(path, PRESET_MAX_BYTES, "it")
    try:
        return Preset.model_validate(data).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise ValueError(schema_message(exc, data, subject="the preset")) from None


def load_presets(directory: Path = PRESETS_DIR) -> tuple[dict[str, dict], list[str]]:
    """Valid presets by name, and one message per broken file (the others still load). A name is
    one preset's: a second file of that name, or one taking a name the page gives its own entries
    (``RESERVED_NAMES``), is skipped with a message naming both."""
    presets, problems, files = {}, [], {}
    for path in sorted(Path(directory).glob("*.json")):
        try:
            preset = read_preset(path)
        except (ValueError, OSError) as exc:
            problems.append(f"preset {path.name} was skipped: {exc}")
            continue
        name = preset["name"]
        if name in files or name.strip().casefold() in RESERVED:
            owner = f"{files[name]} has it already" if name in files else "the page's own entry has it"
            problems.append(f"preset {path.name} was skipped: its name {shown(name)} is taken ({owner}); "
                            "rename it in the file")
            continue
        presets[name], files[name] = preset, path.name
    return presets, problems


def preset_named(presets: dict[str, dict], model: dict, current: str | None, kept: str | None) -> str | None:
    """What the preset box names once ``model`` is loaded: the preset it named (``current``) if it
    is for ``model``, else the one it named when a model of this kind was last loaded (``kept``),
    else none (the controls stay as they are)."""
    fitting = presets_for(presets, model)
    return next((name for name in (current, kept) if name in fitting), None)
