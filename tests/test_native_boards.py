"""Native boards as data: the built-in ones, what a native board file may say, and bench inventories.

What is real: the board loader and validator, the inventory loader, ``esp-check generate`` rendering a
native board's projects, PlatformIO not involved. Nothing is faked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import BoardDefinitionError, UsageError
from harness.firmware.boards import load_board, load_board_file
from harness.firmware.build import build_project
from harness.firmware.generate import generate_projects
from harness.resources import parse_toml
from harness.runner import load_inventory

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"


def test_builtin_native_boards() -> None:
    b64, b32 = load_board("native-esp32"), load_board("native-esp32-m32")
    for b in (b64, b32):
        assert b.is_native and not b.simulated and b.builder == "native" and b.espnn_path == "generic"
        assert b.chip == "esp32" and "NATIVE" in b.description
    assert (b64.native_bits, b32.native_bits) == (64, 32)
    assert load_board("esp32-devkitc").is_native is False and load_board("esp32-devkitc").native == {}


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else json.dumps(v)


def _write(tmp_path: Path, **changes: object) -> Path:
    """native-esp32.toml with some fields changed (None: removed), written back as TOML."""
    data = {**parse_toml((ROOT / "boards" / "native-esp32.toml").read_text()), **changes}
    lines = [f"{k} = {_value(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {_value(vv)}" for kk, vv in v.items())]
    p = tmp_path / f"{data['name']}.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"native": {"bits": 48}}, "native.bits", "expected 32 or 64"),
        ({"native": {"bits": True}}, "native.bits", "expected 32 or 64"),
        ({"native": {"arch": "x86"}}, "native.arch", "not a native setting"),
        ({"chip": "esp32s3", "espnn_path": "s3"}, "espnn_path", "generic C kernels"),
        ({"builder": "pio", "pio_board": "esp32dev"}, "native", "only allowed for native boards"),
    ],
)
def test_native_board_file_errors_name_the_field(
    tmp_path: Path, changes: dict, field: str, words: str
) -> None:
    with pytest.raises(BoardDefinitionError) as exc:
        load_board_file(_write(tmp_path, **changes))
    assert f"field '{field}'" in str(exc.value) and words in str(exc.value)


def test_default_bits_is_64(tmp_path: Path) -> None:
    assert load_board_file(_write(tmp_path, native=None, name="mine")).native_bits == 64


def test_native_projects_generate_and_build_only_natively(tmp_path: Path) -> None:
    projects = generate_projects(
        MODELS / "op_zoo.tflite",
        [MODELS / "inputs" / "op_zoo.npy"],
        "native-esp32",
        out_dir=tmp_path,
        arena_kb=16,
    )
    p = projects[0].path
    assert not (p / "platformio.ini").exists()  # PlatformIO cannot build a native board
    assert 'CONFIG_IDF_TARGET="esp32"' in (p / "sdkconfig.defaults").read_text()
    with pytest.raises(UsageError, match="native boards only with 'native'"):
        build_project(p, builder="pio")


def test_inventory_native_ports(tmp_path: Path) -> None:
    def inv(board_type: str, port: str) -> Path:
        f = tmp_path / "bench.toml"
        f.write_text(f'[[board]]\nname = "b1"\ntype = "{board_type}"\nport = "{port}"\n')
        return f

    assert load_inventory(inv("native-esp32", "native://pc-1")).boards[0].board.is_native
    for board_type, port, words in (
        ("native-esp32", "/dev/ttyUSB0", "native://NAME port"),
        ("native-esp32", "sim://x", "not a native:// URL"),
        ("esp32-devkitc", "native://pc-1", "is a native:// URL"),
    ):
        with pytest.raises(Exception, match=words):
            load_inventory(inv(board_type, port))
