"""One physical board may not appear twice in an inventory under two spellings of its
port: host names, query strings, `/dev/./`, symlinks; and the board lock takes those spellings as one
board too. Real files and symlinks in a temporary folder; nothing is faked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.device.locks import lock_key
from harness.errors import PlanError
from harness.runner.inventory import load_inventory


def _inventory(tmp_path: Path, port_a: str, port_b: str) -> Path:
    inv = tmp_path / "bench.toml"
    inv.write_text(
        f'[[board]]\nname = "a"\ntype = "esp32-devkitc"\nport = "{port_a}"\n\n'
        f'[[board]]\nname = "b"\ntype = "esp32-devkitc"\nport = "{port_b}"\n',
        encoding="utf-8",
    )
    return inv


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("rfc2217://127.0.0.1:4000", "rfc2217://localhost:4000?ign_set_control"),
        ("rfc2217://LAB-PI:4000", "rfc2217://lab-pi.:4000?logging=debug"),
        ("socket://[::1]:5000", "socket://127.0.0.1:5000"),
        ("/dev/./ttyUSB0", "/dev/ttyUSB0"),
        ("/dev/serial/../ttyACM3", "/dev/ttyACM3"),
    ],
)
def test_two_spellings_of_one_port_are_one_board(tmp_path: Path, a: str, b: str) -> None:
    assert lock_key(a) == lock_key(b)
    with pytest.raises(PlanError, match="is also used by board 'a'"):
        load_inventory(_inventory(tmp_path, a, b))


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks here")
def test_a_by_id_symlink_is_its_target(tmp_path: Path) -> None:
    dev = tmp_path / "ttyUSB0"
    dev.write_bytes(b"")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    link = by_id / "usb-Silicon_Labs_CP2102N-if00-port0"
    link.symlink_to(dev)
    with pytest.raises(PlanError, match="both are"):
        load_inventory(_inventory(tmp_path, str(link), str(dev)))


@pytest.mark.parametrize(
    ("a", "b", "one_board"),
    [
        ("socket://0.0.0.0:5000", "socket://localhost:5000", True),  # 0.0.0.0 connects to this host
        ("rfc2217://LAB-PI.:4000", "rfc2217://lab-pi:4000", True),  # a trailing dot, whatever DNS says
        ("rfc2217://lab-pi:4000", "socket://lab-pi:4000?logging=debug", True),  # one TCP port, one server
        ("socket://[::ffff:127.0.0.1]:5000", "rfc2217://127.0.0.2:5000", True),
        ("/dev/serial/../ttyACM3", "/dev/ttyACM3", True),
        ("rfc2217://lab-pi:4000", "rfc2217://lab-pi:4001", False),
        ("/dev/ttyUSB0", "/dev/ttyUSB1", False),
    ],
)
def test_the_lock_and_the_inventory_agree_on_what_is_one_board(
    tmp_path: Path, a: str, b: str, one_board: bool
) -> None:
    # two spellings the lock takes as two boards let two jobs onto one board; two the inventory takes as
    # two boards give one board two names: both follow one rule
    assert (lock_key(a) == lock_key(b)) is one_board
    inv = _inventory(tmp_path, a, b)
    if one_board:
        with pytest.raises(PlanError, match="is also used by board 'a'"):
            load_inventory(inv)
    else:
        assert len(load_inventory(inv).boards) == 2


def test_different_ports_stay_different(tmp_path: Path) -> None:
    for a, b in [
        ("rfc2217://127.0.0.1:4000", "rfc2217://127.0.0.1:4001"),
        ("/dev/ttyUSB0", "/dev/ttyUSB1"),
    ]:
        assert lock_key(a) != lock_key(b)
        assert len(load_inventory(_inventory(tmp_path, a, b)).boards) == 2
