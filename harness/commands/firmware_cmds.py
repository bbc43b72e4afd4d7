"""CLI: ``esp-check boards``, ``generate``, ``build`` (a thin layer over the firmware API)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from harness.commands.common import (
    ARENA_KB,
    CACHE_DIR_OPTION,
    DIR,
    FILE,
    OP_LIST,
    SECONDS,
    make_console,
    native_options,
    path_option,
    preprocessing_options,
)
from harness.errors import ExitCode
from harness.firmware.boards import format_chip_rev, list_boards, load_board
from harness.firmware.build import BUILDERS, BuildResult, build_project
from harness.firmware.generate import (
    DEFAULT_VERSIONS,
    HUMAN_MAX,
    FirmwareFeatures,
    GeneratedProject,
    generate_projects,
)
from harness.flashfmt.partitions import VARIANTS


@click.command("boards")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list (schema esp-check.boards/1).")
@click.option(
    "--board-file",
    "board_files",
    multiple=True,
    type=FILE,
    help="Also validate and show this board .toml file (repeatable).",
)
def boards_cmd(as_json: bool, board_files: tuple[Path, ...]) -> int:
    """List the board definitions (boards/*.toml); a bad board file is an error naming the field."""
    boards = list_boards() + [load_board(p) for p in board_files]
    if as_json:
        click.echo(
            json.dumps({"schema": "esp-check.boards/1", "boards": [b.to_dict() for b in boards]}, indent=2)
        )
        return int(ExitCode.MATCH)
    columns = ("name", "chip", "chip rev", "flash", "PSRAM", "console", "reset", "MHz", "ESP-NN", "builder")
    table = Table(*(Column(c, no_wrap=True) for c in (*columns, "ESP-IDF")), title="Boards", expand=False)
    for b in boards:
        psram = f"{b.psram} {b.psram_mb}MB" if b.has_psram else "-"
        revs = b.chip_revisions
        rev = f"v{format_chip_rev(revs[0])}-v{format_chip_rev(revs[1])}" if revs else "any"
        low, below = b.idf_range
        table.add_row(
            b.name + (" (sim)" if b.simulated else ""),
            b.chip,
            rev,
            b.flash_size,
            psram,
            "usb-jtag" if b.console == "usb_serial_jtag" else f"uart {b.monitor_baud}",
            "usb-jtag" if b.reset == "usb_serial_jtag" else b.reset,
            str(b.cpu_mhz),
            b.espnn_path,
            b.builder,
            f">={low},<{below}",
        )
    make_console(highlight=False).print(table)
    return int(ExitCode.MATCH)


def _project_summary(project: GeneratedProject) -> dict[str, object]:
    return {
        "variant": project.variant,
        "path": str(project.path),
        "manifest": str(project.manifest_path),
        "board": project.board.name,
        "builder": project.board.builder,
        "arena_bytes": project.arena_bytes,
        "arena_mem": project.arena_mem,
        "files": list(project.files),
    }


@click.command("generate")
@click.argument("model", type=FILE)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    required=True,
    type=FILE,
    help="Input file (image, .npy, raw, C array); repeat for K inputs run in one boot.",
)
@click.option("--board", required=True, help="Board name (see `esp-check boards`) or a board .toml file.")
@click.option(
    "--variant",
    type=click.Choice((*VARIANTS, "both")),
    default="both",
    help="ESP-NN optimized kernels, ANSI C kernels, or both (one project directory each).",
)
@click.option("--out", "out_dir", required=True, type=DIR)
@click.option("--arena-kb", type=ARENA_KB, help="Tensor arena size (default: estimate).")
@click.option("--tflm-version", help=f"espressif/esp-tflite-micro (default {DEFAULT_VERSIONS['tflm']}).")
@click.option(
    "--esp-nn-version", "espnn_version", help=f"espressif/esp-nn (default {DEFAULT_VERSIONS['espnn']})."
)
@click.option(
    "--platform-version",
    help=f"platform-espressif32 for PlatformIO (default {DEFAULT_VERSIONS['platform']}).",
)
@click.option(
    "--human-max",
    type=click.IntRange(0, 1024),
    default=HUMAN_MAX,
    help="Dequantized `Output:` lines printed per output tensor.",
)
@preprocessing_options
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable summary (schema esp-check.generate/1)."
)
@click.option(
    "--tap", is_flag=True, help="Per-op checksum and cycle records after each Invoke (tap records)."
)
@click.option(
    "--dump-ops",
    type=OP_LIST,
    metavar="17,18",
    help="Also dump these ops' tensors (implies --tap).",
)
def generate_cmd(
    model: Path,
    inputs: tuple[Path, ...],
    board: str,
    variant: str,
    out_dir: Path,
    as_json: bool,
    tap: bool = False,
    dump_ops: list[int] | None = None,
    **given: Any,
) -> int:
    """Write firmware projects for MODEL and its inputs: OUT/optimized and OUT/ansi.

    Each is an ESP-IDF project (`idf.py build`) and a PlatformIO project (`pio run`); they differ
    only in CONFIG_NN_OPTIMIZED / CONFIG_NN_ANSI_C and in their manifest (esp-check.json).
    """
    # ``given``: the other flags, generate_projects' keywords of their names (arena, versions, inputs)
    variants = VARIANTS if variant == "both" else (variant,)
    feats = FirmwareFeatures(tap=tap or bool(dump_ops), dump_ops=tuple(dump_ops or ()))
    projects = generate_projects(
        model, list(inputs), board, out_dir=out_dir, variants=variants, features=feats, **given
    )
    if as_json:
        data = {"schema": "esp-check.generate/1", "projects": [_project_summary(p) for p in projects]}
        click.echo(json.dumps(data, indent=2))
    else:
        _print_generated(projects)
    return int(ExitCode.MATCH)


def _print_generated(projects: list[GeneratedProject]) -> None:
    """Where the projects went, the tap overhead, and how to build them."""
    console = make_console(highlight=False)
    for p in projects:
        console.print(
            f"[green]generated[/green] {p.variant:9} {p.path}  (board {p.board.name}, arena "
            f"{p.arena_bytes // 1024} KB in {p.arena_mem})"
        )
    tap_info = projects[0].manifest.get("tap")
    if tap_info:
        console.print(
            f"tap: {tap_info['max_ops']} ops, RAM overhead {tap_info['ram_bytes']} bytes "
            f"({tap_info['records_ram_bytes']} records + {tap_info['dump_ram_bytes']} dump buffer)"
        )
    first = projects[0]
    dirs = " ".join(str(p.path) for p in projects)
    if first.board.builder == "sim":
        how = "(packs images for the simulated board)."
    elif first.board.is_native:
        how = "(compiles a program for this PC; docs/native.md)."
    else:
        tool = "idf.py build" if first.board.builder == "idf" else "pio run"
        how = f"(or `{tool}` in each directory); see docs/firmware.md."
    console.print(f"Build with `esp-check build {dirs}` {how}")


def run_build_with_progress(
    project_dir: Path, console: Console, build: Callable[..., BuildResult]
) -> BuildResult:
    """``build(on_output=...)`` of ``project_dir`` with a rich progress line showing the tool's latest
    output (the full log goes to a file)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[name]}[/bold]"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", name=f"build {project_dir.name}")

        def on_output(line: str) -> None:
            text = line.strip()
            if text:
                progress.update(task, description=text[:90].replace("[", "\\["))

        return build(on_output=on_output)


@click.command("build")
@click.argument("project_dirs", nargs=-1, required=True, type=DIR)
@click.option("--builder", type=click.Choice(BUILDERS), help="Default: the board's builder.")
@CACHE_DIR_OPTION
@click.option("--no-cache", is_flag=True, help="Always run the builder; do not read or write the cache.")
@click.option("--cache-max-mb", type=click.IntRange(min=1), default=2048)
@path_option(
    "--platformio-core-dir",
    dir=True,
    help="PLATFORMIO_CORE_DIR for `pio run` (where PlatformIO keeps platforms and toolchains).",
)
@click.option("--pio", help="PlatformIO executable (default: pio on PATH).")
@click.option("--idf-py", "idf_py", help="ESP-IDF idf.py (default: idf.py on PATH).")
@click.option("--timeout", type=SECONDS, help="Kill the build after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result (schema esp-check.build/1).")
@native_options
def build_cmd(
    project_dirs: tuple[Path, ...], no_cache: bool, cache_max_mb: int, as_json: bool, **given: Any
) -> int:
    """Build generated project directories (e.g. OUT/optimized OUT/ansi), with a content-addressed cache."""
    # ``given``: the other flags, build_project's keywords of their names (builder, tools, timeout, native)
    progress_console = make_console(stderr=True, highlight=False)
    console = make_console(highlight=False)
    results: list[BuildResult] = []
    for project in project_dirs:
        size = cache_max_mb * 1024 * 1024
        build = functools.partial(
            build_project, project, use_cache=not no_cache, max_cache_bytes=size, **given
        )
        result = run_build_with_progress(project, progress_console, build)
        results.append(result)
        if not as_json:
            state = "cache hit" if result.cache_hit else "built"
            console.print(
                f"[green]{state}[/green] {project} with {result.builder} (key {result.cache_key[:12]})"
            )
            console.print(f"  {result.flasher_args}")
            for a in result.artifacts:
                console.print(f"  0x{a.offset:06x}  {a.role:16} {a.path}")
    if as_json:
        data = {
            "schema": "esp-check.build/1",
            "builds": [
                {
                    "project_dir": str(r.project_dir),
                    "builder": r.builder,
                    "chip": r.chip,
                    "cache_hit": r.cache_hit,
                    "cache_key": r.cache_key,
                    "firmware_sha256": r.firmware_sha256,
                    "flasher_args": str(r.flasher_args),
                    "log": str(r.log_path) if r.log_path else None,
                    "artifacts": [{**a._asdict(), "path": str(a.path)} for a in r.artifacts],
                }
                for r in results
            ],
        }
        click.echo(json.dumps(data, indent=2))
    return int(ExitCode.MATCH)
