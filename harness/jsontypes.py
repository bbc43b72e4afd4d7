"""The type of a value that is genuinely arbitrary JSON (a report section read back, a user's file)."""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None
