"""Thin click CLI over the public API. Only :func:`main` exits the process."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import click

from harness import __version__
from harness.commands import (
    compare_cmds,
    device_cmds,
    firmware_cmds,
    hybrid_cmds,
    model_cmds,
    runner_cmds,
    sim_cmds,
    sweep_cmds,
)
from harness.errors import EspCheckError, ExitCode

ISSUE_URL = "https://github.com/esp-check/esp-check/issues"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="esp-check")
def cli() -> None:
    """Check TFLite Micro int8 models on ESP32: ESP-NN optimized vs ANSI C vs host reference."""


_COMMANDS = (
    model_cmds,
    compare_cmds,
    firmware_cmds,
    device_cmds,
    hybrid_cmds,
    runner_cmds,
    sim_cmds,
    sweep_cmds,
)
for _module in _COMMANDS:
    _module.register(cli)


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
