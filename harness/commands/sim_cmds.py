"""``esp-check sim ...``: the simulated board (docs/simulator.md)."""

from __future__ import annotations

import sys
import urllib.parse

import click

from harness.commands.common import BAUD
from harness.errors import ExitCode
from harness.firmware.boards import load_board
from harness.flashfmt.partitions import VARIANTS


@click.group("sim")
def sim_group() -> None:
    """The simulated ESP32 board: real ROM loader protocol, real image formats, simulated results."""


@sim_group.command("serve")
@click.option("--name", default="sim0", help="Board name (state is kept per name).")
@click.option("--chip", type=click.Choice(["esp32", "esp32s3", "esp32c3"]), default="esp32s3")
@click.option(
    "--reset",
    "reset",
    type=click.Choice(["classic", "usb_jtag"]),
    default="classic",
    help="Reset circuit: DTR/RTS auto-reset (UART bridge) or USB-Serial-JTAG.",
)
@click.option(
    "--flash",
    type=click.Path(dir_okay=False),
    help="Keep the flash contents in this file (survives restarts; share it between processes).",
)
@click.option(
    "--flash-size",
    type=click.Choice(["1MB", "2MB", "4MB", "8MB", "16MB", "32MB"], case_sensitive=False),
    help="SPI flash size (default: the simulated board's, boards/sim.toml).",
)
@click.option(
    "--boot",
    type=click.Choice(["auto", "download"]),
    default="auto",
    help="auto: IO0 follows the reset circuit; download: strapped into download mode (BOOT held), "
    "powered on at start - what raw TCP clients need, since DTR/RTS cannot travel over a socket.",
)
@click.option("--fault", multiple=True, help="Inject a fault (repeatable); see docs/simulator.md.")
@click.option(
    "--variant-fault",
    type=click.Choice(VARIANTS),
    help="Apply app faults only to images of this variant.",
)
@click.option("--throttle", type=BAUD, help="Limit the board's output to this baud rate.")
@click.option("--seed", type=int, default=1, help="Seed for deterministic faults.")
@click.option("--host", default="127.0.0.1")
@click.option(
    "--port",
    "tcp_port",
    type=click.IntRange(0, 65535),
    default=0,
    help="TCP port (0: a free one).",
)
@click.option("--rfc2217", is_flag=True, help="Speak RFC 2217 (DTR/RTS and baud travel) instead of raw TCP.")
def serve_cmd(
    name: str,
    chip: str,
    reset: str,
    flash: str | None,
    flash_size: str | None,
    boot: str,
    fault: tuple[str, ...],
    variant_fault: str | None,
    throttle: int | None,
    seed: int,
    host: str,
    tcp_port: int,
    rfc2217: bool,
) -> int:
    """Expose a simulated board over TCP until interrupted (one client at a time).

    Raw TCP clients use socket://HOST:PORT and cannot reset the board (DTR/RTS do not travel over a
    raw socket): use --boot download for esptool over raw TCP. --rfc2217 clients use
    rfc2217://HOST:PORT and can reset it.
    """
    # lazy: the simulator pulls esptool and pydantic; `esp-check --help` loads this module without them
    from harness.sim import parse_url
    from harness.sim.serve import SimServer

    size = (flash_size or load_board("sim").flash_size).upper()
    params = {"chip": chip, "reset": reset, "seed": seed, "flash_size": size}
    params |= {"boot": None if boot == "auto" else boot, "flash": flash, "fault": ",".join(fault)}
    params |= {"variant_fault": variant_fault, "throttle": throttle}
    given = {key: str(value) for key, value in params.items() if value is not None and value != ""}
    url = f"sim://{name}?{urllib.parse.urlencode(given)}"
    parse_url(url)  # validate before binding (raises UsageError, exit 2)
    server = SimServer(url, host, tcp_port, rfc2217=rfc2217).start()
    click.echo(
        f"esp-check SIMULATED BOARD {name} ({chip}, {size} flash, reset={reset}, boot={boot}) serving {url}"
    )
    click.echo(f"listening on {server.address}")
    sys.stdout.flush()  # a parent process waits for this line to learn the port
    try:
        server.wait()
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        server.stop()
    return int(ExitCode.MATCH)
