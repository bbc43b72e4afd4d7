"""Report schema versions: the current one, and the previous one for one deprecation release.

Any change to a report's values bumps its ``schema_version``. For one release the previous form can
still be asked for (``--schema-version N`` on the CLI, ``schema_version=N`` in the API); it is produced
by downgrading the current document and says it is deprecated (a DeprecationWarning, which the CLI
prints as a warning line).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping

from harness.errors import UsageError

Doc = dict[str, object]  # a report document, as json.dumps writes it

# compare report v1 named usage errors "input_error" and every other error "error"
_COMPARE_V1_VERDICT = {
    "usage_error": "input_error",
    "infrastructure_error": "error",
    "internal_error": "error",
}


def versioned(
    doc: Doc,
    requested: int | None,
    *,
    what: str,
    downgrades: Mapping[int, Callable[[Doc], Doc]],
) -> Doc:
    """``doc`` (current version) as ``requested``; UsageError for a version that is not offered."""
    current = doc["schema_version"]
    if not isinstance(current, int):
        raise TypeError(f"{what}: schema_version {current!r} is not an integer")
    check_version(requested, current, downgrades, what=what)
    if requested is None or requested == current:
        return doc
    warnings.warn(
        f"{what} schema_version {requested} is deprecated and will be removed in the next release; "
        f"read schema_version {current} instead (see the schema in docs/)",
        DeprecationWarning,
        stacklevel=2,
    )
    old = downgrades[requested](copy.deepcopy(doc))
    old["schema_version"] = requested
    return old


def check_version(
    requested: int | None, current: int, downgrades: Mapping[int, object], *, what: str
) -> None:
    """UsageError for a version that is not offered: what a command checks before it runs anything."""
    if requested is not None and requested != current and requested not in downgrades:
        offered = ", ".join(str(v) for v in sorted({current, *downgrades}))
        raise UsageError(
            f"{what} schema_version {requested} is not available (this esp-check writes {offered})",
            hint=f"use --schema-version {current}",
        )


def compare_v1(doc: Doc) -> Doc:
    """compare report v2 -> v1: the old verdict names."""
    verdict = doc["verdict"]
    if isinstance(verdict, str):
        doc["verdict"] = _COMPARE_V1_VERDICT.get(verdict, verdict)
    return doc
