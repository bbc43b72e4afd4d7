"""The ESP serial bootloader protocol as the ROM and esptool's flasher stub speak it (simulated).

Frame layout, commands and when the stub "runs": docs/simulator.md "ROM loader protocol". Everything
is deterministic and runs synchronously in the writer's thread.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import esptool
from esptool.loader import ESPLoader

from harness.sim.chips import FLASH_SIZE_CODES, ChipSpec

SECTOR = ESPLoader.FLASH_SECTOR_SIZE

# ROM error codes (esptool's ESPLoader "status" byte 2 meanings)
ERR_INVALID_MSG = 0x05
ERR_FAILED = 0x06
ERR_INVALID_CRC = 0x07
ERR_FLASH_WRITE = 0x08
ERR_FLASH_READ = 0x09
ERR_FLASH_READ_LEN = 0x0A
ERR_DEFLATE = 0x0B
# stub error codes (esptool stub_flasher: 0xC0 + n)
STUB_ERR_BAD_DATA_LEN = 0xC0
STUB_ERR_BAD_DATA_CHECKSUM = 0xC1
STUB_ERR_INVALID_COMMAND = 0xC3
STUB_ERR_FAILED_SPI_OP = 0xC4
STUB_ERR_NOT_IN_FLASH_MODE = 0xC6
STUB_ERR_INFLATE = 0xC7
STUB_ERR_NOT_ENOUGH_DATA = 0xC8
STUB_ERR_TOO_MUCH_DATA = 0xC9

CMD = ESPLoader.ESP_CMDS  # command name -> opcode (esptool's own table)
STUB_ONLY = {CMD["ERASE_FLASH"], CMD["ERASE_REGION"], CMD["READ_FLASH"]}


def slip_encode(packet: bytes) -> bytes:
    return b"\xc0" + packet.replace(b"\xdb", b"\xdb\xdd").replace(b"\xc0", b"\xdb\xdc") + b"\xc0"


class SlipDecoder:
    """Incremental SLIP decoder: bytes outside frames are ignored, as the ROM ignores line noise."""

    def __init__(self) -> None:
        self._buf: bytearray | None = None
        self._esc = False

    def feed(self, data: bytes) -> list[bytes]:
        frames: list[bytes] = []
        for b in data:
            if self._buf is None:
                if b == 0xC0:
                    self._buf = bytearray()
                continue
            if self._esc:
                self._esc = False
                if b == 0xDC:
                    self._buf.append(0xC0)
                elif b == 0xDD:
                    self._buf.append(0xDB)
                else:
                    self._buf = None  # invalid escape: drop the frame
                continue
            if b == 0xDB:
                self._esc = True
            elif b == 0xC0:
                if self._buf:
                    frames.append(bytes(self._buf))
                    self._buf = None
                # an empty frame (c0 c0) is a frame boundary: keep waiting for data
                else:
                    self._buf = bytearray()
            else:
                self._buf.append(b)
                if len(self._buf) > 0x10000:  # bounded: hostile input never grows memory
                    self._buf = None
        return frames


@functools.lru_cache(maxsize=16)
def known_stubs(chip: str) -> tuple[tuple[int, bytes, int | None, bytes | None, int], ...]:
    """esptool's flasher stub images for ``chip``: (text_start, text, data_start, data, entry)."""
    root = Path(esptool.__file__).parent / "targets" / "stub_flasher"
    out = []
    for sub in sorted(root.iterdir()) if root.is_dir() else []:
        path = sub / f"{chip}.json"
        if not path.is_file():
            continue
        stub = json.loads(path.read_text())
        data = base64.b64decode(stub["data"]) if "data" in stub else None
        text = base64.b64decode(stub["text"])
        out.append((int(stub["text_start"]), text, stub.get("data_start"), data, int(stub["entry"])))
    return tuple(out)


@dataclass
class _WriteSession:
    offset: int
    size: int  # bytes to write (stub: uncompressed size; ROM: erase size)
    block_size: int
    compressed: bool
    stub: bool
    seq: int = 0
    written: int = 0
    inflater: zlib._Decompress | None = None
    erased: set[int] = field(default_factory=set)
    failed: tuple[int, int] | None = None  # (ROM, stub) error of a block that reached the inflater/flash


class LoaderHost(Protocol):
    """What the loader needs from the board (implemented by SimBoard)."""

    chip: ChipSpec
    flash: bytearray
    flash_size: int
    uart_baud: int
    registers: dict[int, int]

    def send(self, data: bytes) -> None: ...
    def set_uart_baud(self, baud: int) -> None: ...
    def restart(self, download: bool) -> None: ...  # a software reset, into the ROM loader or the app
    def flash_changed(self) -> None: ...
    def persist(self) -> None: ...


class Loader:
    """One download-mode session (from the ROM's 'waiting for download' to the next reset)."""

    def __init__(
        self, host: LoaderHost, *, ignore_sync: bool = False, log: Callable[[str], None] | None = None
    ):
        self.host = host
        self.stub = False
        self.synced = False
        self.ignore_sync = ignore_sync
        self.decoder = SlipDecoder()
        self.ram: dict[int, bytearray] = {}
        self._mem: tuple[int, int] | None = None  # offset, declared size
        self._mem_seq = 0
        self._write: _WriteSession | None = None
        self._log = log or (lambda _m: None)
        self.flash_bytes_written = 0

    # ---- framing -------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            self._handle(frame)

    def _respond(self, op: int, val: int = 0, data: bytes = b"", status: int = 0, error: int = 0) -> None:
        tail = bytes((status, error)) if self.stub else bytes((status, error, 0, 0))
        body = data + tail
        self.host.send(slip_encode(struct.pack("<BBHI", 1, op, len(body), val) + body))

    def _fail(self, op: int, rom_err: int, stub_err: int) -> None:
        self._respond(op, status=1, error=stub_err if self.stub else rom_err)

    # ---- dispatch ------------------------------------------------------------------------------

    def _handle(self, frame: bytes) -> None:
        if len(frame) < 8 or frame[0] != 0x00:
            return  # read-flash ACKs and garbage: no reply
        _, op, length, chk = struct.unpack_from("<BBHI", frame)
        data = frame[8:]
        if len(data) != length:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_BAD_DATA_LEN)
            return
        if op == CMD["SYNC"]:
            self._sync(data)
            return
        if not self.synced and not self.stub:
            return  # the ROM answers nothing before it has auto-bauded on a SYNC
        handler, size = self._handlers().get(op, (None, None))
        no_security_info = op == CMD["GET_SECURITY_INFO"] and not self.host.chip.rom.SECURITY_INFO_SUPPORTED
        if handler is None or (op in STUB_ONLY and not self.stub) or no_security_info:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_INVALID_COMMAND)
            return
        if size is not None and len(data) != size:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_BAD_DATA_LEN)
            return
        handler(op, data, chk)

    def _handlers(self) -> dict[int, tuple[Callable[[int, bytes, int], None], int | None]]:
        """op -> (handler, the one payload size the command takes: any other is an invalid message)."""
        return {
            CMD["READ_REG"]: (self._read_reg, 4),
            CMD["WRITE_REG"]: (self._write_reg, None),
            CMD["MEM_BEGIN"]: (self._mem_begin, 16),
            CMD["MEM_DATA"]: (self._mem_data, None),
            CMD["MEM_END"]: (self._mem_end, 8),
            CMD["FLASH_BEGIN"]: (self._flash_begin, None),
            CMD["FLASH_DATA"]: (self._flash_data, None),
            CMD["FLASH_END"]: (self._flash_end, 4),
            CMD["FLASH_DEFL_BEGIN"]: (self._flash_begin, None),
            CMD["FLASH_DEFL_DATA"]: (self._flash_data, None),
            CMD["FLASH_DEFL_END"]: (self._flash_end, 4),
            CMD["SPI_SET_PARAMS"]: (self._ok, None),
            CMD["SPI_ATTACH"]: (self._ok, None),
            CMD["CHANGE_BAUDRATE"]: (self._change_baud, 8),
            CMD["SPI_FLASH_MD5"]: (self._md5, 16),
            CMD["GET_SECURITY_INFO"]: (self._security_info, None),
            CMD["ERASE_FLASH"]: (self._erase_flash, None),
            CMD["ERASE_REGION"]: (self._erase_region, 8),
            CMD["READ_FLASH"]: (self._read_flash, 16),
            CMD["READ_FLASH_SLOW"]: (self._read_flash_slow, None),
        }

    # ---- commands ------------------------------------------------------------------------------

    def _sync(self, data: bytes) -> None:
        if data != b"\x07\x07\x12\x20" + b"\x55" * 32:
            return
        if self.ignore_sync and not self.stub:
            self._log("sync ignored (fault sync_fail)")
            return
        self.synced = True
        # The ROM answers one SYNC packet eight times and esptool reads all eight. Espressif's stub does
        # the same (value 0, so esptool knows the stub is still running) so that a host which could not
        # reset the chip can re-sync with a running stub.
        value = 0 if self.stub else 0x20120707
        for _ in range(8):
            self._respond(CMD["SYNC"], value)

    def _ok(self, op: int, data: bytes, chk: int) -> None:
        self._respond(op)

    def _read_reg(self, op: int, data: bytes, chk: int) -> None:
        (addr,) = struct.unpack("<I", data)
        rom = self.host.chip.rom
        value = self.host.registers.get(addr, 0)
        if addr == rom.UART_CLKDIV_REG:
            value = round(40_000_000 * rom.XTAL_CLK_DIVIDER / max(1, self.host.uart_baud)) & 0xFFFFF
        self._respond(op, value)

    def _write_reg(self, op: int, data: bytes, chk: int) -> None:
        if len(data) % 16:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_BAD_DATA_LEN)
            return
        for i in range(0, len(data), 16):
            addr, value, mask, _delay = struct.unpack_from("<IIII", data, i)
            old = self.host.registers.get(addr, 0)
            self.host.registers[addr] = (old & ~mask) | (value & mask)
            self._spi_hook(addr)
        self._respond(op)

    def _spi_hook(self, addr: int) -> None:
        """Run a SPI flash 'user command' (esptool's run_spiflash_command) when SPI_CMD_USR is set."""
        chip = self.host.chip
        regs = self.host.registers
        if addr != chip.rom.SPI_REG_BASE or not regs.get(addr, 0) & (1 << 18):
            return
        command = regs.get(chip.rom.SPI_REG_BASE + chip.rom.SPI_USR2_OFFS, 0) & 0xFF
        w0 = chip.rom.SPI_REG_BASE + chip.rom.SPI_W0_OFFS
        if command == 0x9F:  # RDID: manufacturer, type, capacity
            code = FLASH_SIZE_CODES.get(self.host.flash_size, 0x16)
            regs[w0] = (code << 16) | (0x40 << 8) | 0xEF
        elif command in (0x05, 0x35, 0x15):  # RDSR*: not busy, no protection
            regs[w0] = 0
        regs[addr] = regs[addr] & ~(1 << 18)  # command done

    def _mem_begin(self, op: int, data: bytes, chk: int) -> None:
        size, _blocks, _block_size, offset = struct.unpack("<IIII", data)
        self._mem, self._mem_seq = None, 0
        self.ram[offset] = bytearray()
        if size + sum(map(len, self.ram.values())) > self.host.chip.sram_bytes:  # the chip's SRAM
            self._fail(op, ERR_FAILED, STUB_ERR_TOO_MUCH_DATA)
            return
        self._mem = (offset, size)
        self._respond(op)

    def _data_block(self, op: int, data: bytes, chk: int, want_seq: int) -> bytes | None:
        """The payload of a MEM_DATA/FLASH_DATA packet, or None after answering its error as the ROM does."""
        n, seq, _, _ = struct.unpack_from("<IIII", data)
        block = data[16:]
        if len(block) != n:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_BAD_DATA_LEN)
            return None
        if ESPLoader.checksum(block) != chk & 0xFF:
            self._fail(op, ERR_INVALID_CRC, STUB_ERR_BAD_DATA_CHECKSUM)
            return None
        if seq != want_seq:
            self._fail(op, ERR_FAILED, STUB_ERR_BAD_DATA_LEN)
            return None
        return block

    def _mem_data(self, op: int, data: bytes, chk: int) -> None:
        if self._mem is None or len(data) < 16:
            self._fail(op, ERR_FAILED, STUB_ERR_NOT_IN_FLASH_MODE)
            return
        block = self._data_block(op, data, chk, self._mem_seq)
        offset, size = self._mem
        if block is None:
            return
        if len(self.ram[offset]) + len(block) > size:  # as Espressif's stub: never past the declared size
            self._fail(op, ERR_FAILED, STUB_ERR_TOO_MUCH_DATA)
            return
        self._mem_seq += 1
        self.ram[offset] += block
        self._respond(op)

    def _mem_end(self, op: int, data: bytes, chk: int) -> None:
        no_entry, entry = struct.unpack("<II", data)
        self._respond(op)
        if no_entry or self.stub:
            return
        for text_start, text, data_start, sdata, sentry in known_stubs(self.host.chip.name):
            if sentry != entry or bytes(self.ram.get(text_start, b"")) != text:
                continue
            if sdata is not None and bytes(self.ram.get(int(data_start or 0), b""))[: len(sdata)] != sdata:
                continue
            self.stub = True
            self._write = None
            self.host.send(slip_encode(b"OHAI"))
            self._log("flasher stub running")
            return
        # Unknown code: the simulated CPU cannot run it; like a real chip running garbage, go silent.
        self._log(f"MEM_END jump to 0x{entry:08x}: not esptool's stub, the simulated CPU halts")
        self.synced = False
        self.ignore_sync = True

    def _flash_begin(self, op: int, data: bytes, chk: int) -> None:
        compressed = op == CMD["FLASH_DEFL_BEGIN"]
        rom_esp32 = not self.stub and self.host.chip.name == "esp32"
        if len(data) not in ((16,) if rom_esp32 else (16, 20)):
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_BAD_DATA_LEN)
            return
        size, _blocks, block_size, offset = struct.unpack_from("<IIII", data)
        end = offset + (size if not compressed or self.stub else 0)
        if end > self.host.flash_size or offset >= self.host.flash_size:
            self._fail(op, ERR_FLASH_WRITE, STUB_ERR_FAILED_SPI_OP)
            return
        sess = _WriteSession(offset, size, block_size, compressed, self.stub)
        if compressed:
            sess.inflater = zlib.decompressobj()
        if not self.stub and size:
            # the ROM erases the whole range up front (sector granularity)
            start = offset - offset % SECTOR
            end = min(self.host.flash_size, -(-(offset + size) // SECTOR) * SECTOR)
            self.host.flash[start:end] = b"\xff" * (end - start)
            sess.erased.update(range(start, end, SECTOR))
            self.host.flash_changed()
        self._write = sess
        self._respond(op)

    def _program(self, sess: _WriteSession, addr: int, payload: bytes) -> bool:
        end = addr + len(payload)
        if end > self.host.flash_size:
            return False
        if sess.stub:  # the stub erases each sector when it first writes into it
            for sec in range(addr - addr % SECTOR, end, SECTOR):
                if sec not in sess.erased:
                    self.host.flash[sec : sec + SECTOR] = b"\xff" * SECTOR
                    sess.erased.add(sec)
        # NOR flash programming can only clear bits
        old = self.host.flash[addr:end]
        self.host.flash[addr:end] = bytes(a & b for a, b in zip(old, payload, strict=True))
        self.flash_bytes_written += len(payload)
        self.host.flash_changed()
        return True

    def _flash_data(self, op: int, data: bytes, chk: int) -> None:
        sess = self._write
        if sess is None or sess.compressed != (op == CMD["FLASH_DEFL_DATA"]) or len(data) < 16:
            self._fail(op, ERR_FAILED, STUB_ERR_NOT_IN_FLASH_MODE)
            return
        block = self._data_block(op, data, chk, sess.seq)
        if block is None:  # refused before it reached the inflater: a retry of the block may pass
            return
        if sess.failed is not None:  # the inflater's / flash's state is broken: the whole write fails
            self._fail(op, *sess.failed)
            return
        if sess.compressed:
            assert sess.inflater is not None
            addr = sess.offset + sess.written
            # one byte past what may still be written is enough to refuse the block: never inflate more
            room = (sess.size if sess.stub else self.host.flash_size - sess.offset) - sess.written
            try:
                payload = sess.inflater.decompress(block, max(0, room) + 1)
            except zlib.error:
                self._fail_write(sess, op, ERR_DEFLATE, STUB_ERR_INFLATE)
                return
        else:
            payload = block
            addr = sess.offset + sess.seq * sess.block_size
            if sess.stub:
                payload = payload[: max(0, sess.size - sess.written)]
        if sess.stub and sess.compressed and sess.written + len(payload) > sess.size:
            self._fail_write(sess, op, ERR_FAILED, STUB_ERR_TOO_MUCH_DATA)
            return
        if not self._program(sess, addr, payload):
            self._fail_write(sess, op, ERR_FLASH_WRITE, STUB_ERR_FAILED_SPI_OP)
            return
        sess.seq += 1
        sess.written += len(payload)
        self._respond(op)

    def _fail_write(self, sess: _WriteSession, op: int, rom_err: int, stub_err: int) -> None:
        """A block failed after it reached the inflater or the flash: as Espressif's stub keeps its
        ``last_error``, every later block and the END of this write fail with it."""
        sess.failed = (rom_err, stub_err)
        self._fail(op, rom_err, stub_err)

    def _flash_end(self, op: int, data: bytes, chk: int) -> None:
        (stay,) = struct.unpack("<I", data)
        sess, self._write = self._write, None
        if sess is not None and sess.failed is not None:
            self._fail(op, *sess.failed)
            return
        if self.stub and sess is not None and sess.size and sess.written < sess.size and sess.compressed:
            self._fail(op, ERR_FAILED, STUB_ERR_NOT_ENOUGH_DATA)
            return
        self.host.persist()  # a finished write session is on "flash" (the board's file) before the reply
        self._respond(op)
        # the stub: back to the ROM loader unless told to stay; the ROM: run the app (whether told to
        # "leave download mode and run the app" or to reboot)
        if not (self.stub and stay):
            self.host.restart(download=self.stub)

    def _change_baud(self, op: int, data: bytes, chk: int) -> None:
        new, _old = struct.unpack("<II", data)
        if new < 300 or new > 5_000_000:
            self._fail(op, ERR_FAILED, STUB_ERR_FAILED_SPI_OP)
            return
        self._respond(op)  # sent at the old rate
        self.host.set_uart_baud(new)

    def _md5(self, op: int, data: bytes, chk: int) -> None:
        addr, size, _, _ = struct.unpack("<IIII", data)
        if addr + size > self.host.flash_size:
            self._fail(op, ERR_FLASH_READ, STUB_ERR_FAILED_SPI_OP)
            return
        digest = hashlib.md5(self.host.flash[addr : addr + size], usedforsecurity=False)
        self._respond(op, 0, digest.digest() if self.stub else digest.hexdigest().encode())

    def _security_info(self, op: int, data: bytes, chk: int) -> None:
        chip = self.host.chip
        payload = struct.pack("<IBBBBBBBBII", 0, 0, 0, 0, 0, 0, 0, 0, 0, chip.image_chip_id, 0)
        self._respond(op, 0, payload)

    def _erase_flash(self, op: int, data: bytes, chk: int) -> None:
        self.host.flash[:] = b"\xff" * self.host.flash_size
        self.host.flash_changed()
        self._respond(op)

    def _erase_region(self, op: int, data: bytes, chk: int) -> None:
        offset, size = struct.unpack("<II", data)
        if offset % SECTOR or size % SECTOR or offset + size > self.host.flash_size:
            self._fail(op, ERR_FAILED, STUB_ERR_FAILED_SPI_OP)
            return
        self.host.flash[offset : offset + size] = b"\xff" * size
        self.host.flash_changed()
        self._respond(op)

    def _read_flash(self, op: int, data: bytes, chk: int) -> None:
        offset, length, block, _inflight = struct.unpack("<IIII", data)
        if offset + length > self.host.flash_size or block == 0:
            self._fail(op, ERR_FLASH_READ, STUB_ERR_FAILED_SPI_OP)
            return
        self._respond(op)
        if block > SECTOR:
            return  # the stub reads into a one-sector buffer: it sends nothing more for a larger block
        blob = bytes(self.host.flash[offset : offset + length])
        # The real stub waits for ACKs to keep <inflight> packets in flight; the host's ACKs arrive as
        # short frames that the decoder ignores, so sending everything at once (one send: a few bytes per
        # byte read even for a hostile 1-byte block) is equivalent here.
        packets = bytearray()
        for i in range(0, length, block):
            packets += slip_encode(blob[i : i + block])
        packets += slip_encode(hashlib.md5(blob, usedforsecurity=False).digest())
        self.host.send(bytes(packets))

    def _read_flash_slow(self, op: int, data: bytes, chk: int) -> None:
        if self.stub or len(data) != 8:
            self._fail(op, ERR_INVALID_MSG, STUB_ERR_INVALID_COMMAND)
            return
        offset, length = struct.unpack("<II", data)
        if length > 64 or offset + length > self.host.flash_size:
            self._fail(op, ERR_FLASH_READ_LEN, STUB_ERR_FAILED_SPI_OP)
            return
        self._respond(op, 0, bytes(self.host.flash[offset : offset + length]).ljust(64, b"\xff"))
