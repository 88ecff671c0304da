"""Results reports added to a sweep's chart ("Add results": an ``lm-eval --out`` or ``sweep --out``
file), read through one schema (pydantic): each field's type, range and size, the settings a row
carries through ``Settings``. Torch-free: the page uses it."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..errors import DllmError, schema_message
from ..settings import loadable
from ..tiny.tasks import MAX_PROBLEMS
from ..values import Text
from .frontier import MAX_POINTS, pareto, policy_curves

NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0)]


class ResultRow(BaseModel):
    """One point of a results report (``sweep --out``, ``lm-eval --out``): what the chart, the table
    and a click on a row read. Other fields of the row are dropped."""
    model_config = ConfigDict(extra="ignore")

    point: dict[Text, float | int | Text | None] = Field(max_length=32)
    accuracy: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1)]
    model_tok_s: NonNegative
    nfe: NonNegative
    tau: NonNegative | None = None
    tau_content: NonNegative | None = None
    label: Text | None = Field(None, max_length=200)
    n: int | None = Field(None, ge=0, le=MAX_PROBLEMS)
    settings: Annotated[dict, AfterValidator(loadable)] | None = None


class ResultsReport(BaseModel):
    """A results report as "Add results" takes it."""
    model_config = ConfigDict(extra="ignore")

    rows: list[ResultRow] = Field(min_length=1, max_length=MAX_POINTS)
    problems: int | None = Field(None, ge=0, le=MAX_PROBLEMS)
    limit: int | None = Field(None, ge=0, le=MAX_PROBLEMS)
    axes: dict[Text, list[float | int | Text | None]] | None = Field(None, max_length=32)


def _checked_report(report: object, source: str) -> dict:
    if not isinstance(report, dict) or "rows" not in report:
        raise DllmError(f"{source} is not a sweep or lm-eval report: it has no \"rows\" "
                        "(write one with `python -m dllm_local lm-eval ... --out FILE` or `sweep ... --out FILE`)")
    try:
        return ResultsReport.model_validate(report).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise DllmError(f"{source}: {schema_message(exc, report, subject='the report')}") from None


def add_points(current: dict, added: dict, source: str) -> dict:
    """``current`` (a sweep report, possibly empty) with ``added``'s points appended, each labelled
    with where it came from and keeping its own number of problems; the frontier recomputed."""
    added = _checked_report(added, source)
    new_rows = added["rows"]
    held = len(current.get("rows") or [])
    if held + len(new_rows) > MAX_POINTS:
        raise DllmError(f"{source} has {len(new_rows)} points and the chart {held}: a chart holds at most "
                        f"{MAX_POINTS} (the front of each is computed over all of them)")
    n_added = added.get("problems") or added.get("limit") or 0
    rows = [dict(r, n=r.get("n", current.get("problems") or 0)) for r in current.get("rows") or []]
    rows += [dict(r, n=r.get("n") or n_added, label=r.get("label") or source, pareto=False) for r in new_rows]
    front = set(pareto(rows))
    for i, row in enumerate(rows):
        row["pareto"] = i in front
    axes = dict(current.get("axes") or added.get("axes") or {})
    return {**current, "axes": axes, "rows": rows, "problems": current.get("problems") or n_added,
            "policies": policy_curves(rows)}
