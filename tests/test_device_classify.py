"""classify() on real board transcripts (tests/data/transcripts, provenance in PROVENANCE.md) and on
synthetic protocol/edge cases. The transcripts are what real ESP32/S3/C3 boards printed; nothing
here comes from the simulator."""

from __future__ import annotations

import zlib
from pathlib import Path

from harness.analysis.classify import (
    DETECTORS,
    KIND_TABLE,
    KINDS,
    BootCounter,
    Finding,
    Severity,
    classify,
    exit_code_for,
)
from harness.errors import ExitCode

TRANSCRIPTS = Path(__file__).parent / "data" / "transcripts"


def _load(name: str) -> bytes:
    """A tuning fixture of the transcript corpus (tests/test_classify_corpus.py covers all of them)."""
    return (TRANSCRIPTS / "tuning" / name).read_bytes()


def _kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


def test_both_architectures_are_covered() -> None:
    archs = set()
    for path in (TRANSCRIPTS / "tuning").glob("*.txt"):
        for f in classify(path.read_bytes()):
            if "arch" in f.details:
                archs.add(f.details["arch"])
    assert archs == {"xtensa", "riscv"}


def test_xtensa_panic_details() -> None:
    (f,) = classify(_load("xtensa_esp32_loadprohibited_tflm.txt"))
    assert f.details["arch"] == "xtensa"
    assert f.details["reason"] == "LoadProhibited"
    assert f.details["core"] == "0"
    assert f.details["pc"] == "0x4008c1a2"
    assert f.details["excvaddr"] == "0x00000000"
    assert f.details["backtrace"][0] == ("0x4008c19f", "0x3ffc5b70")
    assert len(f.details["backtrace"]) == 4
    assert f.line == 1


def test_run_together_backtrace_pairs_are_split() -> None:
    (f,) = classify(_load("xtensa_esp32s3_instrfetch_tflm_corrupted_backtrace.txt"))
    bt = f.details["backtrace"]
    assert bt[0] == ("0xfffffffd", "0x3fcf1a20")
    assert bt[1] == ("0x4201d3c6", "0x3fcf1a50")  # glued to the previous pair in the original
    assert f.details["core"] == "1"
    assert f.details["reason"] == "InstrFetchProhibited"


def test_riscv_panic_has_mepc_mtval_stack_dump_and_no_backtrace() -> None:
    (f,) = classify(_load("riscv_esp32c3_load_access_fault.txt"))
    assert f.details["arch"] == "riscv"
    assert f.details["mepc"] == "0x420751c4"
    assert f.details["pc"] == "0x420751c4"
    assert f.details["mtval"] == "0x0000000c"
    assert f.details["mcause"] == "0x00000005"
    assert f.details["stack_dump"] is True
    assert "backtrace" not in f.details


def test_prefixed_monitor_lines_still_parse() -> None:
    (f,) = classify(_load("riscv_esp32c3_illegal_instruction_esphome_prefixed.txt"))
    assert f.details["mepc"] == "0x40001c3a"
    assert f.details["reason"] == "Illegal instruction"
    (g,) = classify(_load("riscv_esp32c3_panic_timestamped_monitor.txt"))
    assert g.details["mepc"] == "0x42011b5c"


def test_stack_overflow_absorbs_its_abort_and_keeps_task() -> None:
    (f,) = classify(_load("xtensa_esp32_stack_overflow_abort_bootloop.txt"))
    assert f.details["task"] == "w"
    assert len(f.details["backtrace"]) == 6
    (g,) = classify(_load("xtensa_esp32_stack_overflow_main.txt"))
    assert g.details["backtrace_corrupted"] is True
    (h,) = classify(_load("xtensa_stack_canary_watchpoint.txt"))
    assert h.details["task"] == "evt_pump"
    assert h.details["detector"] == "watchpoint"


def test_corrupt_heap_from_espnn_is_a_firmware_fault() -> None:
    (f,) = classify(_load("xtensa_esp32s3_espnn_corrupt_heap.txt"))
    assert f.severity == Severity.FIRMWARE_FAULT
    assert "0x3fcd2e58" in f.message
    assert len(f.details["backtrace"]) == 14


def test_task_watchdog_counts_and_tasks() -> None:
    findings = classify(_load("task_wdt_nonfatal_repeated.txt"))
    (w,) = findings
    assert w.severity == Severity.WARNING
    assert w.details["count"] == 3
    assert w.details["tasks"] == ["IDLE"]
    fatal = classify(_load("task_wdt_fatal_abort_after_boot.txt"))
    assert fatal[0].details["reason"] == "task_watchdog"
    assert fatal[0].details["pc"] == "0x400d19c3"


def test_invalid_header_boot_loop_is_infrastructure_and_counted_once() -> None:
    findings = classify(_load("bootloop_invalid_header_esp32.txt"))
    failure, loop = findings
    assert failure.details["count"] == 23
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
    # counted, but nothing printed says why: `unknown` (exit 3, "no evidence"), never a guessed fault
    assert _kinds(findings) == ["unknown"]
    assert findings[0].details["signals"]["bootloader"] == 3
    assert findings[0].details["signals"]["rom_rst"] == 0
    assert findings[0].details["reason"] == "no evidence"
    assert findings[0].severity == Severity.INFRASTRUCTURE
    crash = b"Guru Meditation Error: Core  0 panic'ed (LoadProhibited). Exception was unhandled.\n"
    looped = classify((boot + crash) * 3)
    assert _kinds(looped) == ["panic", "boot_loop"]  # the same panic every boot: reported once, counted
    assert looped[0].details["count"] == 3
    assert looped[1].severity == Severity.FIRMWARE_FAULT and looped[1].details["cause"] == "panic"


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
    from harness.protocol.capture import Capture

    findings = classify(b"", parsed=Capture(problems=["record 7 failed CRC", "seq gap 7->9"]))
    assert _kinds(findings) == ["corrupted", "corrupted"]
    assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE


def test_hostile_input_does_not_crash() -> None:
    junk = bytes(range(256)) * 50 + b"Guru Meditation Error: Core  0 panic'ed (" + b"A" * 100000
    findings = classify(junk)
    assert _kinds(findings) == ["panic"]
    assert all(len(line) <= 300 for line in findings[0].evidence)


# --- kinds added for real-world text ----------------------------------------------------------------


def test_download_mode_names_the_strap_pin_of_each_chip_and_is_never_a_loop_or_fault() -> None:
    banners = {
        "esp32": "ets Jun  8 2016 00:22:57\n\nrst:0x1 (POWERON_RESET),"
        "boot:0x3 (DOWNLOAD_BOOT(UART0/UART1/SDIO_REI_REO_V2))",
        "esp32s3": "ESP-ROM:esp32s3-20210327\nBuild:Mar 27 2021\nrst:0x1 (POWERON),"
        "boot:0x0 (DOWNLOAD(USB/UART0))",
        "esp32c3": "ESP-ROM:esp32c3-api1-20210207\nBuild:Feb  7 2021\nrst:0x1 (POWERON),"
        "boot:0x5 (DOWNLOAD(USB/UART0/1))",
        "esp32c6": "ESP-ROM:esp32c6-20220919\nBuild:Sep 19 2022\nrst:0x1 (POWERON),"
        "boot:0x4 (DOWNLOAD(USB/UART0/SDIO_FEI_FEO))",
        "esp32p4": "ESP-ROM:esp32p4-eco2-20240710\nBuild:Jul 10 2024\nrst:0x1 (POWERON),"
        "boot:0x6 (DOWNLOAD(USB/UART0/SPI))",
    }
    pins = {"esp32": "GPIO0", "esp32s3": "GPIO0", "esp32c3": "GPIO9", "esp32c6": "GPIO9", "esp32p4": "GPIO35"}
    for chip, banner in banners.items():
        raw = ((banner + "\nwaiting for download\n") * 4).encode()
        for ended_by in (None, "silence", "boot_loop"):
            findings = classify(raw, ended_by=ended_by)
            assert _kinds(findings) == ["download_mode"], (chip, ended_by, _kinds(findings))
            (f,) = findings
            assert f.severity == Severity.INFRASTRUCTURE
            assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE
            assert f.details["chip"] == chip and f.details["strap_pin"] == pins[chip]
            assert pins[chip] in (f.hint or "")
            assert f.details["banners"] == 4


def test_download_mode_after_a_usb_reset_points_at_the_host_reset_sequence() -> None:
    (f,) = classify(_load("download_esp32c6_usb_hpsys_espflash.txt"))
    assert f.details["rst_reason"] == "USB_UART_HPSYS"
    assert "host's reset sequence" in (f.hint or "") and "GPIO9" in (f.hint or "")
    (g,) = classify(_load("download_esp32_picocom_repeated.txt"))
    assert "strap was low" in (g.hint or "") and "GPIO0" in (g.hint or "")


def test_usb_serial_jtag_resets_are_not_faults_and_not_a_loop() -> None:
    one = (
        "ESP-ROM:esp32s3-20210327\nBuild:Mar 27 2021\n"
        "rst:0x15 (USB_UART_CHIP_RESET),boot:0x8 (SPI_FAST_FLASH_BOOT)\n"
        "I (27) boot: ESP-IDF v5.1.2 2nd stage bootloader\nI (300) main_task: Started on CPU0\n"
    )
    assert classify((one * 4).encode()) == []  # four host resets: not a boot loop
    assert classify(_load("boot_esp32s3_usb_serial_jtag_reset_midline.txt")) == []


def test_interrupt_watchdog_is_its_own_kind_even_damaged() -> None:
    (f,) = classify(_load("iwdt_esp32_cpu0.txt"))
    assert f.kind == "interrupt_watchdog" and f.details["cpu"] == "0" and f.details["arch"] == "xtensa"
    damaged = (
        b"uru Meditation Error: Core panic'ed (Interrupt wdt timeout on CPU)\nPC      0x40025a12  PS 0\n"
    )
    (g,) = classify(damaged)
    assert g.kind == "interrupt_watchdog" and g.details.get("cpu") is None
    assert g.details["pc"] == "0x40025a12"  # the colon was lost too


def test_stack_overflow_with_lost_leading_characters_and_corrupted_backtrace() -> None:
    raw = (
        b"RROR*** A stack overflow in task amp_task has been detected.\n\n\n"
        b"Backtrace: 0x4008d1b4:0x3ffcc2a0 0x4008d17d:0x3ffcc2c0 0x4008d47e:0xffffffff |<-CORRUPTED\n"
    )
    (f,) = classify(raw)
    assert f.kind == "stack_overflow" and f.details["task"] == "amp_task"
    assert f.details["backtrace_corrupted"] is True and len(f.details["backtrace"]) == 3


def test_panic_headline_lost_register_dump_and_backtrace_are_evidence() -> None:
    raw = (
        b"\xf8\x80\x8e\xfe garbage where the headline was\n\nCore  0 register dump:\n"
        b"PC      : 0x400d1c4a  PS      : 0x00060630  A0      : 0x800d1d31  A1      : 0x3ffc5310\n"
        b"A14     : 0x00060a20  A15     : 0x00000001  SAR     : 0x0000001d  EXCCAUSE: 0x0000001c\n"
        b"EXCVADDR: 0x00000010  LBEG    : 0x400861b8  LEND    : 0x400861ce  LCOUNT  : 0xffffffff\n\n"
        b"Backtrace: 0x400d1c47:0x3ffc5310 0x400d1d2e:0x3ffc5330\n\nRebooting...\n"
    )
    (f,) = classify(raw)
    assert f.kind == "panic" and f.details["headline_lost"] is True
    assert f.details["pc"] == "0x400d1c4a" and len(f.details["backtrace"]) == 2
    assert exit_code_for([f]) == ExitCode.FIRMWARE_FAULT


def test_tflm_arena_numbers_become_arena_advice() -> None:
    (f,) = classify(_load("tflm_arena_resize_buffer_plain.txt"))
    assert f.kind == "arena_too_small"
    assert (f.details["requested"], f.details["available"], f.details["missing"]) == (31872, 27408, 4464)
    assert f.details["more_kb"] == 5 and "--arena-kb" in (f.hint or "")
    (g,) = classify(_load("tflm_arena_too_small.txt"))  # "Needed N but only M" form
    assert g.details["missing"] == 148736 - 131072


def test_tflm_missing_op_names_the_op_and_the_resolver_call() -> None:
    (f,) = classify(_load("tflm_missing_op_shape_esp32.txt"))
    assert f.kind == "missing_op" and f.details["op"] == "SHAPE" and f.details["version"] == "1"
    assert f.details["resolver_method"] == "AddShape" and "AddShape" in (f.hint or "")
    (g,) = classify(
        b"Didn't find op for builtin opcode 'NOT_A_TFLM_OP' version '1'\nAllocateTensors() failed"
    )
    assert g.details["resolver_method"] is None and "no kernel" in (g.hint or "")
    (h,) = classify(b"AllocateTensors() failed\n")
    assert h.kind == "tflm_error"


def test_idf_mem_alloc_fail_is_an_allocation_failure_without_an_abort_line() -> None:
    raw = b"Mem alloc fail. size 0x00000400 caps 0x00000404\n\nBacktrace: 0x400829b2:0x3ffca3a0\n"
    (f,) = classify(raw)
    assert f.kind == "alloc_failure" and f.details["size"] == 1024 and f.details["caps"] == 0x404
    assert "8BIT" in f.message and "SPIRAM" in f.message
    (g,) = classify(b"E (1301) camera: Failed to allocate frame buffer\n")
    assert g.kind == "alloc_failure" and g.details["source"] == "text"
    assert classify(b"I (478) heap_init: Initializing. RAM available for dynamic allocation:\n") == []


def test_boot_loop_is_unknown_without_evidence_and_infrastructure() -> None:
    findings = classify(_load("boot_loop_esp32_rtcwdt_no_message.txt"))
    assert _kinds(findings) == ["unknown"]
    assert findings[0].details["host_resets"] == 1  # the power-on that started it does not count
    assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE
    # the console stopped the run as a boot loop: the verdict still rests on the text
    assert _kinds(classify(b"I (31) boot: ESP-IDF v5.5.3 2nd stage bootloader\n", ended_by="boot_loop")) == [
        "unknown"
    ]


def test_kind_table_severities_match_the_findings() -> None:
    assert KINDS["download_mode"] == Severity.INFRASTRUCTURE
    assert KINDS["interrupt_watchdog"] == Severity.FIRMWARE_FAULT
    assert KINDS["unknown"] == Severity.INFRASTRUCTURE
    names = [d.name for d in DETECTORS]
    assert len(names) == len(set(names))
    assert {k for d in DETECTORS for k in d.kinds} <= set(KINDS)


def test_docs_list_every_kind_with_its_exit_code() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "device.md").read_text(encoding="utf-8")
    exits = {
        Severity.FIRMWARE_FAULT: "4",
        Severity.INFRASTRUCTURE: "3",
        Severity.USAGE: "2",
        Severity.WARNING: "-",
    }
    for info in KIND_TABLE:
        row = next((ln for ln in doc.splitlines() if ln.startswith(f"| `{info.kind}` |")), None)
        assert row is not None, f"docs/device.md has no row for {info.kind}"
        assert row.split("|")[2].strip().startswith(exits[info.severity]), row
