"""The classifier's device messages as data (harness/data/device_messages.toml), for
real-world text the classifier used to miss: TFLM's own messages, the ROM's boot modes (SPI download
boot, a boot-mode name lost), boot loops whose banners lost their first letters, the pre-2017 panic
wording.

The fixtures are ours, written in the shape of the messages (TFLM's format strings with values filled
in, the ROM's reset line). Nothing is faked.
"""

from __future__ import annotations

import re

import pytest

from harness.analysis import classify as cl
from harness.analysis.classify import KINDS, classify, exit_code_for
from harness.errors import ExitCode
from harness.resources import data_dir, parse_toml

DATA = parse_toml((data_dir() / "device_messages.toml").read_text(encoding="utf-8"))
RULES = DATA["tflm"]


def test_the_anchors_are_short_squeezed_key_words_of_known_kinds() -> None:
    families = set()
    for rule in RULES:
        assert rule["kind"] in KINDS and rule["kind"] in ("missing_op", "arena_too_small", "tflm_error")
        families.add(rule["family"])
        for anchor in rule.get("anchors", ()):
            assert re.fullmatch(r"[a-z0-9]{8,40}", anchor), anchor
        for pat in (*rule.get("patterns", ()), *rule.get("raw", ())):
            re.compile(pat)
    assert {"hybrid_model", "unsupported_type", "invoke", "check_failed"} <= families
    assert set(families) - {"resolver", "arena"} <= set(cl._FAMILY_TEXT)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r["family"])
def test_each_message_family_alone_is_a_firmware_fault_of_its_kind(rule: dict) -> None:  # type: ignore[type-arg]
    text = f"I (812) esp-check: model loaded\n{rule['example']}\nI (815) esp-check: done\n"
    findings = classify(text.encode())
    assert [f.kind for f in findings] == [rule["kind"]], findings
    assert exit_code_for(findings) == ExitCode.FIRMWARE_FAULT
    if rule["kind"] == "tflm_error":
        assert findings[0].details["family"] == rule["family"]
    # the same line with its first character lost and a monitor prefix is still found
    damaged = classify(f"[12:00:01.123] {rule['example'][1:]}\n".encode())
    assert [f.kind for f in damaged] == [rule["kind"]]


@pytest.mark.parametrize(
    ("lines", "family"),
    [
        (["Type INT16 (7) not supported.", "Node ADD (number 3) failed to invoke with status 1"],
         "unsupported_type"),
        (["Input type: INT16 with filter type: INT4 not supported.",
          "Node FULLY_CONNECTED (number 9) failed to prepare with status 1"], "unsupported_type"),
        (["Hybrid models are not supported on TFLite Micro.",
          "Node CONV_2D (number 0) failed to prepare with status 1", "AllocateTensors() failed"],
         "hybrid_model"),
        (["Node SOFTMAX (number 30) failed to invoke with status 1"], "invoke"),
        (["conv.cc:88 input->type != kTfLiteInt8 (INT16 != INT8)",
          "Node CONV_2D (number 2) failed to prepare with status 1"], "check_failed"),
    ],
)  # fmt: skip
def test_tflm_bursts_name_their_most_specific_family(lines: list[str], family: str) -> None:
    findings = classify(("ESP-ROM:esp32s3-20210327\n" + "\n".join(lines) + "\n").encode())
    tflm = [f for f in findings if f.kind == "tflm_error"]
    assert len(tflm) == 1 and tflm[0].details["family"] == family
    assert exit_code_for(findings) == ExitCode.FIRMWARE_FAULT


def test_an_application_sentence_with_not_supported_is_not_tflm() -> None:
    text = b"W (512) wifi: feature not supported on this chip\nI (600) app: board type is not supported yet\n"
    assert classify(text) == []


def test_spi_download_boot_is_download_mode_with_its_own_hint() -> None:
    text = (
        b"ESP-ROM:esp32c3-api1-20210207\nBuild:Feb  7 2021\nrst:0x1 (POWERON),boot:0x1 (SPI_DOWNLOAD_BOOT)\n"
    )
    text += b"wait spi download\n"
    [f] = classify(text)
    assert f.kind == "download_mode" and f.details["spi_download"] and f.details["chip"] == "esp32c3"
    assert "SPI download boot" in (f.hint or "") and exit_code_for([f]) == ExitCode.INFRASTRUCTURE


@pytest.mark.parametrize(
    ("chip", "value", "flash"),
    [  # values the ROM prints in public boot logs (tests/data/transcripts) and esptool's boot-mode docs
        ("esp32", 0x13, True), ("esp32", 0x33, True), ("esp32", 0x29, True), ("esp32", 0x03, False),
        ("esp32", 0x23, False), ("esp32", 0x01, False), ("esp32c3", 0x0C, True), ("esp32c3", 0x04, False),
        ("esp32c3", 0x01, False), ("esp32s3", 0x08, True), ("esp32s3", 0x29, True),
        ("esp32s3", 0x22, False), ("esp32c6", 0x04, False), ("esp32c6", 0x0C, True),
    ],
)  # fmt: skip
def test_boot_mode_values_follow_each_chips_strapping_rules(chip: str, value: int, flash: bool) -> None:
    assert cl._flash_boot(chip, value) is flash


def test_a_boot_mode_whose_name_was_lost_is_judged_by_its_value() -> None:
    rom = "ESP-ROM:esp32c3-api1-20210207\nBuild:Feb  7 2021\n"
    lost = classify(f"{rom}rst:0x1 (POWERON),boot:0x4 (\x8f\x13\x02\n".encode("latin-1"))
    assert [f.kind for f in lost] == ["download_mode"]
    assert classify(f"{rom}rst:0x1 (POWERON),boot:0xc (\x8f\x13\x02\n".encode("latin-1")) == []


def test_a_boot_loop_whose_banners_lost_their_first_letters_counts_every_boot() -> None:
    crash = "Guru Meditation Error: Core  0 panic'ed (IllegalInstruction). Exception was unhandled.\n"
    boots = [
        "ets Jul 29 2019 12:21:46\nrst:0xc (SW_CPU_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)\n",
        "Rebooting...\n\x00\xffts Jul 29 2019 12:21:46\n"
        "t:0xc (SW_CPU_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)\n",
        "Rebooting...s Jul 29 2019 12:21:46\n:0xc (SW_CPU_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)\n",
        "Rebooting...ets Jul 29 2019 12:21:46\n0xc (SW_CPU_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)\n",
    ]
    text = "".join(b + crash for b in boots)
    loop = [f for f in classify(text.encode("latin-1")) if f.kind == "boot_loop"]
    assert len(loop) == 1 and loop[0].details["boots"] == 4 and loop[0].details["cause"] == "panic"


def test_the_pre_2017_panic_wording_gives_its_reason() -> None:
    text = (
        "Guru Meditation Error of type LoadProhibited occurred on core  0. Exception was unhandled.\n"
        "Register dump:\nPC      : 0x400d0f3c  PS      : 0x00060030  A0      : 0x800d0b2c\n"
        "EXCVADDR: 0x00000000\n"
    )
    [f] = classify(text.encode())
    assert f.kind == "panic" and f.details["reason"] == "LoadProhibited" and f.details["core"] == "0"


@pytest.mark.parametrize(
    "line",
    [
        "E (61) esp_image: Image hash failed - image is corrupt",
        "E (58) esp_image: Segment 1 load address 0x3fc8a0d0, doesn't match data 0x3fc8a0d4",
        "E (40) boot_comm: chip revision check failed. Required >= v0.3, found v0.1.",
        "E (45) flash_parts: partition 3 invalid magic number 0x1234",
        "E (38) boot: failed to load bootloader image header!",
    ],
)
def test_bootloader_errors_are_boot_failures(line: str) -> None:
    rule = DATA["bootloader"][0]
    assert all(re.fullmatch(r"[a-z0-9]{8,40}", a) for a in rule["anchors"])
    findings = classify(f"I (30) boot: ESP-IDF v5.5.3 2nd stage bootloader\n{line}\n".encode())
    assert [f.kind for f in findings] == ["boot_failure"]
    assert exit_code_for(findings) == ExitCode.INFRASTRUCTURE


def test_banner_counting_stays_tied_to_the_roms_date_line() -> None:
    counter = cl.BootCounter()
    for line in ("I (123) app: inputs are 10 1000 bytes", "W (9) app: steps Jul 2019", "xs Jul 29 2019"):
        counter.feed(line)
    assert counter.count == 0
    for line in ("ets Jul 29 2019 12:21:46", "ts Jun  8 2016 00:22:57", "SP-ROM:esp32c3-api1-20210207"):
        counter.feed(line)
    assert counter.counts["rom_banner"] == 3
