"""The simulated ESP32-family board (``sim://`` pyserial URLs). See docs/simulator.md.

Its public names are ``__all__`` below, ``harness.sim.image.build_sim_firmware`` (the "sim" builder) and
``harness.sim.serve`` (a board over TCP).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from harness.inprocess import BOARDS
from harness.sim.board import get_board, parse_url, remove_board

__all__ = ["get_board", "parse_url", "register", "remove_board", "url_for"]


def register() -> None:
    """Add this package to pyserial's URL handler packages."""
    BOARDS.register_handlers(__name__)


def url_for(name: str, params: Mapping[str, object] | None = None) -> str:
    """``sim://NAME?...`` for a board name and a board file's ``[sim]`` table (validated here)."""
    query = urllib.parse.urlencode({k: str(v) for k, v in (params or {}).items()})
    url = f"sim://{name}" + (f"?{query}" if query else "")
    parse_url(url)  # raises UsageError (exit 2) naming the bad key or value
    return url
