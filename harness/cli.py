"""Thin click CLI over the public API. Only :func:`main` exits the process."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import click

from harness import __version__
from harness.analysis.report import sanitize_text
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
from harness.errors import DISK_FULL_ERRNOS, EspCheckError, ExitCode, Terminated, write_error

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


for _cmd in cli.commands.values():
    if _cmd.short_help is None and _cmd.help:
        _cmd.short_help = _first_sentence(_cmd.help)


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
