"""Thin click CLI over the public API. Only :func:`main` exits the process.

Commands load lazily (click's lazy-group pattern): ``esp-check --version`` imports click and nothing of
the tool, and a command imports its own module only when it runs. So ``esp-check bench check-serial``
works in the venv it exists for, one whose ``serial`` package is broken or missing.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import click

from harness import __version__
from harness.errors import (
    DISK_FULL_ERRNOS,
    EspCheckError,
    ExitCode,
    InfrastructureError,
    Terminated,
    write_error,
)

ISSUE_URL = "https://github.com/esp-check/esp-check/issues"

# command name -> "module:attribute" of its click command; the module is imported when the command runs
# (or when `--help` lists it). Top-level listing order is this table's order.
LAZY_COMMANDS: dict[str, str] = {
    "inspect": "harness.commands.model_cmds:inspect_cmd",
    "reference": "harness.commands.model_cmds:reference_cmd",
    "compare": "harness.commands.compare_cmds:compare_cmd",
    "boards": "harness.commands.firmware_cmds:boards_cmd",
    "generate": "harness.commands.firmware_cmds:generate_cmd",
    "build": "harness.commands.firmware_cmds:build_cmd",
    "flash-and-compare": "harness.commands.device_cmds:flash_and_compare_cmd",
    "hybrid": "harness.commands.hybrid_cmds:hybrid_cmd",
    "run": "harness.commands.runner_cmds:run_cmd",
    "bench": "harness.commands.bench_cmds:bench_group",
    "sim": "harness.commands.sim_cmds:sim_group",
    "sweep": "harness.commands.sweep_cmds:sweep_cmd",
}


# click's default short help stops at the first ". " (so "(e.g." cut the command list mid-parenthesis)
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)\.(?=\s|$)")


def _first_sentence(text: str) -> str:
    """The help's first sentence, whole (the command list wraps it), never cut inside parentheses."""
    para = " ".join(text.strip().split("\n\n")[0].split())
    for m in _SENTENCE_END.finditer(para):
        head = para[: m.end()]
        if head.count("(") == head.count(")"):
            return head
    return para


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use from a ``name -> "module:attr"`` table."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy
        self._listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *sorted(n for n in super().list_commands(ctx) if n not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module_name, _, attr = self.lazy[cmd_name].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if (exc.name or "harness").partition(".")[0] == "harness":
                raise  # a module of this tool missing is a bug (exit 70), not the environment
            if self._listing:
                # `--help` lists every command: one that cannot load here says why instead of
                # taking the whole listing down
                return click.Command(cmd_name, help=f"(unavailable: needs the Python package {exc.name!r})")
            raise InfrastructureError(
                f"`esp-check {cmd_name}` needs the Python package {exc.name!r}, which cannot be imported "
                f"here ({exc}). Reinstall esp-check's dependencies (pip install esp-check); for the "
                "`serial` package shared by pyserial and labgrid's fork, run `esp-check bench check-serial`."
            ) from exc
        command = getattr(module, attr)
        if not isinstance(command, click.Command):  # a wrong table entry is a bug, not a usage error
            raise TypeError(f"{self.lazy[cmd_name]} is {type(command).__name__}, not a click command")
        if command.short_help is None and command.help:
            command.short_help = _first_sentence(command.help)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    # every option's default shows in --help (an option without one shows none)
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100, "show_default": True},
)
@click.version_option(__version__, prog_name="esp-check")
def cli() -> None:
    """Check TFLite Micro int8 models on ESP32: ESP-NN optimized vs ANSI C vs host reference."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread, so a command stops as on Ctrl-C (reports
    written, child processes and temp folders cleaned up); a second SIGTERM ends the process at once.
    Commands that handle signals themselves (``run``) install their own handler inside this one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the next one is not caught: it really stops
        raise Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # the handler may have fired: restore what was there
            signal.signal(signal.SIGTERM, old)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and map outcomes to exit codes (see README: 0 match ... 70 internal)."""
    try:
        with sigterm_as_interrupt():
            rv = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # click turns Ctrl-C into Abort
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            click.echo("Terminated (SIGTERM).", err=True)
            code = int(ExitCode.TERMINATED)
        else:
            click.echo("Interrupted.", err=True)
            code = int(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        exc.show()
        code = int(ExitCode.USAGE)
    except click.exceptions.Exit as exc:
        code = int(exc.exit_code)
    except EspCheckError as exc:  # escape sequences in a path are shown escaped (click strips them)
        # loaded here, not at start-up: `esp-check --version` imports nothing of the tool
        from harness.analysis.report import sanitize_text

        text = "\n".join(sanitize_text(line) for line in str(exc).split("\n"))
        click.secho(f"error: {text}", fg="red", err=True)
        code = int(exc.exit_code)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            return _internal_error()
        click.secho(f"error: {write_error(exc, 'a file')}", fg="red", err=True)
        code = int(ExitCode.INFRASTRUCTURE)
    except Exception:  # the one place that turns surprises into exit 70
        code = _internal_error()
    else:
        code = int(rv) if isinstance(rv, int) else 0
    return code


def _internal_error() -> int:
    """The traceback of an exception esp-check did not expect, and where to report it (exit 70)."""
    traceback.print_exc()
    click.secho(
        f"internal error: this is a bug in esp-check {__version__}. Please report it with the "
        f"traceback above at {ISSUE_URL}",
        fg="red",
        err=True,
    )
    return int(ExitCode.INTERNAL)


def entry() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry()
