"""What the simulated chip prints when it boots from flash: ROM lines, the second-stage bootloader (it
reads the partition table and otadata, and boots the app otadata selects, as ESP-IDF's does), then hands
over to the esp-check app (:mod:`harness.sim.resident`), which maps the model partition and stays in its
command loop. The board schedules the :class:`Piece` list it returns on its serial line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.chips import CONSOLE_BAUD
from harness.flashfmt import model_image
from harness.flashfmt.otadata import boot_order
from harness.flashfmt.partitions import (
    DATA,
    OTA_0,
    TABLE_MAX_BYTES,
    Partition,
    PartitionTableError,
    find,
    parse_partition_table,
)
from harness.protocol.app_image import slot_sha256
from harness.sim.chips import ChipSpec
from harness.sim.image import (
    AppPayload,
    ImageError,
    LoadedImage,
    app_elf_sha256,
    bootloader_max_bytes,
    bootloader_table_offset,
    find_payload,
    header_flash_bytes,
    load_image,
)
from harness.sim.resident import SIM_BANNER, AppEnv, Clock, Piece, SimApp

# When output starts after the reset is released (seconds): the ROM prints its banner at once and its
# load lines while it reads the bootloader; the later pieces start at their ESP-IDF log timestamps.
ROM_LOAD_S = 0.005
REBOOT_S = 0.02  # from "Rebooting..." to the next ROM banner


@dataclass
class BootResult:
    pieces: list[Piece]
    console_baud: int = CONSOLE_BAUD
    variant: str | None = None
    app: SimApp | None = None  # the app now running its command loop (None: halted, looping, no app)
    reboot_reason: str | None = None  # one boot: the app restarted the chip (the next boot's reason)


# ---- ROM text -----------------------------------------------------------------------------------

_RESET_REASONS = {
    "poweron": ("0x1 (POWERON_RESET)", "0x1 (POWERON)"),
    "sw": ("0xc (SW_CPU_RESET)", "0xc (RTC_SW_CPU_RST)"),
    "brownout": ("0xf (RTCWDT_BROWN_OUT_RESET)", "0xf (BROWNOUT_RST)"),
    "rtcwdt": ("0x10 (RTCWDT_RTC_RESET)", "0x10 (RTCWDT_RTC_RST)"),
    "usb": ("0x15 (USB_UART_CHIP_RESET)", "0x15 (USB_UART_CHIP_RESET)"),
}


def rom_header(chip: ChipSpec, reason: str, download: bool) -> bytes:
    """First ROM lines after a reset, e.g. ``ets Jun  8 2016 ...`` / ``rst:0x1 (POWERON_RESET),boot:...``."""
    rst = _RESET_REASONS[reason][0 if chip.name == "esp32" else 1]
    boot = chip.boot_modes[1 if download else 0]
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


# ---- boot ---------------------------------------------------------------------------------------


def boot_from_flash(ctx: AppEnv, reason: str) -> BootResult:
    """Everything the chip prints from reset release (IO0 high) until its app waits for commands, halts or
    loops (a start-up crash repeats on every boot, ``loops`` boots shown)."""
    loops = max(1, ctx.faults.loops)
    result = BootResult([])
    base = 0.0  # when this boot's reset was released, after the first one
    for n in range(loops):
        one = _boot_once(ctx, reason)
        result.pieces += [replace(p, at=base + p.at) for p in one.pieces]
        base += max(p.at for p in one.pieces) + REBOOT_S
        result.console_baud = one.console_baud if n == 0 else result.console_baud
        result.variant = one.variant
        result.app = one.app
        if one.reboot_reason is None:
            break
        reason = one.reboot_reason
    return result


def _bootloader_lines(chip: ChipSpec, clock: Clock, header_flash: int) -> list[bytes]:
    return [
        clock.line("I", "boot", "ESP-IDF sim 2nd stage bootloader"),
        clock.line("I", "boot", "compile time Jan  1 2026 00:00:00"),
        clock.line("I", "boot", f"{'Multicore' if chip.cores > 1 else 'Single core'} bootloader"),
        clock.line("I", "boot", f"chip revision: v{chip.rev}"),
        clock.line("I", f"boot.{chip.name}", "SPI Speed      : 80MHz"),
        clock.line("I", f"boot.{chip.name}", "SPI Mode       : DIO"),
        clock.line("I", f"boot.{chip.name}", f"SPI Flash Size : {header_flash >> 20}MB"),
        clock.line("W", "boot", f"{SIM_BANNER}: this is harness.sim, not real hardware"),
    ]


def _table_lines(parts: list[Partition], clock: Clock) -> list[bytes]:
    out = [
        clock.line("I", "boot", "Partition Table:"),
        clock.line("I", "boot", "## Label            Usage          Type ST Offset   Length"),
    ]
    usages = {"nvs": "WiFi data", "phy": "RF data", "factory": "factory app", "ota": "OTA data"}
    for i, p in enumerate(parts):
        tname, sub = p.type_names()
        usage = usages.get(sub, "OTA app" if sub.startswith("ota_") else f"{tname} {sub}")
        row = f"{i:2d} {p.label:<16} {usage:<16} {p.type:02x} {p.subtype:02x} {p.offset:08x} {p.size:08x}"
        out.append(clock.line("I", "boot", row, 1))
    out.append(clock.line("I", "boot", "End of partition table"))
    return out


def _load_app(
    ctx: AppEnv, parts: list[Partition], clock: Clock, boot_log: list[bytes]
) -> tuple[Partition, LoadedImage, AppPayload] | None:
    """The app the bootloader boots (the boot rule of harness.flashfmt), with what it logs about otadata
    and each app it tries; None: no bootable app."""
    order = boot_order(parts, lambda offset, size: bytes(ctx.flash[offset : offset + size]))
    if order.read_otadata:
        slot = "nothing" if order.slot is None else f"ota_{order.slot}"
        boot_log.append(clock.line("I", "boot", f"OTA data selects {slot}"))
    for part in order.apps:
        try:
            app = load_image(ctx.chip, ctx.flash, part.offset, part.size)
            payload = find_payload(ctx.chip, app)
        except (ImageError, ValueError) as exc:
            boot_log.append(clock.line("E", "esp_image", str(exc)))
            boot_log.append(clock.line("E", "boot", f"{part.label} app partition is not bootable"))
            continue
        pos = part.offset + 0x18
        for i, (addr, data) in enumerate(app.segments):
            kind = "map" if app.image.is_flash_addr(addr) else "load"  # the cache maps it, or it is copied
            size = f"size={len(data):05x}h ({len(data):6d})"
            line = f"segment {i}: paddr={pos + 8:08x} vaddr={addr:08x} {size} {kind}"
            boot_log.append(clock.line("I", "esp_image", line, 2))
            pos += 8 + len(data)
        boot_log.append(clock.line("I", "boot", f"Loaded app from partition at offset 0x{part.offset:x}", 20))
        return part, app, payload
    boot_log.append(clock.line("E", "boot", "No bootable app partitions in the partition table"))
    return None


_NO_ARENA = "model_image_gives_no_arena_size_flash_the_model_again"


def _map_model(flash: bytearray, parts: list[Partition]) -> tuple[bytes, dict[str, int | str], str | None]:
    """What the app's esp_partition_mmap of the model partition finds: (model, arena, None) or
    (b"", {}, why not); arena: the header's ``arena_bytes`` and ``arena_mem``."""
    part = find(parts, DATA, label=model_image.PARTITION_LABEL)
    if part is None:
        return b"", {}, "no_model_partition_in_the_partition_table"
    data = flash[part.offset : part.offset + part.size]
    try:
        image = model_image.parse_model_image(data, part.size)
    except model_image.ModelDamagedError as exc:  # MapModel checks the arena fields before the SHA-256
        return b"", {}, "model_partition_damaged_sha256_differs" if exc.arena_bytes else _NO_ARENA
    except model_image.ModelImageError:  # as MapModel: a header failing any check (its CRC too)
        return b"", {}, "model_partition_holds_no_model_image_flash_it"
    if image.arena_bytes == 0:
        return b"", {}, _NO_ARENA
    return image.model, {"arena_bytes": image.arena_bytes, "arena_mem": image.arena_mem}, None


def _slot_shas(ctx: AppEnv, parts: list[Partition], running: Partition) -> tuple[str, str]:
    """What the firmware's HELLO reports: ``esp_partition_get_sha256`` of the running app slot and of
    ``esp_ota_get_next_update_partition`` (the next OTA slot after the running one, round robin)."""
    otas = [p for p in parts if p.is_ota_app]

    def sha(p: Partition | None) -> str:
        return "" if p is None else slot_sha256(bytes(ctx.flash[p.offset : p.offset + p.size]), ctx.chip.name)

    nxt = None
    if otas:
        at = otas.index(running) if running in otas else -1
        nxt = otas[(at + 1) % len(otas)]
        nxt = None if nxt is running else nxt
    return sha(running), sha(nxt)


def _boot_once(ctx: AppEnv, reason: str) -> BootResult:
    chip = ctx.chip
    flash = ctx.flash
    pieces: list[Piece] = [Piece("rom", rom_header(chip, reason, False))]
    try:
        boot = load_image(chip, flash, chip.bootloader_offset, bootloader_max_bytes(chip))
    except ImageError as exc:
        # the ROM retries forever; three rounds are enough evidence of the loop
        text = b"".join(rom_header(chip, "rtcwdt", False) + f"{exc}\r\n".encode() for _ in range(2))
        return BootResult([Piece("rom", pieces[0].data + f"{exc}\r\n".encode() + text)])
    pieces.append(Piece("rom", _rom_load_lines(chip, boot), ROM_LOAD_S))
    header_flash = header_flash_bytes(boot.image)  # the bootloader sets the flash size from its header
    # second-stage bootloader (console baud is only known from the app image; it logs at 115200 here)
    clock = Clock()
    t_boot = clock.seconds
    boot_log = _bootloader_lines(chip, clock, header_flash)
    try:
        table = bootloader_table_offset(boot)  # compiled into the bootloader, as on a real board
        parts = parse_partition_table(bytes(flash[table : table + TABLE_MAX_BYTES]))
    except (PartitionTableError, ImageError) as exc:
        boot_log.append(clock.line("E", "flash_parts", str(exc)))
        boot_log.append(clock.line("E", "boot", "Failed to verify partition table"))
        boot_log.append(clock.line("E", "boot", "load partition table error!"))
        return BootResult([*pieces, Piece("console", b"".join(boot_log), t_boot)])
    boot_log += _table_lines(parts, clock)
    ctx.parts = parts
    loaded = _load_app(ctx, parts, clock, boot_log)
    if loaded is None:
        return BootResult([*pieces, Piece("console", b"".join(boot_log), t_boot)])
    part, app, payload = loaded
    boot_log.append(clock.line("I", "boot", "Disabling RNG early entropy source..."))
    console_baud = int(payload.header.get("console_baud", CONSOLE_BAUD))
    # the bootloader and the app log at the console baud
    pieces.append(Piece("console", b"".join(boot_log), t_boot))
    model, arena, model_error = _map_model(flash, parts)
    payload = AppPayload({**payload.header, **arena}, model, payload.inputs)
    slot = part.subtype - OTA_0 if part.is_ota_app else None
    shas = _slot_shas(ctx, parts, part)
    sim_app = SimApp(ctx, payload, model_error, app_elf_sha256(chip, app), clock, slot, slot_shas=shas)
    t_app = clock.seconds
    out, reboot = sim_app.start(header_flash)
    out = [replace(p, at=t_app + p.at) for p in out]
    ctx.log(f"app: {payload.variant} from {part.label}, model {'ok' if model_error is None else model_error}")
    app_running = None if reboot else sim_app
    return BootResult(pieces + out, console_baud, payload.variant, app_running, reboot)
