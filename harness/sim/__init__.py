"""The simulated ESP32-family board (``sim://`` pyserial URLs). See docs/simulator.md.

Public surface:

- :func:`register` - make ``serial.serial_for_url("sim://NAME?...")`` work (idempotent).
- :data:`REGISTRY` / :class:`BoardRegistry` / :class:`SimBoard` / :class:`BoardConfig` - boards by name.
- :func:`harness.sim.image.build_sim_firmware` - the "sim" builder.
- :func:`harness.sim.serve.serve_tcp` / :func:`harness.sim.serve.serve_rfc2217` - a board over TCP.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping

import serial

from harness.sim.board import REGISTRY, BoardConfig, BoardRegistry, SimBoard, config_from_params, parse_url
from harness.sim.faults import FAULTS, FaultSpec

__all__ = [
    "FAULTS",
    "REGISTRY",
    "BoardConfig",
    "BoardRegistry",
    "FaultSpec",
    "SimBoard",
    "config_from_params",
    "parse_url",
    "register",
    "url_for",
]

_PACKAGE = "harness.sim"
_register_lock = threading.Lock()


def register() -> None:
    """Add this package to pyserial's URL handler packages (the one process-wide registration)."""
    with _register_lock:
        if _PACKAGE not in serial.protocol_handler_packages:
            serial.protocol_handler_packages.append(_PACKAGE)


def url_for(name: str, params: Mapping[str, object] | None = None) -> str:
    """``sim://NAME?...`` for a board name and a board file's ``[sim]`` table (validated here)."""
    query = urllib.parse.urlencode({k: str(v) for k, v in (params or {}).items()})
    url = f"sim://{name}" + (f"?{query}" if query else "")
    parse_url(url)  # raises UsageError (exit 2) naming the bad key or value
    return url
