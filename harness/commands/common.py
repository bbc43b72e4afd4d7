"""Flags and helpers shared by several commands (one definition, so every command reads inputs alike)."""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from rich.console import Console

from harness.errors import Verdict
from harness.model.inputs import COLOR_MODES, NAMED_RANGES, RESIZE_POLICIES, InputOptions

if TYPE_CHECKING:
    from harness.flows.job import JobOptions

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN and infinities (``nan`` passes every ``<``/``>`` check, so a
    NaN tolerance would quietly turn every mismatch into a match)."""

    name = "finite float"

    def _describe_range(self) -> str:
        if self.min is None and self.max is None:
            return "finite"  # not click's "x<=None"
        return super()._describe_range()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv} is not a finite number", param, ctx)
        return rv


# Numeric flags, checked when the command line is parsed: bad values exit 2 before any work is done.
LSB = FiniteFloat(min=0, max=1e12)  # tolerances in quantization steps
SECONDS = FiniteFloat(min=0, min_open=True, max=7 * 24 * 3600)  # timeouts
WAIT_SECONDS = FiniteFloat(min=0, max=7 * 24 * 3600)  # waits for a held board: 0 = do not wait
POSITIVE = FiniteFloat(min=0, min_open=True)  # scales
FINITE = FiniteFloat()  # offsets
BAUD = click.IntRange(min=300, max=16_000_000)
ARENA_KB = click.IntRange(min=1, max=1024 * 1024)
# Path flags: a file, or a directory (neither needs to exist yet unless the command says so)
FILE = click.Path(dir_okay=False, path_type=Path)
DIR = click.Path(file_okay=False, path_type=Path)


# a verdict on the terminal: a match is green, a finding red, anything else (no verdict) yellow
VERDICT_COLOURS: dict[Verdict | None, str] = {
    Verdict.MATCH: "green",
    Verdict.MISMATCH: "red",
    Verdict.FIRMWARE_FAULT: "red",
}


def make_console(*, stderr: bool = False, highlight: bool = True) -> Console:
    """Rich console; when output is piped (CI logs, files), wide enough that tables do not wrap."""
    con = Console(stderr=stderr, highlight=highlight)
    return con if con.is_terminal else Console(stderr=stderr, highlight=highlight, width=160)


def with_options(*options: Callable[[Any], Any]) -> Callable[[F], F]:
    """Apply a table of click options (listed in the order --help shows them)."""

    def apply(f: F) -> F:
        for opt in reversed(options):
            f = opt(f)
        return f

    return apply


def gathered(name: str, make: Callable[..., object], keys: Sequence[str]) -> Callable[[F], F]:
    """The command's parameters among ``keys`` handed to it as one argument, ``name=make(**their values)``
    (each parameter's name is ``make``'s keyword)."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {k: kwargs.pop(k) for k in keys if k in kwargs}
            return f(*args, **kwargs, **{name: make(**given)})

        return cast(F, wrapper)

    return decorate


def grouped_options(
    name: str, make: Callable[..., object], *options: Callable[[Any], Any]
) -> Callable[[F], F]:
    """A table of click options handed to the command as one argument (:func:`gathered`)."""
    keys = [p.name for p in with_options(*options)(click.Command("probe")).params if p.name]

    def decorate(f: F) -> F:
        return with_options(*options)(gathered(name, make, keys)(f))

    return decorate


# ``--resize``, ``--input-color``, ``--input-range``, ``--input-scale/-offset``, ``--input-dtype``
preprocessing_options = grouped_options(
    "input_options",
    InputOptions,
    click.option(
        "--resize",
        type=click.Choice(RESIZE_POLICIES),
        default="error",
        help="Image size policy when it differs from the model's.",
    ),
    click.option("--input-color", "color", type=click.Choice(COLOR_MODES), default="auto"),
    click.option(
        "--input-range",
        "value_range",
        type=click.Choice(tuple(NAMED_RANGES)),
        help="Normalise 8-bit data to this real range (default: the range the input tensor's "
        "quantization spans, else 0..1; `inspect` says which).",
    ),
    click.option("--input-scale", "scale", type=POSITIVE, help="real = value * scale + offset"),
    click.option("--input-offset", "offset", type=FINITE),
    click.option(
        "--input-dtype", "raw_dtype", help="Element type of raw binary inputs (int8, float32, ...)."
    ),
)


# ``--input`` (repeatable, as ``inputs``) plus the shared preprocessing flags (``input_options``)
input_options = with_options(
    click.option(
        "--input",
        "inputs",
        multiple=True,
        type=FILE,
        help="Input file (PNG/JPEG/BMP, .npy, raw with --input-dtype, C array). Repeat for "
        "several runs; a model with N inputs takes N files per run, in input order.",
    ),
    preprocessing_options,
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


def schema_version_option(
    help: str = "With --json: write this report schema version (default: the current one; the previous "
    "one is deprecated and kept for one release).",
) -> Callable[[F], F]:
    """``--schema-version N``: the JSON report in an older schema version (deprecated, one release)."""
    return click.option("--schema-version", type=click.IntRange(min=1), help=help)


def warning_lines(render: Callable[[], T]) -> T:
    """``render()``; the deprecation warnings it raises go to stderr as warning lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        out = render()
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    return out


def echo_json(render: Callable[[], dict[str, Any]]) -> None:
    """Print ``render()``'s document; deprecation warnings it raises go to stderr as warning lines."""
    click.echo(json.dumps(warning_lines(render), indent=2))


def path_option(*decls: str, dir: bool = False, help: str | None = None, **extra: Any) -> Callable[[F], F]:
    """An optional path flag (default None): a file, or with ``dir`` a directory."""
    return click.option(*decls, type=DIR if dir else FILE, help=help, **extra)


# --cache-dir of every command that builds (flash-and-compare, build, run, hybrid, sweep)
CACHE_DIR_OPTION = path_option(
    "--cache-dir", dir=True, help="Build cache directory (default: $ESP_CHECK_CACHE_DIR/builds or per-user)."
)


def lsb_option(flag: str, help: str) -> Callable[[F], F]:
    """A tolerance in quantization steps (LSB), 0 (bit-exact) unless given."""
    return click.option(flag, type=LSB, default=0, help=help)


def out_option(default: str, help: str | None = None) -> Callable[[F], F]:
    """``--out DIR`` (as ``out_dir``): the command's artifact directory."""
    return click.option("--out", "out_dir", type=DIR, default=default, help=help)


def _native_options(**given: Any) -> object:
    # lazy: ~28 ms (filelock, subprocess) that compare, inspect, sim and sweep never need
    from harness.firmware.native.project import NativeOptions

    return NativeOptions(**given)


def _job_options(no_reference: bool = False, dump_ops: list[int] | None = None, **given: Any) -> JobOptions:
    from harness.flows.job import JobOptions  # lazy: the pipeline pulls pyserial; `--help` loads no pipeline

    return JobOptions(reference=not no_reference, dump_ops=tuple(dump_ops or ()), **given)


# the flags that say how the job runs, handed to flash-and-compare and hybrid as one ``job: JobOptions``
# (each flag's parameter is the field of its name; ``--no-reference`` is ``reference``, inverted)
_JOB_FLAGS = (
    *("input_options", "tolerance_lsb", "ref_tolerance_lsb", "no_reference", "allow_untested"),  # judging
    *("builder", "cache_dir", "flash_baud", "arena_kb", "timeouts", "native"),  # building, flashing
    *("junit", "html", "bundle", "tap", "dump_ops"),  # reports, features
)
job_options = gathered("job", _job_options, _JOB_FLAGS)


# how native boards build (docs/native.md)
native_options = grouped_options(
    "native",
    _native_options,
    click.option(
        "--components-dir",
        type=click.Path(file_okay=False, exists=True, path_type=Path),
        envvar="ESP_CHECK_COMPONENTS_DIR",
        help="Native boards: esp-tflite-micro and esp-nn sources (checkouts or a project's "
        "managed_components/) instead of the ESP-IDF component manager's download "
        "[env: ESP_CHECK_COMPONENTS_DIR].",
    ),
    click.option(
        "--sanitize",
        is_flag=True,
        help="Native boards: build with AddressSanitizer and UndefinedBehaviorSanitizer; a sanitizer "
        "report is a firmware fault (exit 4).",
    ),
    click.option(
        "--jobs",
        type=click.IntRange(min=1, max=256),
        help="Native boards: parallel compile jobs (default: the number of CPUs).",
    ),
)
