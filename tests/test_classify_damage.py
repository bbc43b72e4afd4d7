"""Seeded line damage: every kind classify() reads from a line is still recognised when that line
arrives the way real serial lines arrive broken.

Four kinds of damage, each with 25 seeds, on the line that carries the evidence (the finding's own
line): the first character dropped (a UART loses the start bit of the first byte), junk bytes inserted
(noise, a wrong-baud byte, an ANSI escape), a separator lost or turned into a backtick, and another
log line's start spliced in front. Protocol ERROR records are not here on purpose: they are
CRC-checked, so a damaged one is (rightly) not evidence.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.analysis.classify import classify, exit_code_for

TUNING = Path(__file__).parent / "data" / "transcripts" / "tuning"

JUNK = ["\x00", "\xff", "\ufffd", "⸮", "\x1b", "\x08", "\x7f", "\xfe\xff", "\x00\x00\x00"]
PREFIXES = [
    "I (2031) wifi:sta is connecting to ",
    "[10:42:07][D][sensor:094]: ",
    "E (88) esp_image: segment 1: pa",
    "\ufffd\ufffd@",
    "13:07:55.018 -> ",
    "I (5921) main: inference #41 took 83",
]


def _drop_first(line: str, rng: random.Random) -> str:
    return line[1:]


def _junk(line: str, rng: random.Random) -> str:
    pos = rng.randrange(len(line) + 1)
    return line[:pos] + rng.choice(JUNK) + line[pos:]


def _separator(line: str, rng: random.Random) -> str:
    seps = [i for i, c in enumerate(line) if not c.isalnum()]
    if not seps:
        return line
    i = rng.choice(seps)
    if line[i] == " " and rng.random() < 0.5:
        return line[:i] + "`" + line[i + 1 :]  # a backtick where a space should be
    return line[:i] + line[i + 1 :]


def _prefix(line: str, rng: random.Random) -> str:
    return rng.choice(PREFIXES) + line


DAMAGE: dict[str, Callable[[str, random.Random], str]] = {
    "dropped_first_char": _drop_first,
    "inserted_junk": _junk,
    "lost_separator": _separator,
    "spliced_prefix": _prefix,
}

# kind -> transcripts whose evidence line gets damaged (tuning fixtures, or one line on its own)
CASES: dict[str, list[str]] = {
    "panic": ["file:xtensa_esp32_loadprohibited_tflm.txt", "file:riscv_esp32c3_load_access_fault.txt"],
    "interrupt_watchdog": ["file:iwdt_esp32_cpu0.txt", "file:iwdt_esp32_arduino_isr_context.txt"],
    "stack_overflow": [
        "file:xtensa_esp32_stack_overflow_main.txt",
        "Debug exception reason: Stack canary watchpoint triggered (evt_pump)",
    ],
    "heap_corruption": ["file:xtensa_esp32s3_espnn_corrupt_heap.txt"],
    "abort": [
        "file:docs_stack_smashing.txt",
        "abort() was called at PC 0x400d2a4c on core 0",
        "assert failed: multi_heap_free multi_heap_poisoning.c:253 (head != NULL)",
        "E (12880) task_wdt: Aborting.",
    ],
    "alloc_failure": [
        "Mem alloc fail. size 0x00000128 caps 0x0000080c",
        "E (1301) camera: Failed to allocate frame buffer",
        "Couldn't allocate memory of 412000 bytes",
        "E (412205) BLE_INIT: Malloc failed",
    ],
    "arena_too_small": [
        "Failed to resize buffer. Requested: 31872, available 27408, missing: 4464",
        "Arena size is too small for all buffers. Needed 148736 but only 131072 was available.",
    ],
    "missing_op": [
        "Didn't find op for builtin opcode 'SHAPE' version '1'. An older version of this builtin might be "
        "supported.",
        "Failed to get registration from op code SHAPE",
    ],
    "tflm_error": ["AllocateTensors() failed"],
    "schema_mismatch": ["Model provided is schema version 2 not equal to supported version 3."],
    "brownout": ["Brownout detector was triggered", "rst:0xf (BROWN_OUT_RST),boot:0xa (SPI_FAST_FLASH_BOOT)"],
    "boot_failure": ["invalid header: 0xffffffff", "csum err:0x3b!=0xd7", "flash read err, 1000"],
    "download_mode": [
        "rst:0x1 (POWERON),boot:0x22 (DOWNLOAD(USB/UART0))",
        "rst:0x1 (POWERON_RESET),boot:0x3 (DOWNLOAD_BOOT(UART0/UART1/SDIO_REI_REO_V2))",
        "waiting for download",
    ],
    "task_watchdog": [
        "E (486012) task_wdt: Task watchdog got triggered. The following tasks did not reset the watchdog "
        "in time:"
    ],
}


def _base(case: str, kind: str) -> tuple[list[str], int]:
    """The transcript's lines and the index of the line that carries the evidence for ``kind``."""
    if not case.startswith("file:"):
        return [case, ""], 0
    lines = (TUNING / case[5:]).read_text(encoding="utf-8").split("\n")
    finding = next(f for f in classify("\n".join(lines)) if f.kind == kind)
    assert finding.line is not None
    return lines, finding.line - 1


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("kind", sorted(CASES))
def test_kind_survives_seeded_line_damage(kind: str, damage: str) -> None:
    for case in CASES[kind]:
        lines, at = _base(case, kind)
        want_exit = exit_code_for([f for f in classify("\n".join(lines)) if f.kind == kind])
        for seed in range(25):
            rng = random.Random(f"{kind}:{damage}:{seed}")
            broken = list(lines)
            broken[at] = DAMAGE[damage](lines[at], rng)
            findings = classify("\n".join(broken))
            got = [f for f in findings if f.kind == kind]
            assert got, f"{kind} lost after {damage} (seed {seed}): {broken[at]!r}"
            assert exit_code_for(got) == want_exit


def test_damage_does_not_invent_faults_in_clean_boots() -> None:
    """The same damage on every line of a clean boot and a USB-Serial-JTAG reset finds nothing."""
    clean = (
        "boot_esp32s3_idf553_clean.txt",
        "usb_reset_esp32c3_quoted_clean_boot.txt",
        "clean_esp32p4_boot.txt",
    )
    for name in clean:
        lines = (TUNING / name).read_text(encoding="utf-8").split("\n")
        for damage, fn in DAMAGE.items():
            for seed in range(10):
                rng = random.Random(f"clean:{name}:{damage}:{seed}")
                broken = [fn(ln, rng) if ln else ln for ln in lines]
                assert classify("\n".join(broken)) == [], (name, damage, seed)
