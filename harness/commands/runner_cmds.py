"""``esp-check run PLAN.toml --inventory BENCH.toml`` and ``esp-check bench detect``."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.commands.common import (
    CACHE_DIR_OPTION,
    FILE,
    VERDICT_COLOURS,
    WAIT_SECONDS,
    make_console,
    native_options,
    out_option,
    path_option,
    schema_version_option,
    warning_lines,
    with_options,
)
from harness.device.serialpkg import inspect_serial_package
from harness.errors import ExitCode, InfrastructureError, UsageError, Verdict
from harness.firmware.boards import BUILDERS

if TYPE_CHECKING:
    from harness.runner import Inventory, Plan, RunResult
    from harness.runner.executor import Runner


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, hard: threading.Event, console: Console) -> Iterator[None]:
    """First Ctrl-C: finish running attempts, abort the rest. A second signal, or SIGTERM (timeout(1),
    docker stop and CI cancels send it, then kill the process after a few seconds): abandon the running
    attempts now, abort the rest, write the reports."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set() or signum == signal.SIGTERM:
            again = " again" if stop.is_set() else ""
            stop.set()
            hard.set()
            console.print(f"[red]{name}{again}: abandoning running attempts; writing reports[/red]")
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


class _RunCommand(click.Command):
    """``run``, reading the deprecated ``--json PATH`` form as the hidden ``--json-file PATH``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, legacy_json_args(self, list(args)))


def legacy_json_args(cmd: click.Command, args: list[str]) -> list[str]:
    """Rewrite ``--json PATH`` / ``--json=PATH`` (before 0.2: a path) to ``--json-file PATH``.

    ``--json`` is a flag now. It took a path before; that form is recognised when the token after
    ``--json`` is a positional argument and another positional (the PLAN) remains without it.
    """
    takes_value = {
        o
        for p in cmd.params
        if isinstance(p, click.Option) and not p.is_flag
        for o in (*p.opts, *p.secondary_opts)
    }
    positional: list[int] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            positional += range(i + 1, len(args))
            break
        if a.startswith("--json="):
            return [*args[:i], "--json-file", a.split("=", 1)[1], *args[i + 1 :]]
        if a in takes_value:
            i += 2
            continue
        if not (a.startswith("-") and a != "-"):
            positional.append(i)
        i += 1
    for j, a in enumerate(args):
        if a == "--json" and j + 1 in positional and len(positional) >= 2:
            return [*args[:j], "--json-file", args[j + 1], *args[j + 2 :]]
    return args


# the options of ``run`` (kept apart so the command reads as its steps)
_run_options = with_options(
    click.option(
        "--inventory",
        "-i",
        "inventory",
        type=FILE,
        help="Bench inventory TOML (the boards and how to reach them; see docs/ci.md). Required "
        "unless --labgrid is given.",
    ),
    click.option(
        "--labgrid",
        "coordinator",
        metavar="HOST:PORT",
        help="labgrid coordinator: boards are labgrid places, reserved and acquired through "
        "labgrid-client. Without --inventory, every place tagged esp_check_type=<board type> is a "
        "board; with it, its `place = ...` boards use this coordinator (docs/ci.md, 'labgrid').",
    ),
    out_option(
        "esp-check-run",
        "Artifact directory: per-job attempts, logs, summary.json, junit.xml. A previous run's "
        "reports there are moved to OUT/previous-run/ when the run starts.",
    ),
    path_option("--junit", help="JUnit XML path (default OUT/junit.xml)."),
    click.option(
        "--json", "as_json", is_flag=True, help="Print the JSON summary on stdout (also in OUT/summary.json)."
    ),
    # the deprecated `--json PATH` form lands here; removed in the next release
    path_option("--json-file", hidden=True),
    schema_version_option(
        "Write the JSON summaries (stdout, summary.json, result.json) in this schema version "
        "(default: the current one; 1 is deprecated and kept for one release)."
    ),
    path_option(
        "--markdown",
        help="Markdown summary path (default OUT/summary.md). Also appended to $GITHUB_STEP_SUMMARY "
        "when that is set.",
    ),
    click.option("--no-step-summary", is_flag=True, help="Do not append to $GITHUB_STEP_SUMMARY."),
    path_option(
        "--lock-dir",
        dir=True,
        help="Board lock directory shared by everyone using the bench (default: $ESP_CHECK_LOCK_DIR or "
        "a per-user directory).",
    ),
    click.option(
        "--lock-timeout",
        type=WAIT_SECONDS,
        help="Seconds to wait for a board someone else is using; 0 skips a held board at once "
        "(default: plan [run] lock_timeout_s).",
    ),
    CACHE_DIR_OPTION,
    click.option("--builder", type=click.Choice(BUILDERS), help="Override the boards' builder."),
    click.option(
        "--validate-only", is_flag=True, help="Check the plan and inventory, print the tasks, run nothing."
    ),
)


@click.command("run", cls=_RunCommand)
@click.argument("plan", type=FILE)
@_run_options
@native_options
def run_cmd(
    plan: Path,
    inventory: Path | None,
    coordinator: str | None,
    junit: Path | None,
    as_json: bool,
    json_file: Path | None,
    schema_version: int | None,
    markdown: Path | None,
    no_step_summary: bool,
    lock_timeout: float | None,
    validate_only: bool,
    **given: Any,
) -> int:
    """Run every model x input x board x variant of PLAN on the boards of the inventory.

    Exit code: 0 all matched, 1 a mismatch, 2 usage error, 3 infrastructure errors only, 4 a firmware
    fault (precedence 2, 4, 1, 3, 0).
    """
    # lazy: the runner pulls pyserial and pydantic; `esp-check --help` loads this module without them
    from harness.runner import RunOptions, write_reports
    from harness.runner.executor import Runner
    from harness.runner.reports import check_summary_version

    console = make_console(stderr=True)
    check_summary_version(schema_version)  # an unknown version is refused before anything runs
    if json_file is not None:
        click.echo(
            "warning: `run --json PATH` is deprecated and will be removed in the next release: --json is "
            "a flag now (the summary on stdout); the summary is always in OUT/summary.json",
            err=True,
        )
    the_plan, inv = _load(plan, inventory, coordinator)
    progress = _progress(console)
    stop, hard = threading.Event(), threading.Event()
    # ``given``: the other flags, RunOptions fields of their names (out_dir, lock_dir, cache_dir, ...)
    opts = RunOptions(
        lock_timeout_s=lock_timeout,
        owner=f"esp-check run {plan.name} (user {os.environ.get('USER', '?')})",
        progress=progress,
        stop=stop,
        hard_stop=hard,
        report_paths=[p for p in (junit, json_file, markdown) if p is not None],
        **given,
    )
    runner = Runner(the_plan, inv, opts)  # PlanError here: a job's board type is not on the bench
    if any(b.place for b in inv.boards):
        _check_serial_package(progress)
    if validate_only:
        return _validate_only(runner)
    with _stop_on_signals(stop, hard, console):
        result = runner.run()
    paths = warning_lines(  # a deprecation warning (schema version 1) becomes one warning line
        lambda: write_reports(
            result,
            json_path=json_file,
            junit_path=junit,
            markdown_path=markdown,
            schema_version=schema_version,
        )
    )
    _step_summary(result, no_step_summary)
    _print(console, result)
    console.print(f"summary: {paths['json']}  junit: {paths['junit']}  markdown: {paths['markdown']}")
    if as_json:
        click.echo(paths["json"].read_text(encoding="utf-8"), nl=False)
    return int(result.exit_code)


def _check_serial_package(progress: Callable[[str], None]) -> None:
    """labgrid and esptool share the ``serial`` package (docs/ci.md): say whose it is, refuse a broken one."""
    pkg = inspect_serial_package()
    if not pkg.ok:
        raise InfrastructureError(pkg.describe(), hint=f"repair it: {pkg.fix()} (docs/ci.md, 'labgrid')")
    progress(f"[labgrid] {pkg.describe()}")


def _load(plan: Path, inventory: Path | None, coordinator: str | None) -> tuple[Plan, Inventory]:
    # lazy: the runner pulls pyserial and pydantic; `esp-check --help` loads this module without them
    from harness.runner import load_inventory, load_plan
    from harness.runner.inventory import discover_inventory

    if inventory is not None:
        return load_plan(plan), load_inventory(inventory, coordinator=coordinator)
    if coordinator is None:
        raise UsageError(
            "run needs the boards: --inventory BENCH.toml, or --labgrid HOST:PORT (a labgrid coordinator)",
            hint="see docs/ci.md",
        )
    return load_plan(plan), discover_inventory(coordinator)


def _progress(console: Console) -> Callable[[str], None]:
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        style = "red" if msg.startswith(("[quarantine]", "[retry]")) else "cyan"
        console.print(
            f"[dim]{time.monotonic() - t0:7.1f}s[/dim] [{style}]{escape(msg)}[/{style}]", highlight=False
        )

    return progress


def _validate_only(runner: Runner) -> int:
    for t in runner.tasks:
        click.echo(f"{t.id}: {len(t.case.inputs)} input(s), comparisons {', '.join(t.job.comparisons)}")
    click.echo(
        f"{len(runner.tasks)} task(s) on {len(runner.inv.boards)} board(s): plan and inventory are valid"
    )
    return int(ExitCode.MATCH)


def _step_summary(result: RunResult, disabled: bool) -> None:
    from harness.runner.reports import markdown as render_md  # lazy: the runner pulls pyserial (run_cmd)

    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step and not disabled:
        with contextlib.suppress(OSError), open(step, "a", encoding="utf-8") as fh:
            fh.write(render_md(result))


def _print(console: Console, result: RunResult) -> None:
    from harness.runner.results import BoardStatus, TaskState  # lazy: the runner pulls pyserial (run_cmd)

    kind = " (SIMULATED BOARDS)" if any(b.bench.simulated for b in result.boards) else ""
    table = Table("task", "board", "verdict", "attempts", "detail", title="esp-check run" + kind)
    for t in result.tasks:
        board = t.decisive.board if t.decisive else (t.attempts[-1].board if t.attempts else "-")
        c = VERDICT_COLOURS.get(t.verdict, "yellow")
        shown = str(t.state) if t.state == TaskState.ABORTED else str(t.verdict)
        table.add_row(
            escape(t.id),
            escape(board),
            f"[{c}]{shown}[/{c}]",
            str(len(t.attempts)),
            "" if t.verdict == Verdict.MATCH else escape(t.reason[:100]),
        )
    console.print(table)
    for b in result.boards:
        if b.status != BoardStatus.OK:
            console.print(f"[red]board {escape(b.bench.name)} {b.status}:[/red] {escape(b.reason)}")
    colour = "green" if result.exit_code == ExitCode.MATCH else "red"
    console.print(
        f"[bold {colour}]exit {int(result.exit_code)}[/bold {colour}]"
        + (f" ({result.stopped})" if result.stopped else "")
    )
