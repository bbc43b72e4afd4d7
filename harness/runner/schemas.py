"""The JSON Schemas in docs/, generated from the models: the files users write (docs/schemas/) and
the compare report (docs/report-schema.json, also report.json's ``comparison``).

``python -m harness.runner.schemas [DIR]`` writes them (default: docs/ of this checkout);
tests/test_user_schemas.py fails when docs/ holds another text than the models give (editor support:
docs/ci.md "Plan file").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from harness.analysis.report_model import CompareReport
from harness.firmware.board_file import BoardFile
from harness.jsontypes import JSONValue
from harness.runner.inventory import InventoryFile
from harness.runner.plan import PlanFile
from harness.sim.board import SimParams

# path under docs/ -> the model; what users write is read (TOML), reports are written (JSON)
SCHEMAS: dict[str, type[BaseModel]] = {
    "schemas/plan.schema.json": PlanFile,
    "schemas/inventory.schema.json": InventoryFile,
    "schemas/board.schema.json": BoardFile,
    "schemas/sim-params.schema.json": SimParams,
    "report-schema.json": CompareReport,
}
WRITTEN = ("report-schema.json",)
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"
_ID = "https://github.com/esp-check/esp-check/"


class _Schema(GenerateJsonSchema):
    """Without the titles pydantic makes of field names ("Max Abs Diff" adds nothing to max_abs_diff)."""

    def field_title_should_be_set(self, schema: object) -> bool:
        return False


class _TomlSchema(_Schema):
    """TOML has no null: an optional key is one that may be left out, not one that may be null."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])


def _drop_null_defaults(node: JSONValue) -> JSONValue:
    """Without ``"default": null`` and the unset keys (None) of a table's default."""
    if isinstance(node, dict):
        return {k: _drop_null_defaults(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_null_defaults(v) for v in node]
    return node


def schema_text(name: str) -> str:
    """The schema file ``docs/<name>`` as the model gives it (stable text: one diff per change)."""
    model = SCHEMAS[name]
    body: JSONValue
    if name in WRITTEN:  # what esp-check writes: every key is there, null is a value
        body = model.model_json_schema(by_alias=True, mode="serialization", schema_generator=_Schema)
        ident = f"{_ID}docs/{name}"
    else:
        body = _drop_null_defaults(model.model_json_schema(schema_generator=_TomlSchema))
        ident = f"{_ID}blob/main/docs/{name}"
    assert isinstance(body, dict)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": ident, **body}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_schemas(directory: Path = DOCS_DIR) -> list[Path]:
    """Write every schema into ``directory``; returns the files written."""
    out = []
    for name in SCHEMAS:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(schema_text(name), encoding="utf-8")
        out.append(path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for path in write_schemas(Path(args[0]) if args else DOCS_DIR):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
