"""Classifying what a native program printed: sanitizer reports and the native board's exit line.

The report texts below are written here in the shape GCC's AddressSanitizer and UBSan print them
(headline, access, frames, SUMMARY, shadow map); the end-to-end tests (test_native_flow.py) check the
same detectors on reports the real sanitizers printed. Both parsers are fuzzed.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.classify import classify, exit_code_for
from harness.analysis.sweep_findings import sanitizer_report
from harness.errors import ExitCode

ASAN = """@EC1 6 INPUT i=0 bytes=192 sha256=ab *00000000
=================================================================
==4242==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000013 at pc 0x55 bp 0x7f sp 0x7e
WRITE of size 1 at 0x602000000013 thread T0
    #0 0x55d1c0 in esp_nn_depthwise_conv_s8_opt /cache/sources/esp-nn/src/convolution/dw_opt.c:211
    #1 0x55d2c0 in Eval /cache/src/tflm/kernels/esp_nn/depthwise_conv.cc:90
    #2 0x55d3c0 in app_main /out/projects/optimized/main/app_main.cc:250

0x602000000013 is located 0 bytes to the right of 3-byte region [0x602000000010,0x602000000013)
allocated by thread T0 here:
    #0 0x7f00 in malloc
SUMMARY: AddressSanitizer: heap-buffer-overflow /cache/sources/esp-nn/src/convolution/dw_opt.c:211 in x
Shadow bytes around the buggy address:
  0x0c047fff7fb0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
==4242==ABORTING
esp-check native: the program exited with status 1
"""

UBSAN = """I (0) esp-check-native: host program
/c/esp-nn/src/softmax/softmax_opt.c:88:21: runtime error: shift exponent 32 is too large for 32-bit type 'int'
    #0 0x4011 in esp_nn_softmax_s8_opt /cache/sources/esp-nn/src/softmax/softmax_opt.c:88
    #1 0x4022 in Eval softmax.cc:120
SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior /c/esp-nn/softmax_opt.c:88:21 in
esp-check native: the program exited with status 1
"""


def test_asan_report_is_one_firmware_fault_with_its_facts() -> None:
    findings = classify(ASAN, ended_by="disconnect")
    assert [f.kind for f in findings] == ["sanitizer"]  # the exit line and the disconnect are explained by it
    f = findings[0]
    assert f.exit_code == ExitCode.FIRMWARE_FAULT
    assert (
        f.message == "AddressSanitizer: heap-buffer-overflow in esp_nn_depthwise_conv_s8_opt (dw_opt.c:211)"
    )
    assert f.details["access"] == "WRITE of size 1"
    assert (
        f.details["frames"][1].startswith("Eval ") and len(f.details["frames"]) == 4
    )  # incl. "allocated by"
    assert f.details["summary"].startswith("SUMMARY: AddressSanitizer: heap-buffer-overflow")
    assert f.evidence[0].startswith("==4242==ERROR: AddressSanitizer") and f.evidence[-1].startswith(
        "SUMMARY"
    )


def test_ubsan_report() -> None:
    (f,) = classify(UBSAN, ended_by="disconnect")
    assert f.kind == "sanitizer" and f.details["sanitizer"] == "UndefinedBehaviorSanitizer"
    assert f.details["error"] == "shift exponent 32 is too large for 32-bit type 'int'"
    assert f.details["location"].endswith("softmax_opt.c:88")
    assert "esp_nn_softmax_s8_opt (softmax_opt.c:88)" in f.message


UBSAN_SEGV = """UndefinedBehaviorSanitizer:DEADLYSIGNAL
==1234==ERROR: UndefinedBehaviorSanitizer: SEGV on unknown address 0x000000000000 (pc 0x55f0 bp 0x7ffd T0)
==1234==The signal is caused by a READ memory access.
==1234==Hint: address points to the zero page.
    #0 0x55f0 in esp_nn_add_elementwise_s8_opt /cache/sources/esp-nn/src/add/add_opt.c:40:12
    #1 0x5600 in main /out/driver.c:99:5

UndefinedBehaviorSanitizer can not provide additional info.
SUMMARY: UndefinedBehaviorSanitizer: SEGV /cache/sources/esp-nn/src/add/add_opt.c:40:12 in esp_nn_add
==1234==ABORTING
"""


def test_the_classifier_and_the_sweep_read_a_report_alike() -> None:
    """One parser (harness.analysis.sanitizer) under both: the same error, top frame and summary."""
    for text in (ASAN, UBSAN, UBSAN_SEGV):
        (f,) = (f for f in classify(text) if f.kind == "sanitizer")
        rep = sanitizer_report(text)
        assert rep is not None
        assert rep["type"].startswith(f.details["error"].replace("32", "N"))
        assert rep["frames"][0] == f.details["frames"][0].split()[0]
        assert rep["summary"] == f.details["summary"]
    assert f.message == "UndefinedBehaviorSanitizer: SEGV in esp_nn_add_elementwise_s8_opt (add_opt.c:40:12)"
    assert rep["at"][0] == "esp_nn_add_elementwise_s8_opt add_opt.c:40"


def test_exit_line_alone_is_the_finding_and_a_clean_capture_has_none() -> None:
    (f,) = classify(
        "hello\r\nesp-check native: the program was killed by signal 11 (SIGSEGV)\r\n", ended_by="disconnect"
    )
    assert f.kind == "native_exit" and f.details == {"signal": 11, "signal_name": "SIGSEGV"}
    assert f.hint and "--sanitize" in f.hint
    assert [x.kind for x in classify("bye\n", ended_by="disconnect")] == ["disconnect"]
    assert classify("runtime errors happen: no colon-path here\n") == []


def test_two_reports_are_two_findings() -> None:
    text = UBSAN.replace("esp-check native: the program exited with status 1\n", "") + ASAN
    kinds = [f.kind for f in classify(text)]
    assert kinds == ["sanitizer", "sanitizer"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=600))
def test_detectors_never_crash_on_arbitrary_text(text: str) -> None:
    findings = classify(text, ended_by="disconnect")
    assert exit_code_for(findings) in (None, *ExitCode)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(min_value=0, max_value=10**9), cuts=st.integers(min_value=1, max_value=8))
def test_damaged_reports_still_classify_without_crashing(seed: int, cuts: int) -> None:
    rng = random.Random(seed)
    chars = list(rng.choice([ASAN, UBSAN]))
    for _ in range(cuts):  # drop, duplicate or replace characters anywhere
        i = rng.randrange(len(chars))
        op = rng.randrange(3)
        if op == 0:
            del chars[i]
        elif op == 1:
            chars.insert(i, chars[i])
        else:
            chars[i] = rng.choice(":#=()\n x0")
    findings = classify("".join(chars), ended_by="disconnect")
    assert all(f.severity for f in findings)
    assert all(len(e) <= 300 for f in findings for e in f.evidence)
