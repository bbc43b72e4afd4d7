"""The JSON Schemas of the files users write, generated from their models into docs/schemas/.

``python -m harness.runner.schemas [DIR]`` writes them (default: docs/schemas/ of this checkout);
tests/test_user_schemas.py fails when docs/ holds another text than the models give. An editor that
reads JSON Schema for TOML (taplo, Even Better TOML) completes and checks a file that starts with
``#:schema PATH/plan.schema.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from harness.firmware.boards import BoardFile
from harness.runner.inventory import InventoryFile
from harness.runner.plan import PlanFile
from harness.sim.board import SimParams

SCHEMAS: dict[str, type[BaseModel]] = {
    "plan.schema.json": PlanFile,
    "inventory.schema.json": InventoryFile,
    "board.schema.json": BoardFile,
    "sim-params.schema.json": SimParams,
}
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"


class _TomlSchema(GenerateJsonSchema):
    """TOML has no null: an optional key is one that may be left out, not one that may be null."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])


def _drop_null_defaults(node: Any) -> Any:
    """Without ``"default": null`` and the unset keys (None) of a table's default."""
    if isinstance(node, dict):
        return {k: _drop_null_defaults(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_null_defaults(v) for v in node]
    return node


def schema_text(name: str) -> str:
    """The schema file ``name`` as it belongs in docs/schemas/ (stable text: one diff per change)."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://github.com/esp-check/esp-check/blob/main/docs/schemas/{name}",
        **_drop_null_defaults(SCHEMAS[name].model_json_schema(schema_generator=_TomlSchema)),
    }
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_schemas(directory: Path = DOCS_DIR) -> list[Path]:
    """Write every schema into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in SCHEMAS:
        path = directory / name
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
