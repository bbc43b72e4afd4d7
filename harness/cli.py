"""Thin click CLI over the public API. Only :func:`main` exits the process.

Commands load lazily (click's lazy-group pattern): ``esp-check --version`` imports click and nothing of
the tool, and a command imports its own module only when it runs. So ``esp-check bench check-serial``
works in the venv it exists for, one whose ``serial`` package is broken or missing.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence

import click

from harness import __version__
from harness.errors import EspCheckError, ExitCode, InfrastructureError

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
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="esp-check")
def cli() -> None:
    """Check TFLite Micro int8 models on ESP32: ESP-NN optimized vs ANSI C vs host reference."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and map outcomes to exit codes (see README: 0 match ... 70 internal)."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        click.echo("Interrupted.", err=True)
        code = int(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        exc.show()
        code = int(ExitCode.USAGE)
    except click.exceptions.Exit as exc:
        code = int(exc.exit_code)
    except EspCheckError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        code = int(exc.exit_code)
    except Exception:  # the one place that turns surprises into exit 70
        traceback.print_exc()
        click.secho(
            f"internal error: this is a bug in esp-check {__version__}. Please report it with the "
            f"traceback above at {ISSUE_URL}",
            fg="red",
            err=True,
        )
        code = int(ExitCode.INTERNAL)
    else:
        code = int(rv) if isinstance(rv, int) else 0
    return code


def entry() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry()
