"""``esp-check run PLAN.toml --inventory BENCH.toml`` and ``esp-check bench detect``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.commands.common import SECONDS, make_console, native_options, native_options_from
from harness.errors import ExitCode


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, hard: threading.Event, console: Console) -> Iterator[None]:
    """First Ctrl-C / SIGTERM: finish running attempts, abort the rest. Second: stop waiting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            hard.set()
            console.print(f"[red]{name} again: abandoning running attempts; writing reports[/red]")
        else:
            stop.set()
            console.print(
                f"[yellow]{name}: letting running attempts finish, aborting the rest "
                "(again to stop now)[/yellow]"
            )

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@click.command("run")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--inventory",
    "-i",
    "inventory",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bench inventory TOML (the boards and how to reach them; see docs/ci.md).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default="esp-check-run",
    show_default=True,
    help="Artifact directory: per-job attempts, logs, summary.json, junit.xml.",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JUnit XML path (default OUT/junit.xml).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON summary path (default OUT/summary.json).",
)
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Markdown summary path (default OUT/summary.md). Also appended to $GITHUB_STEP_SUMMARY "
    "when that is set.",
)
@click.option("--no-step-summary", is_flag=True, help="Do not append to $GITHUB_STEP_SUMMARY.")
@click.option(
    "--lock-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Board lock directory shared by everyone using the bench (default: $ESP_CHECK_LOCK_DIR or "
    "a per-user directory).",
)
@click.option(
    "--lock-timeout",
    type=SECONDS,
    default=None,
    help="Seconds to wait for a board someone else is using (default: plan [run] lock_timeout_s).",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Build cache directory.",
)
@click.option(
    "--builder",
    type=click.Choice(["pio", "idf", "sim", "native"]),
    default=None,
    help="Override the boards' builder.",
)
@click.option(
    "--validate-only", is_flag=True, help="Check the plan and inventory, print the tasks, run nothing."
)
@native_options
def run_cmd(
    plan: Path,
    inventory: Path,
    out_dir: Path,
    junit: Path | None,
    json_path: Path | None,
    markdown: Path | None,
    no_step_summary: bool,
    lock_dir: Path | None,
    lock_timeout: float | None,
    cache_dir: Path | None,
    builder: str | None,
    validate_only: bool,
    components_dir: Path | None = None,
    sanitize: bool = False,
    jobs: int | None = None,
) -> int:
    """Run every model x input x board x variant of PLAN on the boards of the inventory.

    Exit code: 0 all matched, 1 a mismatch, 2 usage error, 3 infrastructure errors only, 4 a firmware
    fault (precedence 2, 4, 1, 3, 0).
    """
    from harness.runner import RunOptions, load_inventory, load_plan
    from harness.runner.executor import Runner
    from harness.runner.reports import markdown as render_md
    from harness.runner.reports import write_reports

    console = make_console(stderr=True)
    the_plan = load_plan(plan)
    inv = load_inventory(inventory)
    stop, hard = threading.Event(), threading.Event()
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        style = "red" if msg.startswith(("[quarantine]", "[retry]")) else "cyan"
        console.print(
            f"[dim]{time.monotonic() - t0:7.1f}s[/dim] [{style}]{escape(msg)}[/{style}]", highlight=False
        )

    opts = RunOptions(
        out_dir=out_dir,
        lock_dir=lock_dir,
        lock_timeout_s=lock_timeout,
        cache_dir=cache_dir,
        builder=builder,
        native=native_options_from(components_dir, sanitize, jobs),
        owner=f"esp-check run {plan.name} (user {os.environ.get('USER', '?')})",
        progress=progress,
        stop=stop,
        hard_stop=hard,
    )
    runner = Runner(the_plan, inv, opts)  # PlanError here: a job's board type is not on the bench
    if validate_only:
        for t in runner.tasks:
            click.echo(f"{t.id}: {len(t.case.inputs)} input(s), comparisons {', '.join(t.job.comparisons)}")
        click.echo(f"{len(runner.tasks)} task(s) on {len(inv.boards)} board(s): plan and inventory are valid")
        return int(ExitCode.MATCH)
    with _stop_on_signals(stop, hard, console):
        result = runner.run()
    paths = write_reports(result, json_path=json_path, junit_path=junit, markdown_path=markdown)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step and not no_step_summary:
        with contextlib.suppress(OSError), open(step, "a", encoding="utf-8") as fh:
            fh.write(render_md(result))
    _print(console, result)
    console.print(f"summary: {paths['json']}  junit: {paths['junit']}  markdown: {paths['markdown']}")
    return int(result.exit_code)


def _print(console: Console, result: Any) -> None:
    table = Table(
        title="esp-check run"
        + (" (SIMULATED BOARDS)" if any(b.bench.simulated for b in result.boards) else "")
    )
    for col in ("task", "board", "verdict", "attempts", "detail"):
        table.add_column(col)
    colours = {"match": "green", "mismatch": "red", "firmware_fault": "red"}
    for t in result.tasks:
        board = t.decisive.board if t.decisive else (t.attempts[-1].board if t.attempts else "-")
        c = colours.get(t.verdict, "yellow")
        table.add_row(
            escape(t.id),
            escape(board),
            f"[{c}]{t.verdict}[/{c}]",
            str(len(t.attempts)),
            "" if t.verdict == "match" else escape(t.reason[:100]),
        )
    console.print(table)
    for b in result.boards:
        if b.status != "ok":
            console.print(f"[red]board {escape(b.bench.name)} {b.status}:[/red] {escape(b.reason)}")
    colour = "green" if result.exit_code == ExitCode.MATCH else "red"
    console.print(
        f"[bold {colour}]exit {int(result.exit_code)}[/bold {colour}]"
        + (" (interrupted)" if result.interrupted else "")
    )


@click.group("bench")
def bench_group() -> None:
    """The boards on this bench (inventory helpers)."""


@bench_group.command("detect")
@click.option(
    "--probe-chip",
    is_flag=True,
    help="Ask each free port's ROM loader for its chip (resets the board; busy ports are skipped).",
)
@click.option(
    "--all", "show_all", is_flag=True, help="Also list serial devices that are not known ESP32 bridges."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table and a snippet.")
def detect_cmd(probe_chip: bool, show_all: bool, as_json: bool) -> int:
    """List attached serial devices (VID:PID, serial number, chip) and print an inventory snippet."""
    from harness.runner.inventory import detect_devices, inventory_snippet

    devices = detect_devices(probe_chip=probe_chip, only_known=not show_all)
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in devices], indent=2))
        return int(ExitCode.MATCH)
    console = make_console(stderr=True)
    if not devices:
        console.print("no serial devices that look like ESP32 boards" + ("" if show_all else " (try --all)"))
        return int(ExitCode.MATCH)
    table = Table(title="serial devices")
    for col in ("port", "VID:PID", "serial number", "location", "kind", "chip"):
        table.add_column(col)
    for d in devices:
        doc = d.to_dict()
        table.add_row(
            escape(d.device),
            doc["vid_pid"] or "-",
            escape(d.serial_number or "-"),
            escape(d.location or "-"),
            escape(d.kind or d.description),
            escape(d.chip or (d.chip_note or "-")),
        )
    console.print(table)
    click.echo(inventory_snippet(devices))
    return int(ExitCode.MATCH)


def register(group: click.Group) -> None:
    """Add ``run`` and ``bench`` to the top-level group."""
    group.add_command(run_cmd)
    group.add_command(bench_group)
