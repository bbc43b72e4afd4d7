"""Flags and helpers shared by several commands (one definition, so every command reads inputs alike)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from harness.model.inputs import COLOR_MODES, NAMED_RANGES, RESIZE_POLICIES, InputOptions

F = TypeVar("F", bound=Callable[..., Any])


def make_console(*, stderr: bool = False, highlight: bool = True) -> Console:
    """Rich console; when output is piped (CI logs, files), wide enough that tables do not wrap."""
    con = Console(stderr=stderr, highlight=highlight)
    return con if con.is_terminal else Console(stderr=stderr, highlight=highlight, width=160)


def preprocessing_options(f: F) -> F:
    """``--resize``, ``--input-color``, ``--input-range``, ``--input-scale/-offset``, ``--input-dtype``."""
    opts = [
        click.option(
            "--resize",
            type=click.Choice(RESIZE_POLICIES),
            default="error",
            show_default=True,
            help="Image size policy when it differs from the model's.",
        ),
        click.option("--input-color", type=click.Choice(COLOR_MODES), default="auto", show_default=True),
        click.option(
            "--input-range",
            type=click.Choice(tuple(NAMED_RANGES)),
            default=None,
            help="Normalise 8-bit data to this real range (images default to 0..1).",
        ),
        click.option("--input-scale", type=float, default=None, help="real = value * scale + offset"),
        click.option("--input-offset", type=float, default=None),
        click.option(
            "--input-dtype", default=None, help="Element type of raw binary inputs (int8, float32, ...)."
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def input_options_from(
    resize: str,
    input_color: str,
    input_range: str | None,
    input_scale: float | None,
    input_offset: float | None,
    input_dtype: str | None,
) -> InputOptions:
    """The InputOptions the preprocessing flags describe."""
    return InputOptions(
        resize=resize,
        color=input_color,
        scale=input_scale,
        offset=input_offset,
        value_range=input_range,
        raw_dtype=input_dtype,
    )


class OpListType(click.ParamType):
    """``17,18`` -> [17, 18] (sorted, unique), checked when the flags are parsed (exit 2 before work)."""

    name = "OPS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        out: set[int] = set()
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                self.fail(f"{part!r} is not an op index (e.g. 17,18)", param, ctx)
            out.add(int(part))
        return sorted(out)


OP_LIST = OpListType()


def schema_version_option(f: F) -> F:
    """``--schema-version N``: the JSON report in an older schema version (deprecated, one release)."""
    return click.option(
        "--schema-version",
        type=click.IntRange(min=1),
        default=None,
        help="With --json: write this report schema version (default: the current one; the previous "
        "one is deprecated and kept for one release).",
    )(f)


def echo_json(render: Callable[[], dict[str, Any]]) -> None:
    """Print ``render()``'s document; deprecation warnings it raises go to stderr as warning lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        doc = render()
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    click.echo(json.dumps(doc, indent=2))
