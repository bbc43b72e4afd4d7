"""classify() on real board transcripts (tests/data/transcripts, provenance in PROVENANCE.md) and on
synthetic protocol/edge cases. The transcripts are what real ESP32/S3/C3 boards printed; nothing
here comes from the simulator."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from harness.analysis.classify import BootCounter, Finding, Severity, classify, exit_code_for
from harness.errors import ExitCode

TRANSCRIPTS = Path(__file__).parent / "data" / "transcripts"


def _load(name: str) -> bytes:
    return (TRANSCRIPTS / name).read_bytes()


def _kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


# file -> (expected kinds in order, expected exit code implied by the findings alone)
EXPECTED: dict[str, tuple[list[str], ExitCode | None]] = {
    "xtensa_esp32_loadprohibited_tflm.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32s3_instrfetch_tflm_corrupted_backtrace.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32_panic_after_boot_arduino.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32s3_espnn_corrupt_heap.txt": (["heap_corruption"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32_stack_overflow_main.txt": (["stack_overflow"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32_stack_overflow_abort_bootloop.txt": (["stack_overflow"], ExitCode.FIRMWARE_FAULT),
    "xtensa_stack_canary_watchpoint.txt": (["stack_overflow"], ExitCode.FIRMWARE_FAULT),
    "docs_stack_smashing.txt": (["abort"], ExitCode.FIRMWARE_FAULT),
    "riscv_esp32c3_illegal_instruction.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "riscv_esp32c3_load_access_fault.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "riscv_esp32c3_panic_timestamped_monitor.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "riscv_esp32c3_illegal_instruction_esphome_prefixed.txt": (["panic"], ExitCode.FIRMWARE_FAULT),
    "xtensa_esp32_brownout_csum_err.txt": (["brownout", "boot_failure"], ExitCode.INFRASTRUCTURE),
    "xtensa_esp32_brownout_arduino.txt": (["brownout"], ExitCode.INFRASTRUCTURE),
    "task_wdt_nonfatal_repeated.txt": (["task_watchdog"], None),
    "task_wdt_fatal_abort_after_boot.txt": (["abort", "task_watchdog"], ExitCode.FIRMWARE_FAULT),
    "bootloop_invalid_header_esp32.txt": (["boot_failure", "boot_loop"], ExitCode.INFRASTRUCTURE),
    "boot_esp32s3_usb_serial_jtag_reset_midline.txt": ([], None),
    "boot_esp32s3_idf553_clean.txt": ([], None),
    "tflm_arena_too_small.txt": (["alloc_failure"], ExitCode.FIRMWARE_FAULT),
    "tflm_failed_to_allocate_host.txt": (["alloc_failure"], ExitCode.FIRMWARE_FAULT),
}


def test_every_transcript_has_an_expectation_and_provenance() -> None:
    files = sorted(p.name for p in TRANSCRIPTS.glob("*.txt"))
    assert len(files) >= 8
    assert set(files) == set(EXPECTED)
    provenance = (TRANSCRIPTS / "PROVENANCE.md").read_text()
    for name in files:
        assert f"`{name}`" in provenance, f"{name} has no provenance entry"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transcript_classification(name: str) -> None:
    kinds, code = EXPECTED[name]
    findings = classify(_load(name))
    assert _kinds(findings) == kinds
    assert exit_code_for(findings) == code


def test_both_architectures_are_covered() -> None:
    archs = set()
    for name in EXPECTED:
        for f in classify(_load(name)):
            if "arch" in f.details:
                archs.add(f.details["arch"])
    assert archs == {"xtensa", "riscv"}


def test_xtensa_panic_details() -> None:
    (f,) = classify(_load("xtensa_esp32_loadprohibited_tflm.txt"))
    assert f.details["arch"] == "xtensa"
    assert f.details["reason"] == "LoadProhibited"
    assert f.details["core"] == "0"
    assert f.details["pc"] == "0x4008b565"
    assert f.details["excvaddr"] == "0x00000000"
    assert f.details["backtrace"][0] == ("0x4008b562", "0x3ffc3440")
    assert len(f.details["backtrace"]) == 4
    assert f.line == 1


def test_run_together_backtrace_pairs_are_split() -> None:
    (f,) = classify(_load("xtensa_esp32s3_instrfetch_tflm_corrupted_backtrace.txt"))
    bt = f.details["backtrace"]
    assert bt[0] == ("0xfffffffd", "0x3fce4500")
    assert bt[1] == ("0x4200cbef", "0x3fce4530")  # glued to the previous pair in the original
    assert f.details["core"] == "1"
    assert f.details["reason"] == "InstrFetchProhibited"


def test_riscv_panic_has_mepc_mtval_stack_dump_and_no_backtrace() -> None:
    (f,) = classify(_load("riscv_esp32c3_load_access_fault.txt"))
    assert f.details["arch"] == "riscv"
    assert f.details["mepc"] == "0x42064418"
    assert f.details["pc"] == "0x42064418"
    assert f.details["mtval"] == "0x00000008"
    assert f.details["mcause"] == "0x00000005"
    assert f.details["stack_dump"] is True
    assert "backtrace" not in f.details


def test_prefixed_monitor_lines_still_parse() -> None:
    (f,) = classify(_load("riscv_esp32c3_illegal_instruction_esphome_prefixed.txt"))
    assert f.details["mepc"] == "0x40001be4"
    assert f.details["reason"] == "Illegal instruction"
    (g,) = classify(_load("riscv_esp32c3_panic_timestamped_monitor.txt"))
    assert g.details["mepc"] == "0x42010698"


def test_stack_overflow_absorbs_its_abort_and_keeps_task() -> None:
    (f,) = classify(_load("xtensa_esp32_stack_overflow_abort_bootloop.txt"))
    assert f.details["task"] == "c"
    assert len(f.details["backtrace"]) == 6
    (g,) = classify(_load("xtensa_esp32_stack_overflow_main.txt"))
    assert g.details["backtrace_corrupted"] is True
    (h,) = classify(_load("xtensa_stack_canary_watchpoint.txt"))
    assert h.details["task"] == "sys_evt"
    assert h.details["detector"] == "watchpoint"


def test_corrupt_heap_from_espnn_is_a_firmware_fault() -> None:
    (f,) = classify(_load("xtensa_esp32s3_espnn_corrupt_heap.txt"))
    assert f.severity == Severity.FIRMWARE_FAULT
    assert "0x3fce0f34" in f.message
    assert len(f.details["backtrace"]) == 14


def test_task_watchdog_counts_and_tasks() -> None:
    findings = classify(_load("task_wdt_nonfatal_repeated.txt"))
    (w,) = findings
    assert w.severity == Severity.WARNING
    assert w.details["count"] == 3
    assert w.details["tasks"] == ["IDLE"]
    fatal = classify(_load("task_wdt_fatal_abort_after_boot.txt"))
    assert fatal[0].details["reason"] == "task_watchdog"
    assert fatal[0].details["pc"] == "0x400d1537"


def test_invalid_header_boot_loop_is_infrastructure_and_counted_once() -> None:
    findings = classify(_load("bootloop_invalid_header_esp32.txt"))
    failure, loop = findings
    assert failure.details["count"] == 26
    assert loop.details["boots"] == 4
    assert loop.details["cause"] == "boot_failure"
    assert loop.severity == Severity.INFRASTRUCTURE


def test_usb_serial_jtag_reset_in_the_middle_of_a_line_counts_one_boot() -> None:
    bc = BootCounter()
    for line in _load("boot_esp32s3_usb_serial_jtag_reset_midline.txt").splitlines():
        bc.feed(line)
    assert bc.count == 1
    assert bc.counts["rom_banner"] == 1


# --- synthetic cases ---------------------------------------------------------------------------


def _record(seq: int, body: str) -> str:
    text = f"@EC1 {seq} {body} "
    return f"{text}*{zlib.crc32(text.encode()):08X}"


def test_protocol_error_records_map_by_stage() -> None:
    raw = "\n".join(
        [
            _record(0, "BEGIN proto=1 fw=esp-check fwver=0.1.0 sim=0"),
            _record(1, "ERROR stage=alloc code=1 msg=arena_too_small"),
            _record(2, "ERROR stage=schema code=3"),
            _record(3, "ERROR stage=invoke code=1"),
            _record(4, "ERROR stage=input code=2"),
        ]
    ).encode()
    findings = classify(raw)
    assert _kinds(findings) == ["alloc_failure", "schema_mismatch", "firmware_error", "input_error"]
    assert findings[0].details["msg"] == "arena_too_small"
    assert findings[2].details["stage"] == "invoke"
    assert exit_code_for(findings) == ExitCode.USAGE  # input error wins (precedence 2 > 4)


def test_error_record_with_bad_crc_is_ignored_here() -> None:
    good = _record(1, "ERROR stage=alloc code=1")
    bad = good[:-1] + ("0" if good[-1] != "0" else "1")
    assert classify(bad.encode()) == []


def test_schema_text_from_tflm() -> None:
    (f,) = classify(b"Model provided is schema version 2 not equal to supported version 3.\n")
    assert f.kind == "schema_mismatch" and f.severity == Severity.FIRMWARE_FAULT


def test_end_of_stream_findings() -> None:
    assert _kinds(classify(b"", ended_by="silence")) == ["silence"]
    assert _kinds(classify(b"\x00\x00", ended_by="timeout")) == ["silence"]
    boot = b"ESP-ROM:esp32s3-20210327\nrst:0x1 (POWERON),boot:0x8 (SPI_FAST_FLASH_BOOT)\n"
    assert _kinds(classify(boot, ended_by="silence")) == ["no_end"]
    assert _kinds(classify(boot, ended_by="disconnect")) == ["disconnect"]
    hung = boot + b"E (5000) task_wdt: Task watchdog got triggered. The following tasks did not reset\n"
    assert _kinds(classify(hung, ended_by="silence")) == ["task_watchdog", "hang"]
    ended = boot + _record(5, "END status=ok records=5").encode() + b"\r\n"
    assert classify(ended, ended_by="end_record") == []


def test_boot_loop_counted_from_second_stage_lines_when_rom_output_is_garbage() -> None:
    # ROM at 115200 read at 921600: the rst: lines are garbage, the bootloader's lines are not.
    boot = (
        b"\xf8\x80\x00\x8e\xfe\x80\n" + b"I (31) boot: ESP-IDF v5.5.3 2nd stage bootloader\nI (40) main: x\n"
    )
    findings = classify(boot * 3)
    assert _kinds(findings) == ["boot_loop"]
    assert findings[0].details["signals"]["bootloader"] == 3
    assert findings[0].details["signals"]["rom_rst"] == 0
    assert findings[0].severity == Severity.FIRMWARE_FAULT


def test_boot_loop_after_brownout_is_infrastructure() -> None:
    one = b"Brownout detector was triggered\n\nets Jun  8 2016 00:22:57\n\nrst:0xc (SW_CPU_RESET),boot:0x13\n"
    findings = classify(one * 3)
    assert _kinds(findings) == ["brownout", "boot_loop"]
    assert findings[-1].details["cause"] == "brownout"
    assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE


def test_panic_and_brownout_together_firmware_fault_wins() -> None:
    raw = _load("riscv_esp32c3_illegal_instruction.txt") + _load("xtensa_esp32_brownout_arduino.txt")
    assert exit_code_for(classify(raw)) == ExitCode.FIRMWARE_FAULT


def test_parsed_capture_problems_become_corrupted_findings() -> None:
    class FakeCapture:  # stands in for harness.protocol.capture.Capture (only .valid/.problems are read)
        valid = False
        problems = ("record 7 failed CRC", "seq gap 7->9")

    findings = classify(b"", parsed=FakeCapture())
    assert _kinds(findings) == ["corrupted", "corrupted"]
    assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE


def test_hostile_input_does_not_crash() -> None:
    junk = bytes(range(256)) * 50 + b"Guru Meditation Error: Core  0 panic'ed (" + b"A" * 100000
    findings = classify(junk)
    assert _kinds(findings) == ["panic"]
    assert all(len(line) <= 300 for line in findings[0].evidence)
