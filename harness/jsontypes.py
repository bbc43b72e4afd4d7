"""JSON values: the type of one that is genuinely arbitrary (a report section read back, a user's file),
and how a float is written in report.json (JSON has no NaN or Infinity)."""

from __future__ import annotations

import math
from typing import TypeAlias

JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None


def json_number(x: float | str | None) -> float | str | None:
    """A float for report.json: non-finite values as the strings "nan", "inf", "-inf" (bare NaN or
    Infinity tokens are not JSON). A string (e.g. of a report read back) is left as it is: the report
    model checks it is one of them."""
    if x is None or isinstance(x, str) or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
