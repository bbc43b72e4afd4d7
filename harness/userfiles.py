"""Typed models of the files users write: plans, inventories, board files, simulator parameters.

Each format is a pydantic model (:class:`UserModel`: unknown keys rejected, no type coercion, frozen);
its defaults, ranges and choices are written once, there, and docs/schemas/*.json is generated from
it (``python -m harness.runner.schemas``). :func:`problem` turns pydantic's ValidationError into the
field path and a sentence, for the loader's own error that names the file and where in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails


class UserModel(BaseModel):
    """A table of a file a user writes: unknown keys are errors, values are taken as typed (TOML's)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def one_or_many(value: object) -> object:
    """A single string as the list of it (``boards = "sim"`` is ``boards = ["sim"]``)."""
    return [value] if isinstance(value, str) else value


# a non-empty list of non-empty strings; one string stands for a list of one
_Text = Annotated[str, Field(min_length=1)]
Strings = Annotated[
    tuple[_Text, ...],
    Field(strict=False, min_length=1),
    BeforeValidator(one_or_many, json_schema_input_type=_Text | Annotated[list[_Text], Field(min_length=1)]),
]


Loc = tuple[int | str, ...]
M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: object, error: Callable[[ValidationError], Exception]) -> M:
    """``data`` as ``model``; else ``error`` of pydantic's report: the loader's own, naming the file."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(exc) from None


def problem(
    exc: ValidationError, model: type[BaseModel], unknown: Mapping[str, str] | None = None
) -> tuple[Loc, str, str | None]:
    """(where, what is wrong, hint) of the first problem pydantic found in ``model``.

    An unknown key comes first (a misspelt key explains the missing one). ``unknown`` words it by its
    table's :func:`field_path` (``""``: the top level), e.g. ``{"": "is not a board field"}``; its hint
    lists the keys the table knows. A range or pattern error names what the field's description says
    it is (and has no hint).
    """
    errors = exc.errors(include_url=False)
    err = min(errors, key=lambda e: (e["type"] != "extra_forbidden", e["type"] == "too_short"))
    loc: Loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        parent = field_path(loc[:-1])[0]
        return loc, (unknown or {}).get(parent, "is not a known field"), _known_keys(model, loc)
    text = explain(err)
    info = _field_info(model, loc)
    if info is not None and info.description and err["type"] in _RANGE_ERRORS:
        text += f" ({info.description})"
    return loc, text, None


def _known_keys(model: type[BaseModel], loc: Loc) -> str:
    """The keys the table holding ``loc`` knows, for a hint after an unknown key."""
    parent = _field_info(model, loc[:-1]) if [x for x in loc[:-1] if isinstance(x, str)] else None
    table = _table(parent) if parent is not None else model
    return f"known: {', '.join(table.model_fields)}" if table is not None else ""


def _table(info: FieldInfo) -> type[BaseModel] | None:
    """The model of a field that is a table or a list of tables."""
    inner = [a for a in (info.annotation, *get_args(info.annotation)) if isinstance(a, type)]
    return next((a for a in inner if issubclass(a, BaseModel)), None)


def _field_info(model: type[BaseModel], loc: Loc) -> FieldInfo | None:
    """The field at ``loc`` (through nested tables and lists of tables), if it is one."""
    info = None
    for part in (x for x in loc if isinstance(x, str)):
        table = model if info is None else _table(info)
        info = table.model_fields.get(part) if table is not None else None
        if info is None:
            return None
    return info


def field_path(loc: Sequence[int | str]) -> tuple[str, str]:
    """(``timeouts.build``, ``""``) for ``("timeouts", "build")``; a list index goes into the second
    part, for the message: ``("comparisons", 1)`` is (``comparisons``, ``"entry 2 "``)."""
    names = [str(x) for x in loc if isinstance(x, str)]
    entries = "".join(f"entry {x + 1} " for x in loc if isinstance(x, int))
    return ".".join(names), entries


_RANGE_ERRORS = (
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "string_pattern_mismatch",
)
_TYPES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
}


def explain(err: ErrorDetails) -> str:
    """One pydantic error as the rest of the sentence "field 'x' ..."."""
    kind, msg, value = err["type"], str(err["msg"]), err.get("input")
    if kind == "missing":
        return "is missing"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind == "literal_error":
        expected = str(err["ctx"]["expected"])
        words = "one of " if "'" in expected else ""  # strings: one of 'a' or 'b'; numbers: 32 or 64
        return f"is {value!r}; expected {words}{expected}"
    if kind == "string_pattern_mismatch":
        return f"is {value!r}, which does not match {err['ctx']['pattern']}"
    if kind in ("string_too_short", "too_short") and err["ctx"]["min_length"] == 1:
        return "must not be empty"
    if kind in _TYPES:
        return f"must be {_TYPES[kind]}, not {value!r}"
    msg = msg.replace("Input should be", "must be").replace("Tuple should", "must")
    return f"{msg[:1].lower()}{msg[1:]}, not {value!r}"
