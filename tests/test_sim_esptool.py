"""Real esptool 5 (esptool.cmds) against the simulated board through a real pyserial URL (sim://).

Faked: only the board itself (harness.sim). esptool, its stub images, pyserial and the reset
sequences (esp_pylib.serial_reset, the same code esptool runs) are the real ones.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import classic_bootloader_reset, hard_reset, usb_jtag_bootloader_reset
from esptool import cmds
from esptool.util import FatalError
from sim_helpers import make_project, read_until_end

import harness.sim as sim
from harness.sim.board import SimBoard, remove_board
from harness.sim.chips import CHIPS
from harness.sim.image import build_sim_firmware

sim.register()


@pytest.fixture(scope="module")
def firmware(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> dict[str, list[tuple[int, Path]]]:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    out = {}
    for chip in ("esp32", "esp32s3", "esp32c3"):
        root = tmp_path_factory.mktemp(f"fw-{chip}")
        proj = make_project(root / "proj", models_dir / "op_zoo.tflite", [x], chip=chip, variant="optimized")
        out[chip] = build_sim_firmware(proj, root / "build")
    return out


@pytest.fixture
def open_port() -> Iterator:
    opened: list[tuple[serial.SerialBase, str]] = []

    def _open(chip: str = "esp32s3", reset: str = "classic", extra: str = "") -> serial.SerialBase:
        name = f"t-{uuid.uuid4().hex[:12]}"
        url = f"sim://{name}?chip={chip}&reset={reset}&emitter=c{extra}"
        port = serial.serial_for_url(url, exclusive=True)
        opened.append((port, name))
        return port

    yield _open
    for port, name in opened:
        port.close()
        remove_board(name)


def _board(port: serial.SerialBase) -> SimBoard:
    return port.board  # type: ignore[attr-defined, no-any-return]


def connect(port: serial.SerialBase, style: str = "classic", attempts: int = 3):
    """Reset into download mode with esp_pylib's sequence, then let esptool sync (no ioctl reset).

    Like esptool's own connect loop, a failed sync is retried with a fresh reset: IO0 is sampled
    20 ms after EN rises, and a thread descheduled between two line writes can miss that window.
    """
    for attempt in range(attempts):
        if style == "classic":
            classic_bootloader_reset(port, enter_boot_delay=0.05, reset_delay=0.05)
        else:
            usb_jtag_bootloader_reset(port, settle_delay=0.02)
        try:
            return cmds.detect_chip(port, 115200, "no-reset", connect_attempts=2)
        except FatalError:
            if attempt == attempts - 1:
                raise
            port.open()  # esptool closes the port when it gives up
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("chip", "name"), [("esp32", "ESP32"), ("esp32s3", "ESP32-S3"), ("esp32c3", "ESP32-C3")]
)
def test_detect_chip_and_efuses(open_port, chip: str, name: str) -> None:
    port = open_port(chip)
    esp = connect(port)
    assert name == esp.CHIP_NAME
    assert "revision v" in esp.get_chip_description()
    mac = ":".join(f"{b:02x}" for b in esp.read_mac())
    assert mac == _board(port).chip.mac(_board(port).name)
    assert esp.get_crystal_freq() == 40
    info = cmds._get_flash_info(esp)  # RDID through the SPI user-command registers
    assert info[2] == "4MB"


def test_esp32_rom_has_no_security_info(open_port) -> None:
    port = open_port("esp32")
    esp = connect(port)
    with pytest.raises(FatalError):
        esp.get_security_info(cache=False)
    port_s3 = open_port("esp32s3")
    esp_s3 = connect(port_s3)
    assert esp_s3.get_security_info(cache=False)["chip_id"] == 9


def test_default_reset_sequence_falls_back_to_classic(open_port) -> None:
    """esptool's own default-reset: its ioctl (tight) reset cannot run on sim://, the classic one works."""
    port = open_port("esp32s3")
    esp = cmds.detect_chip(port, 115200, "default-reset", connect_attempts=7)
    assert esp.CHIP_NAME == "ESP32-S3"
    assert _board(port).status()["mode"] == "rom"
    assert _board(port).download_sessions == 1


@pytest.mark.parametrize(
    ("chip", "stub", "compress", "baud"),
    [
        ("esp32", False, False, 115200),
        ("esp32", False, True, 460800),
        ("esp32s3", True, True, 921600),
        ("esp32s3", True, False, 115200),
        ("esp32c3", True, True, 460800),
    ],
)
def test_write_flash_verify_and_skip(
    open_port, firmware, chip: str, stub: bool, compress: bool, baud: int
) -> None:
    port = open_port(chip)
    esp = connect(port)
    if stub:
        esp = cmds.run_stub(esp)
        assert esp.IS_STUB and _board(port).status()["stub"]
    if baud != 115200:
        esp.change_baud(baud)
        assert _board(port).uart_baud == baud
    cmds.attach_flash(esp)
    files = firmware[chip]
    kw = {"compress": True} if compress else {"no_compress": True}
    cmds.write_flash(esp, [(o, str(p)) for o, p in files], skip_flashed=True, **kw)  # verifies MD5 itself
    board = _board(port)
    for off, path in files:
        data = path.read_bytes()
        assert bytes(board.flash[off : off + len(data)]) == data
        assert esp.flash_md5sum(off, len(data)) == hashlib.md5(data).hexdigest()
    first = board.flash_bytes_written
    # everything but the empty otadata image (all 0xFF: erased flash already holds it, skip_flashed skips it)
    assert first >= sum(p.stat().st_size for _, p in files if set(p.read_bytes()) != {0xFF})
    # second run: esptool's skip_flashed compares MD5s and writes nothing
    cmds.write_flash(esp, [(o, str(p)) for o, p in files], skip_flashed=True, **kw)
    assert board.flash_bytes_written == first
    # one changed byte in flash: skip_flashed notices and rewrites that file only
    off, path = files[-1]
    board.flash[off + 100] ^= 0xFF
    cmds.write_flash(esp, [(o, str(p)) for o, p in files], skip_flashed=True, **kw)
    assert board.flash_bytes_written > first
    assert bytes(board.flash[off : off + path.stat().st_size]) == path.read_bytes()


def test_stub_read_flash_and_erase_region(open_port, firmware) -> None:
    port = open_port("esp32s3")
    esp = cmds.run_stub(connect(port))
    _board(port).program(firmware["esp32s3"])
    off, path = firmware["esp32s3"][-1]
    data = path.read_bytes()
    assert esp.read_flash(off, 0x2000) == data[:0x2000]
    esp.erase_region(0x10000, 0x1000)
    assert bytes(_board(port).flash[0x10000:0x11000]) == b"\xff" * 0x1000


def test_wrong_baud_after_change_breaks_the_link(open_port) -> None:
    port = open_port("esp32s3")
    esp = cmds.run_stub(connect(port))
    esp.change_baud(460800)
    esp._set_port_baudrate(115200)  # host side forgets the change: the chip no longer understands us
    with pytest.raises(FatalError):
        esp.read_reg(0x40001000, timeout=0.3)


def test_classic_reset_selects_boot_mode(open_port, firmware) -> None:
    port = open_port("esp32")
    _board(port).program(firmware["esp32"])
    port.baudrate = 115200  # the ROM and this app's console both print at 115200
    port.timeout = 0.2
    classic_bootloader_reset(port, enter_boot_delay=0.05, reset_delay=0.05)
    rom = read_until_end(port, idle=0.3)
    assert b"rst:0x1 (POWERON_RESET),boot:0x3 (DOWNLOAD_BOOT" in rom and b"waiting for download" in rom
    assert b"@EC1" not in rom
    hard_reset(port, hold_delay=0.05)  # EN pulse with IO0 high: boot from flash
    app = read_until_end(port)
    assert b"ets Jun  8 2016 00:22:57" in app
    assert b"rst:0x1 (POWERON_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)" in app
    assert b"@EC1 0 BEGIN" in app and b" END status=ok" in app


def test_usb_serial_jtag_reset_and_vanishing_port(open_port, firmware) -> None:
    port = open_port("esp32s3", reset="usb_jtag")
    board = _board(port)
    esp = connect(port, style="usb")  # esp_pylib's USB-Serial-JTAG sequence
    assert esp.CHIP_NAME == "ESP32-S3"
    esp = cmds.run_stub(esp)
    cmds.attach_flash(esp)
    cmds.write_flash(esp, [(o, str(p)) for o, p in firmware["esp32s3"]], skip_flashed=True)
    esp.hard_reset()  # esptool's own hard reset: RTS pulse -> the chip boots the app
    with pytest.raises(serial.SerialException):
        port.read(1)  # the USB device left the bus
    port.close()
    port.open()  # ... and came back
    port.baudrate = 2000000  # USB-Serial-JTAG has no baud rate: any setting reads the same bytes
    out = read_until_end(port)
    assert b"rst:0x15 (USB_UART_CHIP_RESET),boot:0x8 (SPI_FAST_FLASH_BOOT)" in out
    assert b" END status=ok" in out
    assert board.boots == 1


def test_usb_download_reset_prints_usb_reason(open_port) -> None:
    port = open_port("esp32c3", reset="usb_jtag")
    port.timeout = 0.2  # port left at pyserial's 9600 baud: USB-Serial-JTAG has no baud rate
    usb_jtag_bootloader_reset(port, settle_delay=0.02)
    out = read_until_end(port, idle=0.3)
    assert b"ESP-ROM:esp32c3" in out
    assert b"rst:0x15 (USB_UART_CHIP_RESET),boot:0x0 (DOWNLOAD" in out and b"waiting for download" in out


def test_exclusive_open_refuses_second_user(open_port) -> None:
    port = open_port("esp32s3")
    with pytest.raises(serial.SerialException, match="busy"):
        serial.serial_for_url(port.port, exclusive=True)


def test_a_running_stub_answers_sync_eight_times_like_espressifs(open_port) -> None:
    """A host that cannot reset the chip (raw socket://, pty) re-connects to a stub that is still running:
    Espressif's stub answers one SYNC eight times with value 0, and esptool 5 reads all eight."""
    port = open_port("esp32s3")
    cmds.run_stub(connect(port))
    port.close()  # the host goes away; the chip keeps running the stub (nobody resets it)
    port.open()
    port.dtr = port.rts = False
    port.timeout = 0.5
    esp = cmds.detect_chip(port, 115200, "no-reset", connect_attempts=1)
    assert esp.CHIP_NAME == "ESP32-S3" and esp.sync_stub_detected
    # and the stub still works for the re-connected host
    assert cmds.run_stub(esp).IS_STUB and esp.read_reg(0x40001000) == 9


def test_stub_sync_reply_count() -> None:
    from harness.sim.chips import get_chip
    from harness.sim.loader import Loader, SlipDecoder, slip_encode

    class Host:
        def __init__(self) -> None:
            self.chip = get_chip("esp32s3")
            self.flash = bytearray(b"\xff" * 4096)
            self.flash_size = 4096
            self.uart_baud = 115200
            self.registers: dict[int, int] = {}
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

        def __getattr__(self, name: str):
            return lambda *a: None

    host = Host()
    loader = Loader(host)  # type: ignore[arg-type]
    loader.stub = True
    sync = b"\x00\x08\x24\x00\x00\x00\x00\x00" + b"\x07\x07\x12\x20" + b"\x55" * 32
    loader.feed(slip_encode(sync))
    frames = SlipDecoder().feed(b"".join(host.sent))
    assert len(frames) == 8
    assert all(f[:2] == b"\x01\x08" and f[4:8] == b"\0\0\0\0" for f in frames)  # value 0: the stub


def test_mem_data_beyond_the_declared_size_is_refused(open_port) -> None:
    """A client that sends more RAM data than its MEM_BEGIN declared gets the loader's error status (as
    Espressif's stub answers ESP_TOO_MUCH_DATA), and the simulated RAM does not grow; a MEM_BEGIN for
    more RAM than the chip has is refused too. esptool's own mem_begin/mem_block send the packets."""
    port = open_port("esp32s3")
    esp = connect(port)
    loader = _board(port)._loader
    assert loader is not None
    dram = 0x3FC90000
    esp.mem_begin(0x100, 1, 0x100, dram)
    esp.mem_block(b"\x01" * 0x100, 0)
    with pytest.raises(FatalError, match="write to target RAM"):
        esp.mem_block(b"\x02" * 0x100, 1)  # one block more than declared
    esp.mem_begin(0x100, 1, 0x100, dram)
    with pytest.raises(FatalError, match="write to target RAM"):
        esp.mem_block(b"\x03" * 0x200, 0)  # one block larger than the whole declared size
    assert bytes(loader.ram[dram]) == b""
    with pytest.raises(FatalError, match="enter RAM download mode"):
        esp.mem_begin(0xFFFFFF00, 1, 0x4000, dram)  # more than any chip's RAM
    assert esp.read_reg(0x40001000) == 9  # the loader still answers


def test_read_flash_with_a_hostile_block_size_stays_bounded(open_port) -> None:
    """esptool reads flash a sector (0x1000) a packet; a client asking for 1-byte packets gets them, but
    the simulator holds at most 16 bytes per byte read (it queued an object per packet: ~190 bytes per
    byte, 6 GB for a 32 MB flash); a block larger than the stub's one-sector buffer gets what Espressif's
    stub sends then: the OK reply and nothing more. The packets go over a sim:// port."""
    import struct
    import tracemalloc

    from harness.sim.loader import SlipDecoder, slip_encode

    port = open_port("esp32s3")
    cmds.run_stub(connect(port))
    board = _board(port)
    board.flash[0:0x20000] = bytes(range(256)) * 0x200
    port.timeout = 0.5

    def read_flash(length: int, block: int) -> list[bytes]:
        tracemalloc.start()
        port.write(slip_encode(struct.pack("<BBHIIIII", 0, 0xD2, 16, 0, 0, length, block, 64)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 * length + 0x10000, f"{peak} bytes held for a {length}-byte read"
        return SlipDecoder().feed(read_until_end(port))

    frames = read_flash(0x20000, 1)
    assert frames[0][:2] == b"\x01\xd2" and frames[0][-2:] == b"\0\0"  # the stub's OK
    assert len(frames) == 0x20000 + 2 and b"".join(frames[1:-1]) == bytes(board.flash[:0x20000])
    assert frames[-1] == hashlib.md5(bytes(board.flash[:0x20000])).digest()
    assert read_flash(0x2000, 0x2000)[1:] == []


def test_a_deflate_bomb_is_refused_without_inflating_it(open_port) -> None:
    """A FLASH_DEFL_DATA block that inflates far past what FLASH_DEFL_BEGIN declared is the stub's
    ESP_TOO_MUCH_DATA; the simulator stops inflating at the declared size instead of holding the whole
    output (16 MiB from one 16 KiB packet here). esptool sends the packets (one attempt at the block)."""
    import struct
    import tracemalloc
    import zlib

    port = open_port("esp32s3")
    esp = cmds.run_stub(connect(port))
    bomb = zlib.compress(b"\0" * (16 << 20), 9)
    esp.flash_defl_begin(0x1000, len(bomb), 0)
    tracemalloc.start()
    with pytest.raises(FatalError, match="write compressed data"):
        data = struct.pack("<IIII", len(bomb), 0, 0, 0) + bomb
        esp.check_command("write compressed data", esp.ESP_CMDS["FLASH_DEFL_DATA"], data, esp.checksum(bomb))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20, f"{peak} bytes held while refusing the block"


def test_a_failed_compressed_block_fails_the_rest_of_that_write(open_port) -> None:
    """After a FLASH_DEFL_DATA block has failed inside the inflater (here the stub's ESP_TOO_MUCH_DATA),
    Espressif's stub keeps that error (``fs.last_error``) for every later block and FLASH_DEFL_END of the
    write, so no client gets a good write out of it; a new FLASH_DEFL_BEGIN starts clean. esptool sends the
    packets; the stream is stored blocks (incompressible data), so the inflater itself never errs."""
    import os
    import struct
    import zlib

    port = open_port("esp32s3")
    esp = cmds.run_stub(connect(port))
    raw = os.urandom(0x2000)
    stream = zlib.compress(raw, 0)

    def block(data: bytes, seq: int) -> None:
        packet = struct.pack("<IIII", len(data), seq, 0, 0) + data
        op = esp.ESP_CMDS["FLASH_DEFL_DATA"]
        esp.check_command("write compressed data", op, packet, esp.checksum(data))

    esp.flash_defl_begin(0x1000, len(stream), 0x10000)
    with pytest.raises(FatalError, match="write compressed data"):
        block(stream, 0)  # inflates past the 0x1000 bytes declared
    with pytest.raises(FatalError, match="write compressed data"):
        block(stream[0x1100:0x1200], 0)  # more stored bytes: the inflater would take them
    with pytest.raises(FatalError, match="leave compressed flash mode"):
        esp.flash_defl_finish(False)
    assert bytes(_board(port).flash[0x10000:0x10100]) == b"\xff" * 0x100  # nothing of it was written
    esp.flash_defl_begin(len(raw), len(stream), 0x10000)  # a new write starts clean
    block(stream, 0)
    esp.flash_defl_finish(False)
    assert esp.flash_md5sum(0x10000, len(raw)) == hashlib.md5(raw).hexdigest()


@pytest.mark.parametrize(("chip", "sram_kib"), [("esp32", 520), ("esp32s3", 512), ("esp32c3", 400)])
def test_mem_begin_accepts_the_chips_own_sram_and_no_more(open_port, chip: str, sram_kib: int) -> None:
    """The RAM a MEM_BEGIN may declare is the chip's on-chip SRAM (harness.chips' ``sram_bytes``, from
    Espressif's datasheets), not the ESP32's 520 KiB for every chip. esptool sends the packets."""
    esp = connect(open_port(chip))
    dram = CHIPS[chip].dram_start
    esp.mem_begin(sram_kib * 1024, 1, 0x4000, dram)  # all of it: accepted
    with pytest.raises(FatalError, match="enter RAM download mode"):
        esp.mem_begin(sram_kib * 1024 + 1, 1, 0x4000, dram)
    assert CHIPS[chip].sram_bytes == sram_kib * 1024
