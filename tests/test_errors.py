from harness.cli import main
from harness.errors import (
    CaptureError,
    ExitCode,
    InputDataError,
    Verdict,
    combine_exit_codes,
    exit_code_for,
)


def test_precedence_usage_then_fault_then_mismatch_then_infra() -> None:
    E = ExitCode
    assert combine_exit_codes([E.MATCH, E.INFRASTRUCTURE, E.MISMATCH]) == E.MISMATCH
    assert combine_exit_codes([E.MISMATCH, E.FIRMWARE_FAULT]) == E.FIRMWARE_FAULT
    assert combine_exit_codes([E.FIRMWARE_FAULT, E.USAGE, E.INFRASTRUCTURE]) == E.USAGE
    assert combine_exit_codes([E.MATCH, E.INFRASTRUCTURE]) == E.INFRASTRUCTURE
    assert combine_exit_codes([E.MATCH, E.MATCH]) == E.MATCH


def test_exception_exit_codes_and_hint() -> None:
    assert exit_code_for(InputDataError("x")) == ExitCode.USAGE
    assert exit_code_for(CaptureError("x")) == ExitCode.INFRASTRUCTURE
    assert exit_code_for(ValueError("x")) == ExitCode.INTERNAL
    assert "Hint: do y" in str(InputDataError("x failed", hint="do y"))


def test_firmware_faults_are_verdicts_with_exit_4() -> None:
    """No exception stands for a firmware fault: it is a finding, reported as a verdict (a crash, or a
    dataset input the device reported an error for), and exits 4."""
    assert Verdict.FIRMWARE_FAULT.exit_code == Verdict.DEVICE_ERROR.exit_code == ExitCode.FIRMWARE_FAULT == 4
    assert Verdict.from_exit_code(4) == Verdict.FIRMWARE_FAULT


def test_main_unknown_command_is_usage_error() -> None:
    assert main(["no-such-command"]) == ExitCode.USAGE


def test_main_version_exits_zero() -> None:
    assert main(["--version"]) == 0
