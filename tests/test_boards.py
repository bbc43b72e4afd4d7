"""Board definitions (boards/*.toml): every built-in board is valid, bad files name the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import resources
from harness.chips import CHIPS
from harness.cli import main
from harness.errors import BoardDefinitionError, ExitCode
from harness.firmware.boards import Board, list_boards, load_board

REPO = Path(__file__).resolve().parents[1]

GOOD = """
name = "my-board"
description = "test board"
chip = "esp32s3"
pio_board = "esp32-s3-devkitc-1"
flash_size = "8MB"
psram = "octal"
psram_mb = 8
internal_ram_arena_kb = 256
console = "uart"
flash_baud = 921600
monitor_baud = 115200
reset = "classic"
cpu_mhz = 240
espnn_path = "s3"
builder = "pio"
"""


PT = "partition_table_offset = "


def _write(tmp_path: Path, text: str, name: str = "my-board.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_builtin_boards_load_and_cover_the_issue_list() -> None:
    boards = {b.name: b for b in list_boards()}
    for name in (
        "esp32-devkitc",
        "esp32s3-devkitc-1-n8r8",
        "esp32s3-devkitc-1-n8r2",
        "esp32s3-devkitc-1-n8",
        "esp32c3-devkitm-1",
        "esp32p4",
        "esp32p4-v3",
        "sim",
        "sim-usbjtag",
    ):
        assert name in boards, name
    assert boards["esp32-devkitc"].pio_board == "esp32dev"
    assert boards["esp32-devkitc"].chip == "esp32" and boards["esp32-devkitc"].psram == "none"
    assert boards["esp32s3-devkitc-1-n8r8"].psram == "octal"
    assert boards["esp32s3-devkitc-1-n8r2"].psram == "quad"
    assert boards["esp32c3-devkitm-1"].cpu_mhz == 160 and boards["esp32c3-devkitm-1"].espnn_path == "generic"
    assert boards["esp32p4"].builder == "idf" and boards["esp32p4"].espnn_path == "p4"
    # P4 silicon before v3 and v3 need different images (ESP-IDF: "mutually exclusive"): two boards,
    # each with the revisions its image accepts, the clock its silicon runs and, for v3, the first
    # ESP-IDF that can build for it at all
    old, v3 = boards["esp32p4"], boards["esp32p4-v3"]
    assert old.chip_revisions == (1, 199) and old.cpu_mhz == 360 and old.idf_range[0] == "5.3.0"
    assert old.sdkconfig["CONFIG_ESP32P4_SELECTS_REV_LESS_V3"] == "y"
    assert v3.chip_revisions == (300, 399) and v3.cpu_mhz == 400 and v3.idf_range[0] == "5.5.2"
    assert v3.sdkconfig == {"CONFIG_ESP32P4_SELECTS_REV_LESS_V3": "n", "CONFIG_ESP32P4_REV_MIN_300": "y"}
    for b in boards.values():  # every built-in board says which revisions its image accepts (a native
        assert (b.chip_revisions is None) == b.is_native, b.name  # board's program runs on no chip)
        assert b.partition_table_offset == 0xC000, b.name
    assert boards["sim"].builder == "sim" and boards["sim"].simulated
    assert (boards["sim"].default_port or "").startswith("sim://")
    assert boards["sim-usbjtag"].reset == "usb_serial_jtag"
    # the file name is the board name
    for b in boards.values():
        assert b.source is not None and b.source.stem == b.name


def test_bootloader_offsets_match_esptool_chip_table() -> None:
    # esptool's chip classes carry BOOTLOADER_FLASH_OFFSET: our fallback table must agree.
    from esptool.targets import CHIP_DEFS

    for chip, offset in {c.name: c.bootloader_offset for c in CHIPS.values()}.items():
        assert offset == CHIP_DEFS[chip].BOOTLOADER_FLASH_OFFSET, chip


def test_load_board_by_name_and_by_path(tmp_path: Path) -> None:
    b = load_board("esp32-devkitc")
    assert isinstance(b, Board) and b.chip == "esp32"
    p = _write(tmp_path, GOOD)
    custom = load_board(p)
    assert custom.name == "my-board" and custom.flash_bytes == 8 * 1024 * 1024
    assert load_board(str(p)) == custom


def test_unknown_board_lists_known_ones() -> None:
    with pytest.raises(BoardDefinitionError) as ei:
        load_board("esp32-nonexistent")
    assert "unknown board" in str(ei.value) and "esp32-devkitc" in str(ei.value)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (("chip", '"esp32s3"', '"esp8266"'), "chip", "expected one of"),
        (("cpu_mhz", "240", "320"), "cpu_mhz", "maximum for esp32s3"),
        (("cpu_mhz", "240", '"240"'), "cpu_mhz", "must be an integer"),
        (("psram", '"octal"', '"none"'), "psram_mb", "must be 0"),
        (("console", '"uart"', '"jtag"'), "console", "expected one of"),
        (("espnn_path", '"s3"', '"generic"'), "espnn_path", "always builds"),
        (("builder", '"pio"', '"sim"'), "simulated", "builder"),
        (("flash_size", '"8MB"', '"7MB"'), "flash_size", "expected one of"),
        (("monitor_baud", "115200", "12"), "monitor_baud", "baud"),
        (("builder", '"pio"\n', '"pio"\nidf_min = "5.5"\n'), "idf_min", "MAJOR.MINOR.PATCH"),
        # `$` matched before a final newline: "5.4.1\n" passed and reached app_main.cc's `#error` line
        (("builder", '"pio"\n', '"pio"\nidf_min = "5.4.1\\n"\n'), "idf_min", "MAJOR.MINOR.PATCH"),
        (("builder", '"pio"\n', '"pio"\nidf_min = "6.0.0"\n'), "idf_min", "below 6.0.0 only"),
        (("builder", '"pio"\n', '"pio"\nchip_rev_min = "3.0"\n'), "chip_rev_max", "is missing"),
        (
            ("builder", '"pio"\n', '"pio"\nchip_rev_min = "3.0"\nchip_rev_max = "1.99"\n'),
            "chip_rev_max",
            "below chip_rev_min",
        ),
        (
            ("builder", '"pio"\n', '"pio"\nchip_rev_min = "v3"\nchip_rev_max = "3.99"\n'),
            "chip_rev_min",
            "expected a chip revision",
        ),
        (("builder", '"pio"\n', '"pio"\n' + PT + "0x8800\n"), "partition_table_offset", "4 KB"),
        (("builder", '"pio"\n', '"pio"\n' + PT + "0xd000\n"), "partition_table_offset", "nvs"),
        (("builder", '"pio"\n', '"pio"\n' + PT + "0x7000\n"), "partition_table_offset", "0x8000"),
    ],
)
def test_bad_field_names_file_and_field(
    tmp_path: Path, change: tuple[str, str, str], field: str, words: str
) -> None:
    key, old, new = change
    text = GOOD.replace(f"{key} = {old}", f"{key} = {new}")  # (an optional field is added after builder)
    assert text != GOOD
    p = _write(tmp_path, text)
    with pytest.raises(BoardDefinitionError) as ei:
        load_board(p)
    msg = str(ei.value)
    assert str(p) in msg and f"'{field}'" in msg and words in msg
    assert ei.value.exit_code == ExitCode.USAGE


def test_missing_and_unknown_fields(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace('reset = "classic"\n', ""))
    with pytest.raises(BoardDefinitionError, match="'reset' is missing"):
        load_board(p)
    p = _write(tmp_path, GOOD + 'colour = "blue"\n')
    with pytest.raises(BoardDefinitionError, match="'colour' is not a known board field"):
        load_board(p)


def test_p4_cannot_use_platformio(tmp_path: Path) -> None:
    text = (
        GOOD.replace('chip = "esp32s3"', 'chip = "esp32p4"')
        .replace("cpu_mhz = 240", "cpu_mhz = 360")
        .replace('espnn_path = "s3"', 'espnn_path = "p4"')
        .replace('psram = "octal"', 'psram = "hex"')
    )
    with pytest.raises(BoardDefinitionError, match="cannot build esp32p4") as ei:
        load_board(_write(tmp_path, text))
    assert ei.value.hint and "idf" in ei.value.hint


def test_sdkconfig_table_is_validated(tmp_path: Path) -> None:
    ok = load_board(_write(tmp_path, GOOD + '[sdkconfig]\nCONFIG_FOO_BAR = "y"\n'))
    assert ok.sdkconfig == {"CONFIG_FOO_BAR": "y"}
    with pytest.raises(BoardDefinitionError, match=r"sdkconfig\.CONFIG_FOO"):
        load_board(_write(tmp_path, GOOD + '[sdkconfig]\nCONFIG_FOO = "y\\nCONFIG_NN_ANSI_C=y"\n'))
    with pytest.raises(BoardDefinitionError, match="not a Kconfig symbol"):
        load_board(_write(tmp_path, GOOD + '[sdkconfig]\nNN_OPT = "y"\n'))
    # Python's `$` matches before a final newline: a key or a value ending in one is still refused
    with pytest.raises(BoardDefinitionError, match="not a Kconfig symbol"):
        load_board(_write(tmp_path, GOOD + '[sdkconfig]\n"CONFIG_FOO\\n" = "y"\n'))
    with pytest.raises(BoardDefinitionError, match="unsupported value"):
        load_board(_write(tmp_path, GOOD + '[sdkconfig]\nCONFIG_FOO = "y\\n"\n'))


def test_invalid_toml_and_name_mismatch(tmp_path: Path) -> None:
    with pytest.raises(BoardDefinitionError, match="not valid TOML"):
        load_board(_write(tmp_path, "name = \n"))
    d = tmp_path / "dir"
    d.mkdir()
    _write(d, GOOD, name="other-name.toml")
    with pytest.raises(BoardDefinitionError, match=r"other-name\.toml"):
        list_boards(d)


def test_resources_prefer_wheel_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed wheel: harness/_data/{firmware_templates,boards} (pyproject force-include).
    pkg = tmp_path / "site" / "harness"
    (pkg / "_data" / "boards").mkdir(parents=True)
    (pkg / "_data" / "firmware_templates").mkdir(parents=True)
    monkeypatch.setattr(resources, "_PACKAGE_DIR", pkg)
    assert resources.boards_dir() == pkg / "_data" / "boards"
    assert resources.templates_dir() == pkg / "_data" / "firmware_templates"
    # Nothing anywhere: a clear error, not a crash.
    monkeypatch.setattr(resources, "_PACKAGE_DIR", tmp_path / "nowhere" / "harness")
    with pytest.raises(Exception, match="firmware_templates"):
        resources.templates_dir()


def test_resources_in_checkout() -> None:
    assert resources.boards_dir() == REPO / "boards"
    assert (resources.templates_dir() / "project" / "platformio.ini.j2").is_file()


def test_cli_boards_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boards", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "esp-check.boards/1"
    names = [b["name"] for b in data["boards"]]
    assert "esp32p4" in names and "sim" in names
    p4v3 = next(b for b in data["boards"] if b["name"] == "esp32p4-v3")
    assert (p4v3["chip_rev_min"], p4v3["chip_rev_max"]) == ("3.0", "3.99")
    assert p4v3["idf_range"] == ["5.5.2", "6.0.0"]
    assert p4v3["partition_table_offset"] == 0xC000
    assert main(["boards"]) == 0
    out = capsys.readouterr().out
    assert "esp32c3-devkitm-1" in out and "160" in out
    assert "v3.0-v3.99" in out and ">=5.5.2,<6.0.0" in out


def test_cli_boards_bad_file_is_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _write(tmp_path, GOOD.replace('reset = "classic"', 'reset = "magic"'))
    assert main(["boards", "--board-file", str(p)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "'reset'" in err and "my-board.toml" in err


def test_sim_boards_default_ports_parse_with_the_simulator() -> None:
    sim_board = pytest.importorskip("harness.sim.board")
    for name, reset in (("sim", "classic"), ("sim-usbjtag", "usb_jtag")):
        board = load_board(name)
        assert board.default_port is not None
        _, cfg = sim_board.parse_url(board.default_port)
        assert cfg.chip.name == board.chip and cfg.reset == reset
        assert cfg.flash_size == board.flash_bytes


def test_sim_table_only_on_simulated_boards(tmp_path: Path) -> None:
    with pytest.raises(BoardDefinitionError, match="'sim' is only allowed"):
        load_board(_write(tmp_path, GOOD + '[sim]\nfault = "panic"\n'))
    sim_text = (REPO / "boards" / "sim.toml").read_text().replace('name = "sim"', 'name = "my-sim"')
    b = load_board(_write(tmp_path, sim_text + '\n[sim]\nfault = "panic"\nseed = 3\n', name="my-sim.toml"))
    assert b.sim == {"fault": "panic", "seed": 3}


def test_optional_fields_default_and_round_trip(tmp_path: Path) -> None:
    plain = load_board(_write(tmp_path, GOOD))
    assert plain.chip_revisions is None and plain.idf_min is None  # no check, esp-check's range
    assert plain.partition_table_offset == 0xC000
    low, below = resources.idf_support()
    assert plain.idf_range == (low, below)
    older = load_board(_write(tmp_path, GOOD + 'idf_min = "5.0.0"\n'))
    assert older.idf_range == (low, below)  # a board can raise the minimum, never lower it
    extra = 'idf_min = "5.4.1"\nchip_rev_min = "0.1"\nchip_rev_max = "0.99"\n' + PT + "0x9000\n"
    b = load_board(_write(tmp_path, GOOD + extra))
    assert b.idf_range == ("5.4.1", below) and b.chip_revisions == (1, 99)
    assert b.partition_table_offset == 0x9000
    d = b.to_dict()
    assert d["chip_rev_min"] == "0.1" and d["chip_rev_max"] == "0.99" and d["idf_range"] == ["5.4.1", below]


# ---- the stored form of a validated board file (a repeat run imports no pydantic) -------------------
# Real: the loader, pydantic, the cache dir (a tmp ESP_CHECK_CACHE_DIR); nothing is faked.


def _fresh_load(path: Path, cache: Path) -> dict[str, object]:
    """``load_board`` in a fresh interpreter: the board it gave and whether pydantic was imported."""
    import os
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from harness.firmware.boards import load_board\n"
        "b = load_board(sys.argv[1])\n"
        "doc = {'board': b.to_dict(), 'source': str(b.source), 'pydantic': 'pydantic' in sys.modules}\n"
        "print(json.dumps(doc))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ESP_CHECK_CACHE_DIR": str(cache)}
    got = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr[-2000:]
    doc: dict[str, object] = json.loads(got.stdout)
    return doc


def test_a_board_file_validated_once_is_read_back_without_pydantic(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + 'sdkconfig = { CONFIG_X = "y" }\n')
    first = _fresh_load(path, tmp_path / "cache")
    again = _fresh_load(path, tmp_path / "cache")
    assert first["pydantic"] is True and again["pydantic"] is False
    assert again["board"] == first["board"] and again["source"] == str(path)
    (tmp_path / "elsewhere").mkdir()
    moved = _write(tmp_path / "elsewhere", GOOD + 'sdkconfig = { CONFIG_X = "y" }\n')
    assert _fresh_load(moved, tmp_path / "cache")["source"] == str(moved)  # the path is the caller's


def test_an_edited_or_refused_board_file_is_validated_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, GOOD)
    assert load_board(path).cpu_mhz == 240
    path.write_text(GOOD.replace("cpu_mhz = 240", "cpu_mhz = 241"))  # the stored form is the old text's
    with pytest.raises(BoardDefinitionError, match="cpu_mhz"):
        load_board(path)
    with pytest.raises(BoardDefinitionError, match="cpu_mhz"):  # a refusal is never stored
        load_board(path)
    stored = list((tmp_path / "cache" / "board-files").glob("*.json"))
    assert len(stored) == 1


def test_a_damaged_or_foreign_stored_board_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, GOOD)
    want = load_board(path)
    (entry,) = (tmp_path / "cache" / "board-files").glob("*.json")
    for damage in ("{not json", json.dumps({"sha256": "0" * 64, **json.loads(entry.read_text())}), "[]"):
        entry.write_text(damage)
        assert load_board(path) == want  # validated again (and stored again)
    doc = json.loads(entry.read_text())
    doc["psram_mb"] = 64  # a stored form that does not match the file's hash is another file's
    doc["sha256"] = "f" * 64
    entry.write_text(json.dumps(doc))
    assert load_board(path) == want


def test_a_bare_board_name_is_never_a_file_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--board NAME` is the built-in board even when the cwd holds a file called NAME (a script, a build
    output); an existing file whose name does not end in .toml is refused, saying so."""
    models = REPO / "tests" / "data" / "models"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "esp32c3-devkitm-1").write_text("#!/bin/sh\necho built\n", encoding="utf-8")
    _write(tmp_path, GOOD, name="my-board")  # a valid board file, but not named *.toml
    generate = ["generate", str(models / "op_zoo.tflite"), "--input", str(models / "inputs" / "op_zoo.npy")]
    assert main([*generate, "--board", "esp32c3-devkitm-1", "--out", "out", "--json"]) == 0
    assert {p["board"] for p in json.loads(capsys.readouterr().out)["projects"]} == {"esp32c3-devkitm-1"}
    for ref in ("my-board", "./my-board", str(tmp_path / "my-board")):
        assert main([*generate, "--board", ref, "--out", "out2"]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert f"{ref!r} is a file, but a board file's name must end in .toml" in err, err
