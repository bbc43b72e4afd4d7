"""A simulated board type on a raw TCP (``socket://``) port is refused at once.

Nothing can reset a served simulator through raw TCP (DTR/RTS do not travel, nobody presses its
buttons), so after flashing it never runs its app: the limit is known before anything is touched, and
is named then (exit 2), not after minutes of flash retries and a silent capture. Nothing is faked: the
flow, the inventory loader and a real `esp-check sim serve` server are used as users use them.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

import harness.sim as sim
from harness.cli import main
from harness.errors import ExitCode, PlanError
from harness.runner import load_inventory
from harness.sim.board import remove_board
from harness.sim.serve import serve_tcp

MODEL = "cnn_classifier_11.tflite"
INPUT = "inputs/cnn_classifier_11__ambiguous.png"

sim.register()


def test_flash_and_compare_refuses_a_served_simulator_on_raw_tcp(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"raw-{uuid.uuid4().hex[:8]}"
    server = serve_tcp(f"sim://{name}?chip=esp32s3&boot=download")  # the best raw TCP can offer
    try:
        code = main(
            ["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
             "--board", "sim", "--port", server.address, "--out", str(tmp_path / "o")]
        )  # fmt: skip
        assert server.clients_served == 0  # refused before anything touched the board
    finally:
        server.stop()
        remove_board(name)
    err = " ".join(capsys.readouterr().err.split())
    assert code == ExitCode.USAGE, err
    assert "raw TCP" in err and "ROM loader" in err and "sim serve --rfc2217" in err, err
    assert not (tmp_path / "o" / "fw").exists()  # no build was started


def test_an_inventory_refuses_socket_for_a_simulated_board_type(tmp_path: Path) -> None:
    p = tmp_path / "bench.toml"
    p.write_text(textwrap.dedent('[[board]]\nname = "x"\ntype = "sim"\nport = "socket://127.0.0.1:4000"\n'))
    with pytest.raises(PlanError) as err:
        load_inventory(p)
    msg = err.value.message
    assert "board 'x'" in msg and "field 'port'" in msg and "raw TCP" in msg, msg
    assert "rfc2217" in (err.value.hint or ""), err.value.hint


def test_an_inventory_still_takes_socket_for_real_hardware(tmp_path: Path) -> None:
    p = tmp_path / "bench.toml"
    p.write_text('[[board]]\nname = "x"\ntype = "esp32-devkitc"\nport = "socket://ser2net:4000"\n')
    assert load_inventory(p).boards[0].port == "socket://ser2net:4000"
