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


def modelled_invoke_us(chip: ChipSpec, payload: AppPayload, n_ops: int) -> int:
    """A deterministic stand-in for the invoke time (the host's time says nothing about an ESP32).

    Proportional to the model's size and op count, scaled by CPU clock; the optimized variant is
    modelled 2x faster. Only benchmarks of the simulator itself should look at it.
    """
    base = (len(payload.model) // 2 + 400 * n_ops) * 240 // max(1, chip.cpu_mhz)
    return int(base // 2 if payload.variant == "optimized" else base)


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

    chip = ctx.chip
    faults = ctx.faults
    variant = payload.variant
    active = sorted(f for f in faults.names if faults.active(f, variant) and f != "sync_fail")
    t_head = clock.seconds
    head, crash_at_start = _startup(ctx, payload, clock, elf_sha, header_flash, active)
    if crash_at_start is not None:  # the start-up asserts (flash size, bootloop): every boot
        piece = Piece("console", b"".join(head) + crash_at_start, t_head)
        return BootResult([piece], variant=variant, faults_applied=active), "sw"
    out = bytearray()
    emitter = make_emitter(out.extend, backend=ctx.emitter_backend)
    result = BootResult([Piece("console", b"".join(head), t_head)], variant=variant, faults_applied=active)
    t_app = clock.seconds  # app_main's records follow the start-up log (the invoke takes no modelled time)
    reboot: str | None = None
    crash: bytes = b""

    tap = bool(payload.header.get("tap"))
    op_fault = _op_fault(faults, active)
    info, outputs = _load_and_run(payload, ctx, active, per_layer=tap or op_fault is not None)
    _print_identity(emitter, payload, chip, info, outputs, active, tap)
    ok = True
    if info is None:
        emitter.error("schema", -1, "model_schema_version_differs_from_TFLITE_SCHEMA_VERSION", None)
        ok = False
    elif "alloc" in active:
        emitter.error("alloc", 1, "AllocateTensors_failed", None)
        ok = False
    elif len(info.inputs) != 1 or outputs is None:
        emitter.error("input", len(info.inputs), "expected_one_input_tensor", None)
        ok = False
    else:
        size = int(payload.header.get("arena_bytes") or 0) or outputs.arena_used
        emitter.arena(size, min(size, outputs.arena_used) if outputs.arena_used else size, "host")
        tin = info.inputs[0]
        need = tin.num_elements * np.dtype(tin.dtype).itemsize
        for i, raw in enumerate(payload.inputs):
            if len(raw) != need:
                emitter.error("input", len(raw), "input_tensor_size_differs_from_embedded_input", i)
                ok = False
                break
            emitter.input(i, len(raw), hashlib.sha256(raw).hexdigest())
            if "hang" in active:
                ok = False
                crash = b"\x00hang"  # marker: no END
                break
            crash_kind = next((k for k in ("panic", "abort", "brownout") if k in active), None)
            if crash_kind is not None:
                rng = faults.rng(crash_kind, ctx.boot_index)  # a kernel bug: the same crash on every boot
                if crash_kind == "brownout":
                    crash = b"\r\nBrownout detector was triggered\r\n\r\n"
                    reboot = "brownout"
                else:
                    crash = panic_text(chip, crash_kind, rng, elf_sha, variant)
                    reboot = "sw"
                ok = False
                break
            emitter.time(i, modelled_invoke_us(chip, payload, outputs.n_ops))
            _print_outputs(emitter, i, raw, info, outputs, payload, ctx, active, op_fault, tap)
    if crash:
        records = bytes(out)
        if crash != b"\x00hang":
            records += crash
        result.pieces += _line_faults(records, active, faults, ctx.boot_index, t_app)
        return result, reboot
    emitter.end(ok)
    tail = clock.line("I", "main_task", "Returned from app_main()", 50)
    result.pieces += _line_faults(bytes(out) + tail, active, faults, ctx.boot_index, t_app)
    return result, None


def _load_and_run(
    payload: AppPayload, ctx: BootContext, active: list[str], per_layer: bool
) -> tuple[Any, _Outputs | None]:
    """The embedded model (None: not a model this TFLM reads) and its outputs on every embedded input."""
    from harness.model.loader import parse_model_bytes

    try:
        info = parse_model_bytes(payload.model)
    except Exception:
        return None, None
    if len(info.inputs) != 1 or "alloc" in active:
        return info, None
    return info, _run_model(payload, ctx.cache, per_layer=per_layer)


def _print_identity(
    emitter: Any, payload: AppPayload, chip: ChipSpec, info: Any, outputs: _Outputs | None, active: list[str],
    tap: bool,
) -> None:  # fmt: skip
    """BEGIN and the INFO records, from the image's compiled-in values, as app_main.cc prints them."""
    emitter.begin(str(payload.header.get("fwver", "0.0.0")), True)
    emitter.info(
        [
            ("nn", payload.nn),
            ("target", chip.name),
            ("chip", chip.name),
            ("rev", chip.rev),
            ("cores", chip.cores),
            ("cpu_mhz", chip.cpu_mhz),
        ]
    )
    tflm = outputs.backend_version.replace(" ", "_") if outputs else "sim"
    emitter.info(
        [
            ("idf", str(payload.header.get("idf", "sim"))),
            ("tflm", tflm),
            ("espnn", str(payload.header.get("espnn", "sim"))),
            ("model_bytes", len(payload.model)),
            ("inputs", len(payload.inputs)),
            ("outputs", len(info.outputs) if info is not None else 0),
        ]
    )
    emitter.info([("model_sha256", hashlib.sha256(payload.model).hexdigest())])
    if active:
        emitter.info([("sim_fault", "+".join(active))])
    if tap:
        emitter.info([("tap", 1)])


def _print_outputs(
    emitter: Any, i: int, raw: bytes, info: Any, outputs: _Outputs, payload: AppPayload, ctx: BootContext,
    active: list[str], op_fault: Any, tap: bool,
) -> None:  # fmt: skip
    """Input ``i``'s TENSOR/DATA records (and with --tap its OP records), after injected faults."""
    tin = info.inputs[0]
    sim_ops = None
    final = list(outputs.arrays[i])
    if outputs.layers is not None:
        from harness.sim.tap_sim import simulate_ops

        sim_ops, values = simulate_ops(
            info, np.frombuffer(raw, np.dtype(tin.dtype)).reshape(tin.shape), outputs.layers[i],
            payload.variant, op_fault,
        )  # fmt: skip
        final = [values.get(t.index, a) for t, a in zip(info.outputs, final, strict=True)]
    for o, (arr, t) in enumerate(zip(final, info.outputs, strict=True)):
        data = _apply_output_faults(arr, active, ctx.faults, ctx.boot_index, i, o)
        emitter.tensor(
            i,
            o,
            t.dtype,
            list(t.shape),
            float(t.scale or 0.0),
            int(t.zero_point or 0),
            data,
            t.name,
            int(payload.header.get("human_max", 16)),
        )
    if tap and sim_ops is not None:
        _emit_taps(emitter, i, info, sim_ops, [int(k) for k in payload.header.get("dump_ops", [])])


def _op_fault(faults: FaultSpec, active: list[str]) -> Any:
    from harness.sim.tap_sim import OpFault

    for kind in ("op_corrupt", "op_clobber"):
        if kind in active and faults.fault_op is not None:
            return OpFault(
                kind,
                faults.fault_op,
                faults.fault_region,
                faults.corrupt_lsb,
                faults.corrupt_frac,
                faults.seed,
            )
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
