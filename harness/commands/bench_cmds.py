"""``esp-check bench ...``: the boards on this bench (docs/ci.md).

``check-serial`` must run where the ``serial`` package is broken or missing (that is what it diagnoses),
so this module imports nothing that loads pyserial at import time.
"""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from harness.device.serialpkg import inspect_serial_package
from harness.errors import ExitCode


@click.group("bench")
def bench_group() -> None:
    """The boards on this bench (inventory helpers)."""


@bench_group.command("check-serial")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def check_serial_cmd(as_json: bool) -> int:
    """Which distribution's files make up the `serial` package (pyserial / pyserial-labgrid).

    Exit 0 when the package is whole, 3 when files are missing (the output says how to repair it).
    """
    pkg = inspect_serial_package()
    if as_json:
        click.echo(json.dumps(pkg.to_dict(), indent=2))
    else:
        click.echo(pkg.describe())
        if not (pkg.ok and pkg.provider):
            click.echo(f"repair: {pkg.fix()}")
    return int(ExitCode.MATCH if pkg.ok else ExitCode.INFRASTRUCTURE)


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
    # lazy: check-serial, in this group, must run without pyserial (the inventory's) and numpy (common's)
    from harness.commands.common import make_console
    from harness.runner.inventory import detect_devices, inventory_snippet

    devices = detect_devices(probe_chip=probe_chip, only_known=not show_all)
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in devices], indent=2))
        return int(ExitCode.MATCH)
    console = make_console(stderr=True)
    if not devices:
        console.print("no serial devices that look like ESP32 boards" + ("" if show_all else " (try --all)"))
        return int(ExitCode.MATCH)
    table = Table("port", "VID:PID", "serial number", "location", "kind", "chip", title="serial devices")
    for d in devices:
        table.add_row(
            escape(d.device),
            d.vid_pid or "-",
            escape(d.serial_number or "-"),
            escape(d.location or "-"),
            escape(d.kind or d.description),
            escape(d.chip or (d.chip_note or "-")),
        )
    console.print(table)
    click.echo(inventory_snippet(devices))
    return int(ExitCode.MATCH)
