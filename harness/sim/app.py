"""What the simulated chip prints when it boots from flash: ROM lines, second-stage bootloader, the
IDF app start-up log, and the esp-check app itself (the protocol stream of docs/protocol.md, printed
through ``harness.protocol.emitter`` so it cannot drift from the firmware's C emitter), plus injected faults.

The result is a list of :class:`Piece` (bytes at the ROM's 115200 baud, bytes at the console baud,
or a link event); the board schedules them on its serial line.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.sim.chips import ChipSpec
from harness.sim.elf import chain as elf_chain
from harness.sim.faults import FaultSpec, flip_bits
from harness.sim.image import (
    PARTITION_TABLE_MAX,
    PROJECT_NAME,
    AppPayload,
    ImageError,
    LoadedImage,
    PartitionTableError,
    app_elf_sha256,
    bootloader_max_bytes,
    bootloader_table_offset,
    find_payload,
    header_flash_bytes,
    load_image,
    parse_partition_table,
    type_names,
)

ROM_BAUD = 115200
SIM_BANNER = "esp-check SIMULATED BOARD"


# When output starts after the reset is released (seconds): the ROM prints its banner at once and its
# load lines while it reads the bootloader; the later pieces start at their ESP-IDF log timestamps.
ROM_LOAD_S = 0.005
REBOOT_S = 0.02  # from "Rebooting..." to the next ROM banner


@dataclass(frozen=True)
class Piece:
    """One stretch of output: ``kind`` is "rom" (115200 baud), "console" (app baud) or "disconnect";
    ``at``: seconds after the reset was released when its first byte is on the wire."""

    kind: str
    data: bytes = b""
    at: float = 0.0


@dataclass
class BootResult:
    pieces: list[Piece]
    console_baud: int = ROM_BAUD
    variant: str | None = None
    faults_applied: list[str] = field(default_factory=list)


# ---- ROM text -----------------------------------------------------------------------------------

_RESET_REASONS = {
    "poweron": ("0x1 (POWERON_RESET)", "0x1 (POWERON)"),
    "sw": ("0xc (SW_CPU_RESET)", "0xc (RTC_SW_CPU_RST)"),
    "brownout": ("0xf (RTCWDT_BROWN_OUT_RESET)", "0xf (BROWNOUT_RST)"),
    "rtcwdt": ("0x10 (RTCWDT_RTC_RESET)", "0x10 (RTCWDT_RTC_RST)"),
    "usb": ("0x15 (USB_UART_CHIP_RESET)", "0x15 (USB_UART_CHIP_RESET)"),
}
_BOOT_MODES = {
    "esp32": ("0x13 (SPI_FAST_FLASH_BOOT)", "0x3 (DOWNLOAD_BOOT(UART0/UART1/SDIO_REI_REO_V2))"),
    "esp32s3": ("0x8 (SPI_FAST_FLASH_BOOT)", "0x0 (DOWNLOAD(USB/UART0))"),
    "esp32c3": ("0xc (SPI_FAST_FLASH_BOOT)", "0x0 (DOWNLOAD(USB/UART0/1))"),
}


def rom_header(chip: ChipSpec, reason: str, download: bool) -> bytes:
    """First ROM lines after a reset, e.g. ``ets Jun  8 2016 ...`` / ``rst:0x1 (POWERON_RESET),boot:...``."""
    rst = _RESET_REASONS[reason][0 if chip.name == "esp32" else 1]
    boot = _BOOT_MODES[chip.name][1 if download else 0]
    lines = list(chip.rom_banner)
    if chip.name == "esp32":
        lines.append("")
    lines.append(f"rst:{rst},boot:{boot}")
    if download:
        if chip.name != "esp32":
            lines.append("Saved PC:0x40048036" if chip.name == "esp32s3" else "Saved PC:0x40048b82")
        lines.append("waiting for download")
    return ("\r\n".join(lines) + "\r\n").encode()


def _rom_load_lines(chip: ChipSpec, boot: LoadedImage) -> bytes:
    if chip.name == "esp32":
        out = [
            "configsip: 0, SPIWP:0xee",
            "clk_drv:0x00,q_drv:0x00,d_drv:0x00,cs0_drv:0x00,hd_drv:0x00,wp_drv:0x00",
            "mode:DIO, clock div:2",
        ]
        out += [f"load:0x{a:08x},len:{len(d)}" for a, d in boot.segments]
    else:
        out = ["SPIWP:0xee", "mode:DIO, clock div:1"]
        out += [f"load:0x{a:08x},len:0x{len(d):x}" for a, d in boot.segments]
    out.append(f"entry 0x{boot.image.entrypoint:08x}")
    return ("\r\n".join(out) + "\r\n").encode()


class _Clock:
    """ESP-IDF log timestamps (ms since boot), deterministic."""

    def __init__(self, start: int = 27) -> None:
        self.ms = start

    @property
    def seconds(self) -> float:
        """Now, on the boot's clock: when the next piece starts."""
        return self.ms / 1000.0

    def line(self, level: str, tag: str, msg: str, step: int = 3) -> bytes:
        self.ms += step
        return f"{level} ({self.ms}) {tag}: {msg}\r\n".encode()


# ---- the reference ("the model running on the simulated CPU") ----------------------------------


@dataclass(frozen=True)
class _Outputs:
    arrays: list[list[np.ndarray]]  # per input: per output
    backend_version: str
    arena_used: int
    n_ops: int
    layers: list[dict[int, np.ndarray]] | None = None  # per input: op output tensor index -> array


def _run_model(payload: AppPayload, cache: dict[str, Any], per_layer: bool = False) -> _Outputs:
    """Run the embedded model on the embedded inputs with the host TFLM reference (cached per image)."""
    from harness.model.loader import parse_model_bytes
    from harness.model.reference import host_arena_bytes, run_reference

    key = hashlib.sha256(payload.model + b"".join(payload.inputs)).hexdigest() + f":{per_layer}"
    hit = cache.get(key)
    if isinstance(hit, _Outputs):
        return hit
    info = parse_model_bytes(payload.model)
    tin = info.inputs[0]
    arrays = [np.frombuffer(raw, dtype=np.dtype(tin.dtype)).reshape(tin.shape) for raw in payload.inputs]
    res = run_reference(payload.model, [[a] for a in arrays], per_layer=per_layer)
    try:
        used = int(host_arena_bytes(info))
    except Exception:  # an estimate only; never fail the boot over it
        used = 0
    layers = [{lt.tensor_index: lt.array for lt in r.layers or []} for r in res.runs] if per_layer else None
    out = _Outputs([list(r.outputs) for r in res.runs], res.backend_version, used, len(info.ops), layers)
    cache[key] = out
    return out


# ---- panics -------------------------------------------------------------------------------------


def _hex(rng: random.Random, base: int, span: int = 0x40000) -> int:
    return (base + rng.randrange(0, span)) & ~0x3


def _stack_ptr(chip: ChipSpec, rng: random.Random) -> int:
    """A task stack address in the chip's data RAM."""
    return _hex(rng, chip.dram_start + 0x10000, 0x20000)


def elf_sha256(chip: ChipSpec, app: LoadedImage) -> str:
    """The app's "ELF file SHA256", as ESP-IDF prints it: the ``app_elf_sha256`` of the image's app
    description (the SHA-256 of the ELF file the sim builder wrote beside the image).

    An image without one (packed without an ELF) gets a hash derived from its segments and the chip:
    still fixed per image and per chip, never random per boot.
    """
    stored = app_elf_sha256(chip, app)
    if stored is not None:
        return stored
    h = hashlib.sha256(chip.name.encode())
    for addr, data in app.segments:
        h.update(addr.to_bytes(4, "little") + data)
    return h.hexdigest()


# ESP-IDF v5 prints CONFIG_APP_RETRIEVE_LEN_ELF_SHA (default 9) characters of it, at boot and on a panic
ELF_SHA_PRINTED = 9

# what a crash prints before its register dump / backtrace, per ``kind``
_HEADLINES = {
    "panic": "Guru Meditation Error: Core  0 panic'ed ({cause}). Exception was unhandled.",
    "abort": "abort() was called at PC 0x{pc:08x} on core 0",
    "startup": "assert failed: esp_startup_start_app app_startup.c:83 (res == pdTRUE)",
    # esp_flash_init_default_chip() failed in the start-up's core init (ESP-IDF 5.x)
    "flash_size": "assert failed: do_core_init startup.c:328 (flash_ret == ESP_OK)",
}


# the call chain a crash report shows, innermost first (harness.sim.elf.CHAINS)
_CHAINS = {
    "panic": ("invoke",),
    "abort": ("abort", "invoke"),
    "startup": ("assert", "startup"),
    "flash_size": ("assert", "flash_size"),
}


def panic_text(
    chip: ChipSpec, kind: str, rng: random.Random, elf_sha: str = "0" * 64, variant: str = "ansi"
) -> bytes:
    """A crash report in the chip's own form: ``kind`` "panic" (Guru Meditation), "abort" (abort()),
    "startup" (an assert before app_main, e.g. no RAM left for the main task's stack) or "flash_size"
    (the start-up's flash probe failed).

    Code addresses are functions of the app's ELF (harness.sim.elf: the variant's ESP-NN kernel, TFLM,
    the firmware, ESP-IDF's panic path), so a decoder given that ELF names them; stacks come from the
    chip's data RAM (an S3 crashes at 0x420xxxxx with stacks at 0x3fcxxxxx, never at the classic ESP32's
    0x400dxxxx / 0x3ffbxxxx). Xtensa prints registers and a ``Backtrace:``, RISC-V prints
    MEPC/MCAUSE/MTVAL and ``Stack memory:`` and no backtrace line.
    """
    frames = [a for part in _CHAINS[kind] for a in elf_chain(chip, part, variant, rng)]
    caller = frames[0] if kind == "panic" else frames[3]  # abort(): the PC that called it
    cause = "LoadProhibited" if chip.arch == "xtensa" else "Load access fault"
    lines = [_HEADLINES[kind].format(pc=caller, cause=cause), ""]
    if chip.arch == "xtensa":
        lines += _xtensa_report(chip, kind, frames, rng)
    else:
        lines += _riscv_report(chip, kind, frames, rng)
    lines += ["", "", f"ELF file SHA256: {elf_sha[:ELF_SHA_PRINTED]}", "", "Rebooting...", ""]
    return "\r\n".join(lines).encode()


def _dump_rows(regs: list[tuple[str, int]]) -> list[str]:
    return ["".join(f"{n:<8}: 0x{v:08x}  " for n, v in regs[j : j + 4]) for j in range(0, len(regs), 4)]


def _xtensa_report(chip: ChipSpec, kind: str, frames: list[int], rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    lines: list[str] = []
    if kind == "panic":
        ret = (frames[1] & 0x3FFFFFFF) | 0x80000000  # A0: the return address, window bits on top
        regs = [("PC", frames[0]), ("PS", 0x00060030), ("A0", ret), ("A1", sp)]
        regs += [(f"A{i}", rng.getrandbits(32)) for i in range(2, 16)]
        regs += [("SAR", 0x1D), ("EXCCAUSE", 0x1C), ("EXCVADDR", 0), ("LBEG", 0x4000C2E0),
                 ("LEND", 0x4000C2F6), ("LCOUNT", 0)]  # fmt: skip
        lines += ["Core  0 register dump:", *_dump_rows(regs), ""]
        sps = [sp + 0x20 * k for k in range(len(frames))]
    else:  # panic_abort, esp_system_abort, abort()/__assert_func run from IRAM, below the caller's frame
        sps = [sp - 0x60 + 0x20 * k for k in range(len(frames))]
    pairs = zip(frames, sps, strict=True)
    lines += ["", "Backtrace: " + " ".join(f"0x{a:08x}:0x{b:08x}" for a, b in pairs), ""]
    return lines


def _riscv_report(chip: ChipSpec, kind: str, frames: list[int], rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    # MEPC: where it stopped (an abort stops in panic_abort, in IRAM); RA: the return address
    regs = [("MEPC", frames[0]), ("RA", frames[1]), ("SP", sp), ("GP", chip.dram_start + 0xB400)]
    names = (
        "TP",
        "T0",
        "T1",
        "T2",
        "S0/FP",
        "S1",
        "A0",
        "A1",
        "A2",
        "A3",
        "A4",
        "A5",
        "A6",
        "A7",
        "S2",
        "S3",
    )
    regs += [(n, rng.getrandbits(32)) for n in names]
    regs += [
        ("MSTATUS", 0x00001881),
        ("MTVEC", chip.iram_start + 0x4001),
        ("MCAUSE", 0x00000005 if kind == "panic" else 0x00000003),
        ("MTVAL", 0 if kind == "panic" else 0x00009002),
        ("MHARTID", 0),
    ]
    lines = ["Core  0 register dump:", *_dump_rows(regs), "", "Stack memory:"]
    for row in range(8):
        lines.append(f"{sp + row * 32:08x}: " + " ".join(f"0x{rng.getrandbits(32):08x}" for _ in range(8)))
    return lines


# ---- boot ---------------------------------------------------------------------------------------


@dataclass
class BootContext:
    """Everything one boot needs from the board."""

    chip: ChipSpec
    flash: bytes
    reason: str  # key of _RESET_REASONS
    faults: FaultSpec
    boot_index: int
    emitter_backend: str
    cache: dict[str, Any]
    log: Callable[[str], None] = lambda _m: None


def boot_from_flash(ctx: BootContext) -> BootResult:
    """Everything the chip prints from reset release (IO0 high) until it idles, halts or loops."""
    faults = ctx.faults
    loops = max(1, faults.loops)
    reason = ctx.reason
    result = BootResult([])
    base = 0.0  # when this boot's reset was released, after the first one
    for n in range(loops):
        one = _boot_once(ctx, reason, n)
        result.pieces += [replace(p, at=base + p.at) for p in one.pieces]
        base += max(p.at for p in one.pieces) + REBOOT_S
        result.console_baud = one.console_baud if n == 0 else result.console_baud
        result.variant = one.variant
        result.faults_applied = one.faults_applied
        if one.reboot_reason is None:
            break
        reason = one.reboot_reason
    return result


@dataclass
class _Once:
    pieces: list[Piece]
    console_baud: int = ROM_BAUD
    variant: str | None = None
    faults_applied: list[str] = field(default_factory=list)
    reboot_reason: str | None = None


def _invalid(chip: ChipSpec, reason: str, msg: str) -> _Once:
    head = rom_header(chip, reason, False)
    return _Once([Piece("rom", head + f"{msg}\r\n".encode())], reboot_reason=None)


def _boot_once(ctx: BootContext, reason: str, n: int) -> _Once:
    chip = ctx.chip
    flash = ctx.flash
    pieces: list[Piece] = [Piece("rom", rom_header(chip, reason, False))]
    try:
        boot = load_image(chip, flash, chip.bootloader_offset, bootloader_max_bytes(chip))
    except ImageError as exc:
        # the ROM retries forever; three rounds are enough evidence of the loop
        text = b"".join(rom_header(chip, "rtcwdt", False) + f"{exc}\r\n".encode() for _ in range(2))
        return _Once([Piece("rom", pieces[0].data + f"{exc}\r\n".encode() + text)])
    pieces.append(Piece("rom", _rom_load_lines(chip, boot), ROM_LOAD_S))
    header_flash = header_flash_bytes(boot.image)  # the bootloader sets the flash size from its header

    # second-stage bootloader (console baud is only known from the app image; it logs at 115200 here)
    clock = _Clock()
    t_bl = clock.seconds
    bl: list[bytes] = [
        clock.line("I", "boot", "ESP-IDF sim 2nd stage bootloader"),
        clock.line("I", "boot", "compile time Jan  1 2026 00:00:00"),
        clock.line("I", "boot", f"{'Multicore' if chip.cores > 1 else 'Single core'} bootloader"),
        clock.line("I", "boot", f"chip revision: v{chip.rev}"),
        clock.line("I", f"boot.{chip.name}", "SPI Speed      : 80MHz"),
        clock.line("I", f"boot.{chip.name}", "SPI Mode       : DIO"),
        clock.line("I", f"boot.{chip.name}", f"SPI Flash Size : {header_flash >> 20}MB"),
        clock.line("W", "boot", f"{SIM_BANNER}: this is harness.sim, not real hardware"),
    ]
    try:
        table = bootloader_table_offset(boot)  # compiled into the bootloader, as on a real board
        parts = parse_partition_table(flash[table : table + PARTITION_TABLE_MAX])
    except (PartitionTableError, ImageError) as exc:
        bl.append(clock.line("E", "flash_parts", str(exc)))
        bl.append(clock.line("E", "boot", "Failed to verify partition table"))
        bl.append(clock.line("E", "boot", "load partition table error!"))
        pieces.append(Piece("console", b"".join(bl), t_bl))
        return _Once(pieces)
    bl.append(clock.line("I", "boot", "Partition Table:"))
    bl.append(clock.line("I", "boot", "## Label            Usage          Type ST Offset   Length"))
    for i, p in enumerate(parts):
        tname, sub = type_names(p)
        usage = {"nvs": "WiFi data", "phy": "RF data", "factory": "factory app"}.get(sub, f"{tname} {sub}")
        bl.append(
            clock.line(
                "I",
                "boot",
                f"{i:2d} {p.label:<16} {usage:<16} {p.type:02x} {p.subtype:02x} {p.offset:08x} {p.size:08x}",
                1,
            )
        )
    bl.append(clock.line("I", "boot", "End of partition table"))
    app_part = next((p for p in parts if p.type == 0x00), None)
    if app_part is None:
        bl.append(clock.line("E", "boot", "No bootable app partitions in the partition table"))
        pieces.append(Piece("console", b"".join(bl), t_bl))
        return _Once(pieces)
    try:
        app = load_image(chip, flash, app_part.offset, app_part.size)
        payload = find_payload(chip, app)
    except (ImageError, ValueError) as exc:
        bl.append(clock.line("E", "esp_image", str(exc)))
        bl.append(clock.line("E", "boot", "Factory app partition is not bootable"))
        bl.append(clock.line("E", "boot", "No bootable app partitions in the partition table"))
        pieces.append(Piece("console", b"".join(bl), t_bl))
        return _Once(pieces)
    pos = app_part.offset + 0x18
    for i, (addr, data) in enumerate(app.segments):
        mapped = chip.drom_map_start <= addr < chip.drom_map_start + 0x400000 or chip.irom_start <= addr < (
            chip.irom_start + 0x2000000
        )
        kind = "map" if mapped else "load"
        bl.append(
            clock.line(
                "I",
                "esp_image",
                f"segment {i}: paddr={pos + 8:08x} vaddr={addr:08x} "
                f"size={len(data):05x}h ({len(data):6d}) {kind}",
                2,
            )
        )
        pos += 8 + len(data)
    bl.append(clock.line("I", "boot", f"Loaded app from partition at offset 0x{app_part.offset:x}", 20))
    bl.append(clock.line("I", "boot", "Disabling RNG early entropy source..."))
    console_baud = int(payload.header.get("console_baud", ROM_BAUD))
    # the 2nd-stage bootloader and the app both log at the console baud
    pieces.append(Piece("console", b"".join(bl), t_bl))
    app_out, reboot = _run_app(ctx, payload, clock, n, elf_sha256(chip, app), header_flash)
    once = _Once(pieces + app_out.pieces, console_baud, payload.variant, app_out.faults_applied, reboot)
    return once


def _flash_size_text(detected: int, header: int, relation: str) -> str:
    """ESP-IDF's spi_flash start-up message when the chip and the image header disagree on the size."""
    tail = "Probe failed." if relation == "smaller" else "Using the size in the binary image header."
    return (
        f"Detected size({detected // 1024}k) {relation} than the size in the binary image header"
        f"({header // 1024}k). {tail}"
    )


def _startup(
    ctx: BootContext, payload: AppPayload, clock: _Clock, elf_sha: str, header_flash: int, active: list[str]
) -> tuple[list[bytes], bytes | None]:
    """ESP-IDF's start-up log up to app_main, or up to the assert that stops it (the crash text)."""
    chip, variant = ctx.chip, payload.variant
    head = [
        clock.line("I", "cpu_start", f"{'Multicore' if chip.cores > 1 else 'Single core'} app", 40),
        clock.line("I", "cpu_start", "Pro cpu start user code"),
        clock.line("I", "cpu_start", f"cpu freq: {chip.cpu_mhz * 1000000} Hz"),
        clock.line("I", "app_init", "Application information:"),
        clock.line("I", "app_init", f"Project name:     {PROJECT_NAME}", 1),
        clock.line("I", "app_init", f"App version:      {payload.header.get('fwver', '0.0.0')}", 1),
        clock.line("I", "app_init", f"ELF file SHA256:  {elf_sha[:ELF_SHA_PRINTED]}...", 1),
        clock.line("I", "app_init", f"ESP-IDF:          {payload.header.get('idf', 'sim')}", 1),
        clock.line("I", "efuse_init", f"Chip rev:         v{chip.rev}", 1),
        clock.line("I", "heap_init", "Initializing. RAM available for dynamic allocation:", 2),
    ]
    detected = len(ctx.flash)  # the flash chip's real size (its RDID answer)
    if detected < header_flash:  # esp_flash_init_default_chip refuses the chip: the core init asserts
        head.append(clock.line("E", "spi_flash", _flash_size_text(detected, header_flash, "smaller"), 10))
        rng = ctx.faults.rng("flash_size", ctx.boot_index)
        return head, b"\r\n" + panic_text(chip, "flash_size", rng, elf_sha, variant)
    if detected > header_flash:
        head.append(clock.line("W", "spi_flash", _flash_size_text(detected, header_flash, "larger"), 10))
    head.append(clock.line("I", "spi_flash", "detected chip: generic", 10))
    if "bootloop" in active:  # no RAM left for the main task's stack: an assert before app_main
        rng = ctx.faults.rng("bootloop", ctx.boot_index)
        return head, panic_text(chip, "startup", rng, elf_sha, variant)
    head += [
        clock.line("I", "main_task", "Started on CPU0", 20),
        clock.line("I", "main_task", "Calling app_main()", 10),
        clock.line("W", "esp-check", f"{SIM_BANNER} (harness.sim {chip.name}): results are simulated"),
    ]
    return head, None


def _run_app(
    ctx: BootContext, payload: AppPayload, clock: _Clock, n: int, elf_sha: str, header_flash: int
) -> tuple[BootResult, str | None]:
    from harness.protocol.emitter import make_emitter

    faults = ctx.faults
    variant = payload.variant
    active = sorted(f for f in faults.names if faults.active(f, variant) and f != "sync_fail")
    t_head = clock.seconds
    head, crash_at_start = _startup(ctx, payload, clock, elf_sha, header_flash, active)
    if crash_at_start is not None:  # the start-up asserts (flash size, bootloop): every boot
        piece = Piece("console", b"".join(head) + crash_at_start, t_head)
        return BootResult([piece], variant=variant, faults_applied=active), "sw"
    out = bytearray()
    app = _App(ctx, payload, list(active), make_emitter(out.extend, backend=ctx.emitter_backend))
    result = BootResult([Piece("console", b"".join(head), t_head)], variant=variant)
    t_app = clock.seconds  # app_main's records follow the start-up log (the invoke takes no modelled time)
    ok = _app_body(app, elf_sha)
    result.faults_applied = app.active
    if app.crash:
        records = bytes(out)
        if app.crash != _HANG:
            records += app.crash
        result.pieces += _line_faults(records, app.active, faults, ctx.boot_index, t_app)
        return result, app.reboot
    app.emitter.end(ok)
    tail = clock.line("I", "main_task", "Returned from app_main()", 50)
    result.pieces += _line_faults(bytes(out) + tail, app.active, faults, ctx.boot_index, t_app)
    return result, None


_HANG = b"\x00hang"  # crash marker: the app stops printing (no END)


@dataclass
class _App:
    """One boot of the simulated app: what it has compiled in, how each op dispatches, what it printed."""

    ctx: BootContext
    payload: AppPayload
    active: list[str]
    emitter: Any
    info: Any = None  # ModelInfo, None when the embedded model does not parse
    outputs: _Outputs | None = None
    dispatch: Any = None  # harness.sim.cycles.Dispatch
    fallback_ops: int = 0  # hybrid table nodes ESP-NN does not handle (the original kernel runs them)
    op_fault: Any = None  # harness.sim.tap_sim.OpFault
    crash: bytes = b""
    reboot: str | None = None

    @property
    def tap(self) -> bool:
        return bool(self.payload.header.get("tap"))


def _app_body(app: _App, elf_sha: str) -> bool:
    """BEGIN, INFO, ARENA and the runs; False when the app stops with an ERROR (or a crash)."""
    em, payload, chip = app.emitter, app.payload, app.ctx.chip
    em.begin(str(payload.header.get("fwver", "0.0.0")), True)
    em.info([("nn", payload.nn), ("target", chip.name), ("chip", chip.name), ("rev", chip.rev),
             ("cores", chip.cores), ("cpu_mhz", chip.cpu_mhz)])  # fmt: skip
    _load_model(app)
    tflm = app.outputs.backend_version.replace(" ", "_") if app.outputs else "sim"
    n_out = len(app.info.outputs) if app.info is not None else 0
    em.info([("idf", str(payload.header.get("idf", "sim"))), ("tflm", tflm),
             ("espnn", str(payload.header.get("espnn", "sim"))), ("model_bytes", len(payload.model)),
             ("inputs", len(payload.inputs)), ("outputs", n_out)])  # fmt: skip
    em.info([("model_sha256", hashlib.sha256(payload.model).hexdigest())])
    if app.active:
        em.info([("sim_fault", "+".join(app.active))])
    if app.tap:
        em.info([("tap", 1)])
    table = payload.header.get("hybrid")
    if table is not None:
        em.info([("hybrid", len(table)), ("ansi_ops", _ops_text([int(r[0]) for r in table]))])
    if app.info is None:
        em.error("schema", -1, "model_schema_version_differs_from_TFLITE_SCHEMA_VERSION", None)
        return False
    if "alloc" in app.active:
        em.error("alloc", 1, "AllocateTensors_failed", None)
        return False
    if len(app.info.inputs) != 1 or app.outputs is None:
        em.error("input", len(app.info.inputs), "expected_one_input_tensor", None)
        return False
    size = int(payload.header.get("arena_bytes") or 0) or app.outputs.arena_used
    used = app.outputs.arena_used
    em.arena(size, min(size, used) if used else size, "host")
    return _run_inputs(app, elf_sha)


def _ops_text(ops: list[int], limit: int = 160) -> str:
    """INFO ansi_ops as the firmware prints it: ``17,27``, cut with a trailing ``+`` past ``limit``."""
    text = ""
    for k, op in enumerate(ops):
        one = f"{',' if k else ''}{op}"
        if len(text) + len(one) + 2 > limit + 1:
            return text + "+"
        text += one
    return text or "-"


def _load_model(app: _App) -> None:
    """Parse the embedded model, work out each op's kernel (hybrid table, faults) and run the reference."""
    from harness.model.loader import parse_model_bytes

    try:
        app.info = parse_model_bytes(app.payload.model)
    except Exception:
        app.info = None
        return
    app.dispatch, app.fallback_ops = _dispatch(app)
    app.op_fault = _op_fault(app.ctx.faults, app.dispatch, app.info)
    app.active = sorted(
        [f for f in app.active if f not in _OP_FAULT_NAMES] + ([app.op_fault.kind] if app.op_fault else [])
    )
    if len(app.info.inputs) == 1 and "alloc" not in app.active:
        per_layer = app.tap or app.op_fault is not None
        app.outputs = _run_model(app.payload, app.ctx.cache, per_layer=per_layer)


_OP_FAULT_NAMES = ("op_corrupt", "op_clobber", "op_panic", "op_hang")


def _dispatch(app: _App) -> tuple[Any, int]:
    """Which kernel each op runs: the image's variant, the hybrid wrapper's table (matched to nodes by
    their first output tensor, as the C wrapper does) and an ``unoptimized_kind`` fault."""
    from harness.model.hybrid_ops import ANSI_KINDS, ansi_path_applies
    from harness.sim.cycles import Dispatch

    info = app.info
    by_out = {o.outputs[0]: o for o in info.main_ops if o.outputs and o.outputs[0] >= 0}
    ansi: set[int] = set()
    fallback = 0
    for _op, out_t, kind in app.payload.header.get("hybrid") or []:
        op = by_out.get(int(out_t))
        if op is None or ANSI_KINDS.get(op.opcode, ("",))[0] != kind:
            continue  # the C wrapper never recognises this row
        if ansi_path_applies(info, op):
            ansi.add(op.index)
        else:
            fallback += 1
    faults = app.ctx.faults
    unopt = faults.fault_kind if "unoptimized_kind" in app.active else None
    return Dispatch(app.payload.variant, frozenset(ansi), unopt), fallback


def _run_inputs(app: _App, elf_sha: str) -> bool:
    """Per embedded input: INPUT, then a crash, or TIME, TENSOR/DATA, HYBRID and the tap records."""
    from harness.sim.cycles import invoke_us, op_cycles

    em, payload, info, chip = app.emitter, app.payload, app.info, app.ctx.chip
    assert info is not None and app.outputs is not None
    tin = info.inputs[0]
    need = tin.num_elements * np.dtype(tin.dtype).itemsize
    cycles = op_cycles(info, chip.name, app.dispatch, salt=payload.variant)
    for i, raw in enumerate(payload.inputs):
        if len(raw) != need:
            em.error("input", len(raw), "input_tensor_size_differs_from_embedded_input", i)
            return False
        em.input(i, len(raw), hashlib.sha256(raw).hexdigest())
        if _crashes(app, elf_sha):
            return False
        em.time(i, invoke_us(cycles, chip.cpu_mhz))
        arr = np.frombuffer(raw, np.dtype(tin.dtype)).reshape(tin.shape)
        final, sim_ops = _outputs_of(app, i, arr, cycles)
        for o, (out, t) in enumerate(zip(final, info.outputs, strict=True)):
            data = _apply_output_faults(out, app.active, app.ctx.faults, app.ctx.boot_index, i, o)
            em.tensor(i, o, t.dtype, list(t.shape), float(t.scale or 0.0), int(t.zero_point or 0), data,
                      t.name, int(payload.header.get("human_max", 16)))  # fmt: skip
        if payload.header.get("hybrid") is not None:
            hybrid = [("i", i), ("ansi", len(app.dispatch.ansi_ops)), ("fallback", app.fallback_ops)]
            em.record("HYBRID", hybrid)
        if app.tap and sim_ops is not None:
            _emit_taps(em, i, info, sim_ops, [int(k) for k in payload.header.get("dump_ops", [])])
    return True


def _crashes(app: _App, elf_sha: str) -> bool:
    """A crash or hang during this invoke (whole-app faults, or an op fault that fires in this image)."""
    faults, chip = app.ctx.faults, app.ctx.chip
    if "hang" in app.active or (app.op_fault is not None and app.op_fault.kind == "op_hang"):
        app.crash = _HANG
        return True
    kind = next((k for k in ("panic", "abort", "brownout") if k in app.active), None)
    if kind is None and app.op_fault is not None and app.op_fault.kind == "op_panic":
        kind = "panic"
    if kind is None:
        return False
    rng = faults.rng(kind, app.ctx.boot_index)  # a kernel bug: the same crash on every boot
    if kind == "brownout":
        app.crash, app.reboot = b"\r\nBrownout detector was triggered\r\n\r\n", "brownout"
    else:
        app.crash, app.reboot = panic_text(chip, kind, rng, elf_sha, app.payload.variant), "sw"
    return True


def _outputs_of(app: _App, i: int, arr: np.ndarray, cycles: list[int]) -> tuple[list[np.ndarray], Any]:
    """The run's final outputs and (per-layer runs) the ops' tap view, with op faults applied."""
    assert app.outputs is not None and app.info is not None
    final = list(app.outputs.arrays[i])
    if app.outputs.layers is None:
        return final, None
    from harness.sim.tap_sim import simulate_ops

    sim_ops, values = simulate_ops(app.info, arr, app.outputs.layers[i], app.dispatch, app.op_fault, cycles)
    return [values.get(t.index, a) for t, a in zip(app.info.outputs, final, strict=True)], sim_ops


def _op_fault(faults: FaultSpec, dispatch: Any, info: Any) -> Any:
    """The op fault of this image, or None when there is none or it hits no op this image runs."""
    from harness.sim.tap_sim import OpFault

    if not faults.fault_ops:
        return None
    for kind in _OP_FAULT_NAMES:
        if kind in faults.names:
            fault = OpFault(
                kind, faults.fault_ops[0], faults.fault_region, faults.corrupt_lsb, faults.corrupt_frac,
                faults.seed, faults.fault_ops[1:], faults.variant,
            )  # fmt: skip
            hit = any(fault.hits(op.index, dispatch) for op in info.main_ops)
            return fault if hit else None
    return None


def _emit_taps(emitter: Any, i: int, info: Any, sim_ops: list[Any], dump_ops: list[int]) -> None:
    """OP records, OPEND and the chosen ops' dumps, as the --tap firmware prints them after Invoke."""
    from harness.protocol.emitter import TapTensor
    from harness.protocol.spec import TAP_RECORD_BYTES, crc32

    for so in sim_ops:
        emitter.op(
            i,
            0,
            so.op.index,
            so.op.opcode,
            so.cycles,
            [TapTensor(t, tuple(a.shape), crc32(a)) for t, a in so.inputs],
            [TapTensor(t, tuple(a.shape), crc32(a)) for t, a in so.outputs],
        )
    dumps = [(so, role, t, a) for so in sim_ops if so.op.index in dump_ops
             for role, side in (("in", so.inputs), ("out", so.outputs)) for t, a in side]  # fmt: skip
    ram = TAP_RECORD_BYTES * len(sim_ops) + sum((a.nbytes + 3) // 4 * 4 for *_, a in dumps)
    emitter.op_end(i, len(sim_ops), 0, ram)
    for so, role, t, a in dumps:
        ti = info.tensors[t]
        emitter.op_dump(
            i, so.op.index, t, role, str(a.dtype), list(a.shape), float(ti.scale or 0.0),
            int(ti.zero_point or 0), a.tobytes(),
        )  # fmt: skip


def _apply_output_faults(
    arr: np.ndarray, active: list[str], faults: FaultSpec, boot: int, i: int, o: int
) -> bytes:
    a = np.array(arr, copy=True)
    if "pinned" in active:
        info = np.iinfo(a.dtype) if a.dtype.kind in "iu" else None
        a[...] = info.min if info is not None else 0
    if "corrupt" in active:
        rng = faults.rng("corrupt", i * 1000 + o)  # same elements on every boot: a kernel bug, not noise
        flat = a.reshape(-1)
        k = max(1, round(flat.size * faults.corrupt_frac))
        idx = sorted(rng.sample(range(flat.size), min(k, flat.size)))
        if a.dtype.kind in "iu":
            lim = np.iinfo(a.dtype)
            for j in idx:
                v = int(flat[j])
                delta = faults.corrupt_lsb if v + faults.corrupt_lsb <= lim.max else -faults.corrupt_lsb
                flat[j] = v + delta
        else:
            for j in idx:
                flat[j] = flat[j] + faults.corrupt_lsb
    del boot
    return a.tobytes()


def _line_faults(data: bytes, active: list[str], faults: FaultSpec, boot: int, at: float) -> list[Piece]:
    """Console-level faults on the app's output: watchdog splice, truncation, disconnect, noise."""
    if "wdt" in active:
        lines = data.split(b"\n")
        cands = [k for k, ln in enumerate(lines) if b"@EC1 " in ln and (b" DATA " in ln or b" TENSOR " in ln)]
        if cands:
            rng = faults.rng("wdt", boot)
            k = rng.choice(cands)
            ln = lines[k]
            cut = rng.randrange(ln.index(b"@EC1 ") + 6, len(ln) - 2)
            msg = (
                b"E (5312) task_wdt: Task watchdog got triggered. The following tasks/users did not "
                b"reset the watchdog in time:\r\n"
            )
            lines[k] = ln[:cut] + msg + ln[cut:]
            lines.insert(k + 1, b"E (5312) task_wdt:  - IDLE0 (CPU 0)\r")
            data = b"\n".join(lines)
    event: Piece | None = None
    for name in ("truncate", "disconnect"):
        if name in active:
            marks = [m for m in range(len(data)) if data.startswith(b"@EC1 ", m)]
            if len(marks) > 4:
                rng = faults.rng(name, boot)
                k = rng.randrange(len(marks) // 2, len(marks) - 1)
                cut = rng.randrange(marks[k] + 5, marks[k + 1])
                data = data[:cut]
                if name == "disconnect":
                    event = Piece("disconnect", at=at)
            break
    if "noise" in active:
        data = flip_bits(data, faults.noise, faults.rng("noise", boot))
    pieces = [Piece("console", data, at)]
    if event is not None:
        pieces.append(event)
    return pieces
